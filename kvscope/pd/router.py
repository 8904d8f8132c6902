"""The router's steps (a mixin of ``PDEngine``): step every busy instance at once, hand the prompts that
finished prefill over to a decode instance (``_hand_over``: lookup, export, import), and fail the requests of
an instance that died (``_lost``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait

from kvscope.engine.request import Request, RequestOutput, RequestStatus
from kvscope.pd.config import KV_CONSUMER, KV_PRODUCER
from kvscope.pd.connector import discard
from kvscope.pd.process import InstanceDied, InstanceError, InstanceProcess


@dataclass(slots=True)
class TransferRecord:
    """One request's KV hand-over (times: ``perf_counter_ns``, which every process on a machine shares; a
    simulation's: its virtual clock)."""

    request_id: str
    src: str
    dst: str
    transport: str
    num_blocks: int  # blocks moved
    num_held_blocks: int  # full prompt blocks the consumer already held (not moved)
    num_bytes: int
    start_ns: int  # the producer starts packing
    end_ns: int  # the consumer has unpacked
    ok: bool = True
    error: str | None = None
    src_block_ids: list[int] | None = None  # the producer's blocks sent (the page maps mark them in flight)
    dst_block_ids: list[int] | None = None  # the consumer's blocks they landed in


@dataclass(slots=True)
class PDRequest:
    """A request as the router follows it; ``request`` mirrors it for callers (tokens and status at the end)."""

    request: Request
    arrival_ns: int
    prefill: str
    decode: str | None = None
    first_token_ns: int | None = None
    finished_ns: int | None = None
    output: RequestOutput | None = None
    timeline: dict[str, int] = field(default_factory=dict)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_token_ids


