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
from kvscope.pd.summary import INSTANCE_FIGURES
from kvscope.telemetry.frames import requests_frame
from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.telemetry.run_summary import summary as run_summary

Subscriber = Callable[[StepRecord | RequestEvent], None]


def _instance_summary(snap: Snapshot) -> dict[str, Any]:
    records, events, meta, _ = snap
    s = run_summary(records, events, meta, requests_frame(records, events, meta["t0_ns"]))
    return {k: None if isinstance(s[k], float) and math.isnan(s[k]) else s[k]  # JSON: no NaN
            for k in INSTANCE_FIGURES}


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
        # keep=True (instances in their own processes, which can die): each decode instance's records and events
        # as its steps handed them back, and its recorder's baseline at ``clear``: a dead one's snapshot
        self.keep = False
        self.kept: dict[str, tuple[deque[StepRecord], deque[RequestEvent]]] = {}
        self.baselines: dict[str, dict[str, Any]] = {}

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self.subscribers.append(fn)

        def unsubscribe() -> None:
            if fn in self.subscribers:
                self.subscribers.remove(fn)

        return unsubscribe

    def publish(self, instance: str, items: list[StepRecord | RequestEvent]) -> None:
        """A decode instance's new records and events (with one decode instance: the run's own)."""
        decodes = [n for n, i in self.engine.instances.items() if i.role == KV_CONSUMER]
        if self.keep:
            steps, events = self.kept.setdefault(instance, (deque(maxlen=self.capacity),
                                                            deque(maxlen=self.capacity * 4)))
            for x in items:
                if isinstance(x, RequestEvent):
                    events.append(x)
                else:
                    steps.append(x)
        if instance != decodes[0]:
            items = [x for x in items if isinstance(x, RequestEvent)]
        for item in items:
            for fn in tuple(self.subscribers):
                fn(item)

    def clear(self) -> None:
        """A new run from the same engine: every instance forgets what it recorded, and so does the router."""
        for inst in self.engine.instances_at_rest():
            baseline = inst.call("clear")
            if isinstance(baseline, dict):
                self.baselines[inst.name] = baseline
        self.kept.clear()
        self.engine.transfers.clear()
        self.engine.done.clear()

    def _snapshots(self) -> dict[str, Snapshot]:
        """Each live instance's own snapshot; a decode instance that is gone: what its steps handed back before
        it went (``keep``), so its finished requests keep their true outputs."""
        out = {}
        for inst in self.engine.instances_at_rest():
            try:
                snap = inst.call("snapshot")
            except (InstanceDied, InstanceError):
                continue
            if snap is not None:
                out[inst.name] = snap
        for name, inst in self.engine.instances.items():
            if name not in out and inst.role == KV_CONSUMER and name in self.kept:
                steps, events = self.kept[name]
                meta = {**inst.info.get("meta", {}), **self.baselines.get(name, {}), "num_steps_dropped": 0}
                starts = [e.t_ns for e in list(events)[:1]] + [r.t_start_ns for r in list(steps)[:1]]
                meta["t0_ns"] = min(starts) if starts else min((r.arrival_ns for r in self.engine.done), default=0)
                out[name] = (list(steps), list(events), meta, [])
        return out

    def snapshot(self) -> Snapshot:
        """The run as ``Run.from_engine`` takes it. Steps: the first decode instance's (a prefill instance's only
        when no decode instance recorded any). Events: the decode instances' only, with the router's word on how
        each request ended (``_with_router_times``): a prefill instance's events end every request after its one
        token, which is not what the user got."""
        e = self.engine
        snaps = self._snapshots()
        if not snaps:
            raise ValueError("no instance of this P/D engine records anything (telemetry=False, or all are gone)")
        decodes = [n for n, i in e.instances.items() if i.role == KV_CONSUMER and n in snaps]
        main = next((n for n in decodes if snaps[n][0]), decodes[0] if decodes else next(iter(snaps)))
        records, _, meta, profiler = snaps[main]
        meta = dict(meta)
        # the events of the instances where requests finish: decode instances (or those that do both)
        finishing = [n for n, i in e.instances.items() if i.role != KV_PRODUCER and n in snaps]
        events = [ev for n in finishing for ev in snaps[n][1]]
        events = self._with_router_times(events)
        meta["pd"] = self.pd_meta(snaps, main)
        meta["t0_ns"] = min([meta["t0_ns"], *(ev.t_ns for ev in events[:1])])
        return records, events, meta, profiler

    def _with_router_times(self, events: list[RequestEvent]) -> list[RequestEvent]:
        """The decode side's events, each request's ``queued`` at its arrival at the router, and how it ended as
        the router saw it: a request the decode side did not finish (it ended at prefill, its transfer failed,
        its instance died or stopped answering) gets ``queued`` / ``first_token`` / ``finished`` from the
        router, its error naming the instance; the output tokens it had are kept (the most any event saw)."""
        e = self.engine
        reqs = {r.request_id: r for r in [*e.done, *e.requests.values()]}
        ended = {r.request_id: r for r in e.done if r.output is not None}
        seen: dict[str, int] = {}  # request id -> the most output tokens an event of it saw
        queued: set[str] = set()
        out = []
        for ev in events:
            req = reqs.get(ev.request_id)
            if ev.kind == "queued" and req is not None:
                ev = replace(ev, t_ns=req.arrival_ns)
                queued.add(ev.request_id)
            seen[ev.request_id] = max(seen.get(ev.request_id, 0), ev.num_output_tokens)
            done = ended.get(ev.request_id)
            if ev.kind == "finished" and done is not None and done.output is not None \
                    and ev.reason != done.output.finish_reason:
                continue  # the router's word stands (below)
            out.append(ev)
        finished = {ev.request_id for ev in out if ev.kind == "finished"}
        for req in e.done:
            if req.request_id in finished or req.output is None:
                continue
            n_out = max(len(req.output.token_ids), seen.get(req.request_id, 0))
            if req.request_id not in queued:
                out.append(RequestEvent(req.arrival_ns, 0, req.request_id, "queued", len(req.prompt_ids),
                                        prompt_token_ids=list(req.prompt_ids)))
            if req.request_id not in seen and req.first_token_ns is not None and n_out:
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
                     "num_output_tokens": len(r.output.token_ids) if r.output is not None else None,
                     "finish_reason": r.output.finish_reason if r.output is not None else None,
                     "error": r.output.error if r.output is not None else None,
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
