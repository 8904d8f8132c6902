"""``Router``: what both P/D engines share, whatever their instances are: the router's state, its routing
decisions and ``Engine``'s request API over them.

The state: ``instances`` (by name, prefill ones first), ``requests`` (unfinished ``PDRequest`` s, by id),
``load`` (unfinished requests per instance), ``handovers`` (prefill done, waiting for their hand-over),
``outbox`` (finished, returned by the next ``step``), ``transfers`` and ``done`` (finished requests, in
finishing order), and the ``recorder`` (``PDRecorder``) that reads them.

The decisions: a request goes to the least loaded live prefill instance (``_pick``), and an instance that
finished a request routes it (``_route``): a prompt whose prefill ended at its one token and that wants more is
handed over, any other request is done (``_finish`` / ``_fail``). ``step``, how a request reaches its prefill
instance (``_dispatch``) and the hand-over itself are each engine's own: ``kvscope.pd.engine.PDEngine``
(instances in their own processes) and ``kvscope.pd.sim_engine.SimPDEngine`` (simulated, on one virtual clock).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Generic, NoReturn, TypeVar

from kvscope.engine.config import EngineConfig
from kvscope.engine.protocols import ModelShape
from kvscope.engine.request import (
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
    checked_params,
    next_request_id,
    rejected_request,
)
from kvscope.engine.validation import is_one_prompt, prompt_ids
from kvscope.pd.config import KV_CONSUMER, KV_PRODUCER, PDLayout
from kvscope.pd.protocols import Instance, TransferConfig
from kvscope.pd.recorder import PDRecorder
from kvscope.pd.routes import PDRequest, TransferRecord
from kvscope.utils.clock import Clock

InstanceT = TypeVar("InstanceT", bound=Instance)  # InstanceProcess or SimInstance
LinkT = TypeVar("LinkT", bound=TransferConfig)  # how KV moves: KVTransferConfig or SimLink


class Router(ABC, Generic[InstanceT, LinkT]):
    """The router over instances ``InstanceT`` whose KV moves as ``LinkT`` says; ``Engine``'s request API
    (``make_request``, ``add_request``, ``step``, ``abort``, ``generate``, ``recorder``, ...), so that
    ``Run.from_engine`` and ``LiveRun`` drive a P/D engine as they drive an ``Engine``. ``config``,
    ``model_name``, ``spec``, ``eos_token_ids``, ``max_model_len``, ``tokenizer``: the model's, as its
    instances hold it."""

    def __init__(self, layout: PDLayout, kv_transfer_config: LinkT, instances: dict[str, InstanceT], *, clock: Clock,
                 config: EngineConfig, model_name: str, spec: ModelShape, eos_token_ids: frozenset[int],
                 max_model_len: int, tokenizer: Any = None) -> None:
        self.layout, self.kv_transfer_config, self.instances, self.clock = layout, kv_transfer_config, instances, clock
        self.config, self.model_name, self.spec, self.tokenizer = config, model_name, spec, tokenizer
        self.eos_token_ids, self.max_model_len = eos_token_ids, max_model_len
        self.requests: dict[str, PDRequest] = {}
        self.load: dict[str, int] = {name: 0 for name in instances}
        self.transfers: list[TransferRecord] = []
        self.handovers: list[PDRequest] = []
        self.outbox: list[RequestOutput] = []
        self.done: list[PDRequest] = []
        self.recorder = PDRecorder(self)

    # ---- each engine's own -------------------------------------------------------------------------
    @abstractmethod
    def step(self) -> list[RequestOutput]:
        """One round of the router; returns the requests that finished."""

    @abstractmethod
    def _dispatch(self, inst: InstanceT, request: Request) -> None:
        """Send ``request`` to the prefill instance ``inst`` (``max_tokens=1``)."""

    def instances_at_rest(self) -> list[InstanceT]:
        """The live instances, none with a step in flight, to ask a command and have the answer at once. Here
        every live one: an engine whose instances compute steps elsewhere takes their answers first."""
        return [i for i in self.instances.values() if i.alive]

    # ---- routing -----------------------------------------------------------------------------------
    def _pick(self, role: str, among: Iterable[InstanceT] | None = None) -> InstanceT | None:
        """The least loaded live instance of ``role`` (``among`` those given, else all)."""
        live = [i for i in (self.instances.values() if among is None else among) if i.role == role and i.alive]
        return min(live, key=lambda i: self.load[i.name]) if live else None

    def _prefill_instance(self, among: Iterable[InstanceT] | None = None) -> InstanceT:
        inst = self._pick(KV_PRODUCER, among)
        if inst is None:
            raise RuntimeError("no live prefill instance: " + self._gone(KV_PRODUCER))
        return inst

    def _gone(self, role: str) -> str:
        return "; ".join(i.dead or "" for i in self.instances.values() if i.role == role)

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

    # ---- requests (Engine's API) -------------------------------------------------------------------
    def make_request(self, prompt: Any, params: SamplingParams | None = None, request_id: str | None = None
                     ) -> Request:
        """A checked ``Request``; nothing is queued. Token ids are checked here (vocabulary, length); a text
        prompt is tokenized by a prefill instance (once it has no step in flight)."""
        params = checked_params(params)
        if isinstance(prompt, str):
            ids, text = self._prefill_instance(self.instances_at_rest()).call("tokenize", prompt, params)
        else:
            ids, text = prompt_ids(prompt, None, self.spec.vocab_size, self.max_model_len)
        request = Request(request_id or next_request_id(), list(ids), params, prompt=text,
                          arrival_time=time.perf_counter())
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use by an unfinished request")
        return request

    def add_request(self, prompt: Any, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Queue a request on the least loaded prefill instance; returns its id."""
        request = prompt if isinstance(prompt, Request) else self.make_request(prompt, params, request_id)
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use by an unfinished request")
        inst = self._prefill_instance()
        self.requests[request.request_id] = PDRequest(request, self.clock.now_ns(), inst.name)
        self._dispatch(inst, request)
        self.load[inst.name] += 1
        return request.request_id

    def abort(self, request_id: str) -> bool:
        """Abort an unfinished request wherever it is; ``False`` if there is none by that id."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        held = all(r is not req for r in self.handovers)  # one waiting for its hand-over gave its load back (_route)
        self.handovers = [r for r in self.handovers if r is not req]
        where = self.instances[req.decode or req.prefill]
        if where.alive and held:
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
        inst = next(iter(self.instances_at_rest()), None)
        return inst.call("detokenize", list(token_ids)) if inst is not None and token_ids else ""

    def profile(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ValueError("profiling a P/D engine is not supported yet: profile an instance's Engine")

    def capture_slow(self, num_steps: int, max_windows: int | None = None) -> NoReturn:
        raise ValueError("capturing a P/D engine's slow steps is not supported yet: capture an instance's Engine")

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

    # ---- the instances -----------------------------------------------------------------------------
    def instance_stats(self) -> dict[str, dict[str, int]]:
        """Each live instance's pool (``num_used_blocks``, ``num_pinned``, ...)."""
        return {i.name: i.call("stats") for i in self.instances_at_rest()}

    def run_metadata(self) -> dict[str, Any]:
        """The decode side's metadata (the records a run shows are its), plus ``pd``: layout and instances."""
        decode = next((i for i in self.instances.values() if i.role == KV_CONSUMER), None)
        meta = dict((decode or next(iter(self.instances.values()))).info["meta"])
        meta["pd"] = {"layout": str(self.layout), "kv_transfer_config": self.kv_transfer_config.to_json(),
                      "instances": [{k: v for k, v in i.info.items() if k != "meta"} for i in self.instances.values()]}
        return meta