class Router:
    """``step`` and what it needs; ``PDEngine`` holds the state (``instances``, ``requests``, ``load``,
    ``handovers``, ``outbox``, ``transfers``, ``done``, ``kv_transfer_config``, ``recorder``, ``clock``).
    ``_pick``, ``_route``, ``_finish`` and ``_fail`` know nothing of processes: the simulated P/D engine
    (``kvscope.pd.sim_engine``) routes with them too."""

    def _pick(self, role: str) -> InstanceProcess | None:
        live = [i for i in self.instances.values() if i.role == role and i.alive]
        return min(live, key=lambda i: self.load[i.name]) if live else None

    def _gone(self, role: str) -> str:
        return "; ".join(i.dead or "" for i in self.instances.values() if i.role == role)

    def step(self) -> list[RequestOutput]:
        """One round of the router, which never holds one instance's step for another's: start a step on every
        idle instance that has work (each in its process, at once), wait for at least one to answer, take every
        answer that is in, then hand over the prompts that finished prefill whose producer and consumer are both
        idle. A producer with a hand-over waiting is not stepped again until it is done (at most one decode
        step later), so the decode side never waits for a prefill step. Returns the requests that finished."""
        waiting = {req.prefill for req in self.handovers}
        for inst in self.instances.values():
            if inst.alive and not inst.pending and self.load[inst.name] > 0 and inst.name not in waiting:
                try:
                    inst.send("step", self.inbox.pop(inst.name, []))
                except InstanceDied:
                    self.outbox += self._lost(inst)
        pending = [i for i in self.instances.values() if i.alive and i.pending]
        if pending:
            ready = set(wait([i.conn for i in pending], timeout=1.0))
            for inst in pending:
                if inst.conn in ready or inst.process.poll() is not None:
                    self._collect(inst)
        self._hand_over_ready()
        out, self.outbox = self.outbox, []
        return out

    def settle(self) -> None:
        """Take the answers of every step in flight (their finished requests go out with the next ``step``)."""
        for inst in self.instances.values():
            if inst.alive and inst.pending:
                self._collect(inst)

    def _collect(self, inst: InstanceProcess) -> None:
        try:
            res = inst.result()
        except InstanceDied:
            self.outbox += self._lost(inst)
            return
        if inst.role == KV_CONSUMER:
            self.recorder.publish(inst.name, res["items"])
        for rid, t in res["first_token_ns"].items():
            if rid in self.requests:
                self.requests[rid].timeline[f"{inst.role}_first_token_ns"] = t
        for out in res["finished"]:
            self._route(inst.name, inst.role, out, res["t_ns"])

    def _route(self, name: str, role: str, out: RequestOutput, t_ns: int) -> None:
        """A request that instance ``name`` finished at ``t_ns``: a prompt whose prefill ended at its one token
        (``length``) and that wants more goes to ``handovers``; any other request is done (``outbox``)."""
        req = self.requests.get(out.request_id)
        if req is None:
            return
        self.load[name] -= 1
        if role == KV_PRODUCER and out.finish_reason == "length" and req.request.sampling_params.max_tokens > 1:
            req.timeline["prefill_done_ns"] = t_ns
            self.handovers.append(req)
        else:
            self.outbox.append(self._finish(req, out, role))

    def _hand_over_ready(self) -> None:
        """The hand-overs whose producer and a consumer are idle now; the others wait for the next round."""
        later = []
        for req in self.handovers:
            if req.request_id not in self.requests:  # failed meanwhile (its producer died)
                continue
            src = self.instances[req.prefill]
            idle = [i for i in self.instances.values() if i.role == KV_CONSUMER and i.alive and not i.pending]
            if not src.pending and (idle or self._pick(KV_CONSUMER) is None):
                dst = min(idle, key=lambda i: self.load[i.name]) if idle else None
                self.outbox += self._hand_over(req, dst)
            else:
                later.append(req)
        self.handovers = later

    def _finish(self, req: PDRequest, out: RequestOutput, role: str | None = None) -> RequestOutput:
        req.first_token_ns = req.timeline.get(f"{role}_first_token_ns") if role else None
        req.output, req.finished_ns = replace(out, prompt=req.request.prompt), self.clock.now_ns()
        r = req.request
        r.output_token_ids = list(out.token_ids)
        r.all_token_ids = [*r.prompt_token_ids, *out.token_ids]
        r.status, r.error = RequestStatus(out.finish_reason), out.error
        r.num_cached_tokens = out.num_cached_tokens
        self.requests.pop(req.request_id, None)
        self.done.append(req)
        return req.output

    def _fail(self, req: PDRequest, error: str, reason: str = "error") -> RequestOutput:
        out = RequestOutput(req.request_id, req.request.prompt, list(req.prompt_ids), [], "", reason, error=error)
        return self._finish(req, out)

    def _lost(self, inst: InstanceProcess) -> list[RequestOutput]:
        """An instance died: every request it held fails, naming it."""
        outs = []
        for req in list(self.requests.values()):
            if (req.decode or req.prefill) == inst.name:
                outs.append(self._fail(req, inst.dead or f"{inst.name} is gone"))
        self.load[inst.name] = 0
        return outs

    def _hand_over(self, req: PDRequest, dst: InstanceProcess | None) -> list[RequestOutput]:
        """Move the prompt's blocks that the decode instance ``dst`` lacks, and continue there. Returns
        the requests that failed doing so (this one; all those of an instance that died)."""
        src = self.instances[req.prefill]
        if dst is None:
            return [self._fail(req, "no live decode instance: " + self._gone(KV_CONSUMER))]
        handle, start = None, time.perf_counter_ns()
        try:
            held = dst.call("lookup", req.prompt_ids)["held"]
            exp = src.call("export", req.prompt_ids, held, dst.info.get("address"))
            handle, start = exp["handle"], exp["start_ns"]
            imp = dst.call("import_add", req.request_id, req.prompt_ids, req.request.prompt,
                           req.request.sampling_params, held, exp["num_blocks"], handle)
        except (InstanceDied, InstanceError) as exc:
            if handle is not None:
                discard(handle)
            error = f"KV transfer {src.name} -> {dst.name} failed: {exc}"
            self.transfers.append(TransferRecord(req.request_id, src.name, dst.name,
                                                 self.kv_transfer_config.transport, 0, 0, 0, start,
                                                 time.perf_counter_ns(), False, error))
            failed = [self._fail(req, error)]
            for inst in (src, dst):
                if not inst.alive:
                    failed += self._lost(inst)
            return failed
        req.decode = dst.name
        self.load[dst.name] += 1
        self.transfers.append(TransferRecord(req.request_id, src.name, dst.name, handle.transport,
                                             imp["num_blocks"], held, handle.num_bytes, start, imp["received_ns"],
                                             src_block_ids=exp["block_ids"], dst_block_ids=imp["block_ids"]))
        req.timeline.update(transfer_start_ns=start, transfer_end_ns=imp["received_ns"])
        return []
