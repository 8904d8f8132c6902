"""``PDEngine``: prefill/decode disaggregation over instances that each run an ``Engine`` in their own process.

The router sends each request to a prefill instance (``kv_producer``) with ``max_tokens=1``. When that
instance has computed the prompt's KV (and its first token), the router asks a decode instance
(``kv_consumer``) how many of the prompt's full blocks it already holds (by block hash), has the producer
send only the rest through the connector (``kvscope.pd.connector``), and the consumer caches them under their
hashes and continues the request: its prefix-cache lookup finds them, it recomputes the last partial block
and decodes. A request whose first token ends it (EOS, a stop token, ``max_tokens=1``) ends on the prefill
side (``kvscope.pd.router``).

It has ``Engine``'s request API (``make_request``, ``add_request``, ``step``, ``abort``, ``generate``,
``recorder``), so ``Run.from_engine`` and ``LiveRun`` (``kvscope run --pd``) drive it as they drive an engine.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvscope.engine.config import EngineConfig
from kvscope.engine.request import (
    Request,
    RequestOutput,
    SamplingParams,
    checked_params,
    next_request_id,
    rejected_request,
)
from kvscope.engine.validation import is_one_prompt, prompt_ids
from kvscope.pd.config import KV_CONSUMER, KV_PRODUCER, KVTransferConfig, PDLayout
from kvscope.pd.process import InstanceProcess
from kvscope.pd.recorder import PDRecorder
from kvscope.pd.router import PDRequest, Router, TransferRecord
from kvscope.utils.clock import WALL_CLOCK

__all__ = ["PDEngine", "TransferRecord"]


@dataclass(frozen=True, slots=True)
class PDModel:
    """What callers read of ``engine.spec`` (the synthetic workload: the vocabulary)."""

    vocab_size: int
    max_model_len: int


class PDEngine(Router):
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
        self.layout = PDLayout.parse(pd)
        self.kv_transfer_config = KVTransferConfig.of(kv_transfer_config)
        if config is not None:
            engine_kwargs = {**_config_kwargs(config), **engine_kwargs}
        self.config = EngineConfig(**engine_kwargs)  # checked here, before any process starts
        if not self.config.enable_prefix_caching:
            raise ValueError("P/D disaggregation hands blocks over by their hashes: keep enable_prefix_caching=True")
        total = num_threads or torch.get_num_threads()
        per = max(1, total // (self.layout.num_prefill + self.layout.num_decode))
        self.model_name, self.clock, self.tokenizer = model, WALL_CLOCK, None
        self.instances: dict[str, InstanceProcess] = {}
        try:
            index = {KV_PRODUCER: 0, KV_CONSUMER: 0}
            for name, role in self.layout.names():
                kvc = self.kv_transfer_config.for_role(role, index[role])
                index[role] += 1
                self.instances[name] = InstanceProcess(name, model, engine_kwargs, kvc, per)
            for inst in self.instances.values():
                inst.wait_ready()
        except BaseException:
            self.close()
            raise
        weakref.finalize(self, _close_all, list(self.instances.values()))  # processes end with the engine
        first = next(iter(self.instances.values())).info
        self.spec = PDModel(first["vocab_size"], first["max_model_len"])
        self.eos_token_ids = frozenset(first["eos_token_ids"])
        self.max_model_len = first["max_model_len"]
        self.requests: dict[str, PDRequest] = {}  # unfinished, by id
        self.load: dict[str, int] = {name: 0 for name in self.instances}  # unfinished requests per instance
        self.transfers: list[TransferRecord] = []
        self.handovers: list[PDRequest] = []  # prefill done, waiting for idle producer + consumer
        self.outbox: list[RequestOutput] = []  # finished, returned by the next step()
        self.inbox: dict[str, list[tuple]] = {}  # prefill instance -> requests its next step adds first
        self.done: list[PDRequest] = []  # finished requests (their routes and times), in finishing order
        self.recorder = PDRecorder(self)

    # ---- instances ---------------------------------------------------------------------------------
    def instance_stats(self) -> dict[str, dict[str, int]]:
        """Each live instance's pool (``num_used_blocks``, ``num_pinned``, ...)."""
        self.settle()
        return {i.name: i.call("stats") for i in self.instances.values() if i.alive}

    def run_metadata(self) -> dict[str, Any]:
        """The decode side's metadata (the records a run shows are its), plus ``pd``: layout and instances."""
        decode = next((i for i in self.instances.values() if i.role == KV_CONSUMER), None)
        meta = dict((decode or next(iter(self.instances.values()))).info["meta"])
        meta["pd"] = {"layout": str(self.layout), "kv_transfer_config": self.kv_transfer_config.to_json(),
                      "instances": [{k: v for k, v in i.info.items() if k != "meta"} for i in self.instances.values()]}
        return meta

    def close(self) -> None:
        """End every instance's process (also at ``with`` exit)."""
        for inst in getattr(self, "instances", {}).values():
            inst.close()

    def __enter__(self) -> PDEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- requests (Engine's API) -------------------------------------------------------------------
    def _prefill_instance(self) -> InstanceProcess:
        inst = self._pick(KV_PRODUCER)
        if inst is None:
            raise RuntimeError("no live prefill instance: " + self._gone(KV_PRODUCER))
        return inst

    def make_request(self, prompt: Any, params: SamplingParams | None = None, request_id: str | None = None
                     ) -> Request:
        """A checked ``Request``; nothing is queued. Token ids are checked here (vocabulary, length); a text
        prompt is tokenized by a prefill instance (waiting for its step in flight, if any)."""
        params = checked_params(params)
        if isinstance(prompt, str):
            self.settle()
            ids, text = self._prefill_instance().call("tokenize", prompt, params)
        else:
            ids, text = prompt_ids(prompt, None, self.spec.vocab_size, self.max_model_len)
        request = Request(request_id or next_request_id(), list(ids), params, prompt=text,
                          arrival_time=time.perf_counter())
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use by an unfinished request")
        return request

    def add_request(self, prompt: Any, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Queue a request for the least loaded prefill instance (sent with its next step); returns its id."""
        request = prompt if isinstance(prompt, Request) else self.make_request(prompt, params, request_id)
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use by an unfinished request")
        inst = self._prefill_instance()
        self.requests[request.request_id] = PDRequest(request, time.perf_counter_ns(), inst.name)
        self.inbox.setdefault(inst.name, []).append(
            (list(request.prompt_token_ids), request.sampling_params, request.request_id))
        self.load[inst.name] += 1
        return request.request_id

    def abort(self, request_id: str) -> bool:
        req = self.requests.get(request_id)
        if req is None:
            return False
        self.settle()
        held = all(r is not req for r in self.handovers)  # one waiting for its hand-over gave its producer's load back (_route)
        self.handovers = [r for r in self.handovers if r is not req]
        for queued in self.inbox.values():
            queued[:] = [q for q in queued if q[2] != request_id]
        where = self.instances[req.decode or req.prefill]
        if where.alive and req.request_id in self.requests and held:
            where.call("abort", request_id)
            self.load[where.name] -= 1
        self._fail(req, "aborted", reason="abort")
        return True

    def reject(self, prompt: Any, params: Any, error: str) -> Request:
        return rejected_request(prompt, params, error)

    def record_state(self) -> None:
        """Each instance records its own state (an abort does): nothing to do here."""

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def output(self, request: Request) -> RequestOutput:
        return RequestOutput.of(request, self.decode(request.output_token_ids))

    def decode(self, token_ids: list[int]) -> str:
        self.settle()
        inst = next((i for i in self.instances.values() if i.alive), None)
        return inst.call("detokenize", list(token_ids)) if inst is not None and token_ids else ""

    def profile(self, *args: Any, **kwargs: Any):
        raise ValueError("profiling a P/D engine is not supported yet: profile an instance's Engine")

    # ---- whole calls -------------------------------------------------------------------------------
    def generate(self, prompts: Any | Sequence[Any], params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run prompts to completion; one ``RequestOutput`` per prompt, in order. All prompts are checked
        before any is queued (one bad prompt raises, naming it)."""
        if is_one_prompt(prompts):
            prompts = [prompts]
        params_list = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams")
        requests = []
        for i, (p, sp) in enumerate(zip(prompts, params_list)):
            try:
                requests.append(self.make_request(p, sp))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"prompt {i}: {exc}") from None
        ids = [self.add_request(r) for r in requests]
        outs: dict[str, RequestOutput] = {}
        while any(i not in outs for i in ids):
            for out in self.step():
                outs[out.request_id] = out
            if not self.requests and any(i not in outs for i in ids):
                raise RuntimeError("the router lost track of a request (a bug in kvscope.pd)")
        return [outs[i] for i in ids]


def _close_all(instances: list[InstanceProcess]) -> None:
    for inst in instances:
        inst.close()


def _config_kwargs(config: EngineConfig) -> dict[str, Any]:
    return {f: getattr(config, f) for f in EngineConfig.__dataclass_fields__ if f != "extra" or config.extra}

