"""A P/D engine's run: what ``Run.from_engine`` reads (``PDRecorder.snapshot``).

Each instance records its own steps and request events in its own process. The snapshot takes the decode
instances' records and events (the steps that produce the user's tokens; with several decode instances
the first one's steps, every one's events), stamps each request's ``queued`` event with its arrival at the
router (so TTFT counts prefill, the transfer and the decode side's queue), adds ``queued`` + ``finished``
for requests that never reached a decode instance, and writes ``meta["pd"]``: the layout, the connector's
configuration, the instances (name, role, pid, pool, threads, their own TTFT / ITL), every transfer,
every request's route and times (the router's, plus each side's ``queued`` / ``scheduled`` from that
instance's own events: ``prefill_scheduled_ns``, ``decode_queued_ns``, ``decode_scheduled_ns``; the request
lanes of ``kvscope.telemetry.pd_lanes``) and ``page_maps``: each instance's page map around transfers, with
the blocks in flight (``kvscope.pd.page_maps``, bounded).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from kvscope.pd.config import KV_CONSUMER, KV_PRODUCER
from kvscope.pd.page_maps import transfer_page_maps
from kvscope.pd.process import InstanceDied, InstanceError
from kvscope.pd.protocols import RouterView, Snapshot
from kvscope.pd.summary import INSTANCE_KEYS
from kvscope.telemetry.frames import requests_frame
from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.telemetry.run_summary import summary as run_summary

Subscriber = Callable[[StepRecord | RequestEvent], None]


def _instance_summary(snap: Snapshot) -> dict[str, Any]:
    records, events, meta, _ = snap
    s = run_summary(records, events, meta, requests_frame(records, events, meta["t0_ns"]))
    keys = (*INSTANCE_KEYS, "steps", "computed_prefill_tokens", "output_tokens")
    return {k: None if isinstance(s[k], float) and math.isnan(s[k]) else s[k] for k in keys}  # JSON: no NaN


class PDRecorder:
    """``snapshot()`` as ``Recorder.snapshot`` gives it: (records, events, meta, profiler events); ``subscribe``
    gets the decode instances' records and events as their steps hand them back (a live run's dashboard)."""

    capacity = 100_000  # each instance's Recorder's ring

    def __init__(self, engine: RouterView) -> None:
        self.engine = engine
        self.events: deque[RequestEvent] = deque(maxlen=self.capacity * 4)  # LiveRun reads the bound of its events
        self.subscribers: list[Subscriber] = []
        self.baseline = {"prefix_cache_queries_before": 0, "prefix_cache_hits_before": 0,
                         "window_freed_blocks_before": 0}

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self.subscribers.append(fn)

        def unsubscribe() -> None:
            if fn in self.subscribers:
                self.subscribers.remove(fn)

        return unsubscribe

    def publish(self, instance: str, items: list[StepRecord | RequestEvent]) -> None:
        """A decode instance's new records and events (with one decode instance: the run's own)."""
        decodes = [n for n, i in self.engine.instances.items() if i.role == KV_CONSUMER]
        if instance != decodes[0]:
            items = [x for x in items if isinstance(x, RequestEvent)]
        for item in items:
            for fn in tuple(self.subscribers):
                fn(item)

    def clear(self) -> None:
        """A new run from the same engine: every instance forgets what it recorded, and so does the router."""
        for inst in self.engine.instances_at_rest():
            inst.call("clear")
        self.engine.transfers.clear()
        self.engine.done.clear()

    def _snapshots(self) -> dict[str, Snapshot]:
        out = {}
        for inst in self.engine.instances_at_rest():
            try:
                snap = inst.call("snapshot")
            except (InstanceDied, InstanceError):
                continue
            if snap is not None:
                out[inst.name] = snap
        return out

    def snapshot(self) -> Snapshot:
        e = self.engine
        snaps = self._snapshots()
        if not snaps:
            raise ValueError("no instance of this P/D engine records anything (telemetry=False, or all are gone)")
        decodes = [n for n, i in e.instances.items() if i.role == KV_CONSUMER and n in snaps]
        main = decodes[0] if decodes else next(iter(snaps))
        records, _, meta, profiler = snaps[main]
        events = [ev for n in (decodes or [main]) for ev in snaps[n][1]]
        events = self._with_router_times(events)
        meta["pd"] = self.pd_meta(snaps, main)
        meta["t0_ns"] = min([meta["t0_ns"], *(ev.t_ns for ev in events[:1])])
        return records, events, meta, profiler

    def _with_router_times(self, events: list[RequestEvent]) -> list[RequestEvent]:
        e = self.engine
        reqs = {r.request_id: r for r in [*e.done, *e.requests.values()]}
        seen, out = set(), []
        for ev in events:
            req = reqs.get(ev.request_id)
            if ev.kind == "queued" and req is not None:
                ev = replace(ev, t_ns=req.arrival_ns)
            seen.add(ev.request_id)
            out.append(ev)
        for req in e.done:  # ended before any decode instance recorded it: at prefill, or failed
            if req.request_id in seen or req.output is None:
                continue
            n_out = len(req.output.token_ids)
            out.append(RequestEvent(req.arrival_ns, 0, req.request_id, "queued", len(req.prompt_ids),
                                    prompt_token_ids=list(req.prompt_ids)))
            if req.first_token_ns is not None and n_out:
                out.append(RequestEvent(req.first_token_ns, 0, req.request_id, "first_token",
                                        len(req.prompt_ids), 1))
            out.append(RequestEvent(req.finished_ns or req.arrival_ns, 0, req.request_id, "finished",
                                    len(req.prompt_ids), n_out, req.output.finish_reason, req.output.error))
        out.sort(key=lambda ev: ev.t_ns)
        return out

    def pd_meta(self, snaps: dict[str, Snapshot], main: str) -> dict[str, Any]:
        e = self.engine
        instances = []
        for name, inst in e.instances.items():
            item = {**inst.info, "name": name, "role": inst.role, "alive": inst.alive}
            if not inst.alive:
                item["dead"] = inst.dead
            if name in snaps:
                item["summary"] = _instance_summary(snaps[name])
            instances.append(item)
        sides = self._side_times(snaps)
        requests = [{"request_id": r.request_id, "prefill": r.prefill, "decode": r.decode,
                     "arrival_ns": r.arrival_ns, "first_token_ns": r.first_token_ns, "finished_ns": r.finished_ns,
                     **sides.get(r.request_id, {}), **r.timeline} for r in [*e.done, *e.requests.values()]]
        transfers = [asdict(t) for t in e.transfers]
        roles = {name: inst.role for name, inst in e.instances.items()}
        return {"layout": str(e.layout), "kv_transfer_config": e.kv_transfer_config.to_json(),
                "records_from": main, "instances": instances, "transfers": transfers, "requests": requests,
                "page_maps": transfer_page_maps(snaps, transfers, roles)}

    def _side_times(self, snaps: dict[str, Snapshot]) -> dict[str, dict[str, int]]:
        """Per request: when each side queued and first scheduled it, from that instance's own events (the
        run's events carry the router's arrival as ``queued``)."""
        out: dict[str, dict[str, int]] = {}
        for name, (_, events, _, _) in snaps.items():
            inst = self.engine.instances.get(name)
            side = "prefill" if inst is not None and inst.role == KV_PRODUCER else "decode"
            for ev in events:
                if ev.kind in ("queued", "scheduled"):
                    out.setdefault(ev.request_id, {}).setdefault(f"{side}_{ev.kind}_ns", ev.t_ns)
        return out
