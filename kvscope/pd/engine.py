"""``PDEngine``: prefill/decode disaggregation over instances that each run an ``Engine`` in their own process.

The router sends each request to a prefill instance (``kv_producer``) with ``max_tokens=1``. When that
instance has computed the prompt's KV (and its first token), the router asks a decode instance
(``kv_consumer``) how many of the prompt's full blocks it already holds (by block hash), has the producer
send only the rest through the connector (``kvscope.pd.connector``), and the consumer caches them under their
hashes and continues the request: its prefix-cache lookup finds them, it recomputes the last partial block
and decodes. A request whose first token ends it (EOS, a stop token, ``max_tokens=1``) ends on the prefill
side (``kvscope.pd.router``).

``Engine``'s request API is the router's (``kvscope.pd.router.Router``), so ``Run.from_engine`` and
``LiveRun`` (``kvscope run --pd``) drive it as they drive an engine. What is this engine's own: starting and
ending the processes, and ``step``, which never waits on one instance for another (each computes its step in
its process while the router waits for the first answer), with the hand-over (``_hand_over``: lookup, export,
import) and an instance that died (``_lost``).
"""

from __future__ import annotations

import secrets
import time
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

import torch

from kvscope.engine.config import EngineConfig
from kvscope.engine.request import Request, RequestOutput, SamplingParams
from kvscope.pd.config import KV_CONSUMER, KV_PRODUCER, KVTransferConfig, PDLayout
from kvscope.pd.connector import SECRET_BYTES, TransferHandle, discard
from kvscope.pd.process import InstanceDied, InstanceError, InstanceProcess
from kvscope.pd.router import Router
from kvscope.pd.routes import PDRequest, TransferRecord
from kvscope.utils.clock import WALL_CLOCK

__all__ = ["PDEngine", "TransferRecord"]


@dataclass(frozen=True, slots=True)
class PDModel:
    """What callers read of ``engine.spec`` (the synthetic workload: the vocabulary)."""

    vocab_size: int
    max_model_len: int


class PDEngine(Router[InstanceProcess, KVTransferConfig]):
    """``PDEngine("tiny", pd="1P1D")`` (also ``kvscope.PDEngine``); a context manager (``close``).

    Keyword arguments are ``EngineConfig`` fields, given to every instance; ``kv_transfer_config`` is vLLM's
    (``kvscope.pd.config.KVTransferConfig`` or a dict of it); ``num_threads``: the cores to split between the
    instances (default: this process's torch threads)."""

    def __init__(self, model: str = "tiny", tokenizer: None = None, *, pd: str | PDLayout = "1P1D",
                 kv_transfer_config: KVTransferConfig | dict | None = None, num_threads: int | None = None,
                 config: EngineConfig | None = None, **engine_kwargs: Any) -> None:
        if not isinstance(model, str) or tokenizer is not None:
            raise TypeError("a disaggregated engine builds its model in each instance's process: give the "
                            f"model's name or folder (got {type(model).__name__}), and no tokenizer")
        layout = PDLayout.parse(pd)
        kv_config = KVTransferConfig.of(kv_transfer_config)
        crowded = layout.check_fits()  # before any process starts: refused, or a warning
        if crowded:
            warnings.warn(crowded, RuntimeWarning, stacklevel=2)
        kv_config.check_bindable(layout.num_decode)
        if config is not None:
            engine_kwargs = {**_config_kwargs(config), **engine_kwargs}
        checked = EngineConfig(**engine_kwargs)  # checked here, before any process starts
        if not checked.enable_prefix_caching:
            raise ValueError("P/D disaggregation hands blocks over by their hashes: keep enable_prefix_caching=True")
        per = max(1, (num_threads or torch.get_num_threads()) // (layout.num_prefill + layout.num_decode))
        instances: dict[str, InstanceProcess] = {}
        secret = secrets.token_bytes(SECRET_BYTES)  # the zmq transport's: only this engine's instances know it
        try:
            index = {KV_PRODUCER: 0, KV_CONSUMER: 0}
            for name, role in layout.names():
                kvc = kv_config.for_role(role, index[role])
                index[role] += 1
                instances[name] = InstanceProcess(name, model, engine_kwargs, kvc, per, secret)
            for inst in instances.values():
                inst.wait_ready()
        except BaseException:
            _close_all(instances.values())
            raise
        weakref.finalize(self, _close_all, list(instances.values()))  # processes end with the engine
        producer = next(iter(instances.values()))
        first = producer.info
        # the instances' own tokenizer (sent over their authenticated pipe): a run prepares its prompts with it as
        # it does for a colocated Engine (the chat template, special tokens; kvscope.runs.workload.items)
        tokenizer = producer.call("tokenizer")
        super().__init__(layout, kv_config, instances, clock=WALL_CLOCK, config=checked, model_name=model,
                         spec=PDModel(first["vocab_size"], first["max_model_len"]),
                         eos_token_ids=frozenset(first["eos_token_ids"]), max_model_len=first["max_model_len"],
                         tokenizer=tokenizer)
        self.inbox: dict[str, list[tuple[list[int], SamplingParams, str]]] = {}  # sent with the instance's next step
        self.recorder.keep = True  # an instance can die: the router keeps what its steps handed back

    def close(self) -> None:
        """End every instance's process (also at ``with`` exit)."""
        _close_all(self.instances.values())

    def __enter__(self) -> PDEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- requests ----------------------------------------------------------------------------------
    def _dispatch(self, inst: InstanceProcess, request: Request) -> None:
        """Queued for the prefill instance's next step (``step`` sends it along)."""
        self.inbox.setdefault(inst.name, []).append(
            (list(request.prompt_token_ids), request.sampling_params, request.request_id))

    def abort(self, request_id: str) -> bool:
        self.settle()
        for queued in self.inbox.values():
            queued[:] = [q for q in queued if q[2] != request_id]
        return super().abort(request_id)

    def instances_at_rest(self) -> list[InstanceProcess]:
        self.settle()
        return super().instances_at_rest()

    # ---- the router's round ------------------------------------------------------------------------
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
            for inst in pending:  # one that ended, or stopped answering (SIGSTOP, hung), fails its requests
                if inst.conn in ready or inst.unresponsive() is not None:
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

    def _lost(self, inst: InstanceProcess) -> list[RequestOutput]:
        """An instance died: every request it held fails, naming it."""
        outs = []
        for req in list(self.requests.values()):
            if (req.decode or req.prefill) == inst.name:
                outs.append(self._fail(req, inst.dead or f"{inst.name} is gone"))
        self.load[inst.name] = 0
        return outs

    # ---- the hand-over -----------------------------------------------------------------------------
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

    def _hand_over(self, req: PDRequest, dst: InstanceProcess | None) -> list[RequestOutput]:
        """Move the prompt's blocks that the decode instance ``dst`` lacks, and continue there. Returns
        the requests that failed doing so (this one; all those of an instance that died)."""
        src = self.instances[req.prefill]
        if dst is None:
            return [self._fail(req, "no live decode instance: " + self._gone(KV_CONSUMER))]
        handle: TransferHandle | None = None
        start = time.perf_counter_ns()
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
        sent: TransferHandle = exp["handle"]
        req.decode = dst.name
        self.load[dst.name] += 1
        self.transfers.append(TransferRecord(req.request_id, src.name, dst.name, sent.transport,
                                             imp["num_blocks"], held, sent.num_bytes, start, imp["received_ns"],
                                             src_block_ids=exp["block_ids"], dst_block_ids=imp["block_ids"]))
        req.timeline.update(transfer_start_ns=start, transfer_end_ns=imp["received_ns"])
        return []


def _close_all(instances: Iterable[InstanceProcess]) -> None:
    for inst in instances:
        inst.close()


def _config_kwargs(config: EngineConfig) -> dict[str, Any]:
    return {f: getattr(config, f) for f in EngineConfig.__dataclass_fields__ if f != "extra" or config.extra}
