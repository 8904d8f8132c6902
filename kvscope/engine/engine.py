"""Engine: requests in, tokens out, one scheduled step at a time (vLLM's ``LLM`` / ``LLMEngine`` shape)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial, wraps
from typing import Any, TypeVar

import torch

from kvscope.engine.config import EngineConfig, ModelSpec
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.kv_groups import plan_kv_cache_groups
from kvscope.engine.core.scheduler import Scheduler, SchedulerOutput, SchedulerUpdate
from kvscope.engine.generate import GenerateMixin, Prompt
from kvscope.engine.request import (
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
    StreamDelta,
    next_request_id,
)
from kvscope.engine.sizing import resolve_dtype, resolve_max_model_len, resolve_num_blocks
from kvscope.engine.source import batch_summary, run_metadata, weights_bytes, wrap_backend
from kvscope.engine.spec_decode import Speculator, build_speculator
from kvscope.engine.validation import resolve_device, token_ids
from kvscope.engine.worker.fusion import accelerate
from kvscope.engine.worker.model_runner import ModelRunner
from kvscope.kernels import resolve_backend
from kvscope.models.loader import load_model
from kvscope.models.probe import probe_model
from kvscope.telemetry.memory import MemoryProbe
from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import NULL_MARKS, BatchSummary, PhaseMarks, StepRecord, StepTimings

F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    """Run ``method`` holding the engine's lock (see ``Engine``: one thread inside at a time)."""

    @wraps(method)
    def locked(self: Engine, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class Engine(GenerateMixin):
    """A paged-KV inference engine around an unchanged HuggingFace causal LM.

    ``Engine("tiny")``, ``Engine("smollm2")``, ``Engine("path/to/folder")`` or ``Engine(model, tokenizer=tok)``;
    keyword arguments are the fields of ``EngineConfig`` (``block_size``, ``num_blocks``, ...).

    Threads: every public method holds one re-entrant lock while it reads or changes the engine, so
    calls from several threads are serialized, never interleaved inside a step. ``generate`` and
    ``stream`` take it per step, not per call: two threads' calls share the steps (their requests are
    batched together) and both finish, rather than one waiting for the other's whole call.
    """

    def __init__(
        self,
        model: str | torch.nn.Module = "tiny",
        tokenizer=None,
        *,
        config: EngineConfig | None = None,
        **kwargs,
    ) -> None:
        config = replace(config, **kwargs) if config is not None else EngineConfig(**kwargs)
        self.config = config
        self._lock = threading.RLock()
        self.device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, self.device)
        if isinstance(model, str):
            model, loaded_tok, self.model_name = load_model(model, dtype=dtype)
            tokenizer = tokenizer or loaded_tok
        else:
            self.model_name = type(model).__name__
        self.tokenizer = tokenizer
        # a few one-token forwards: refuses (UnsupportedModelError, model left as it was) what kvscope
        # cannot run exactly, else measures each attention layer and switches the model to kvscope's
        layers = probe_model(model, config.max_model_len, config.max_num_batched_tokens)
        self.model = model.to(device=self.device, dtype=dtype).eval()

        self.spec = ModelSpec.from_layers(layers, model.config, dtype)
        self.spec.num_params = sum(p.numel() for p in model.parameters())
        self.max_model_len = resolve_max_model_len(config, self.spec, model.config)
        self.spec.max_model_len = self.max_model_len

        backend = resolve_backend(config.attention_backend, self.device)
        # the runner calls the model through its fast GEMMs (fusion.py); the model object is unchanged
        runner_model, self.fused_linears = accelerate(self.model, config.linear_backend, config.merge_projections,
                                                      self.device, dtype)
        # KV cache groups (kv_groups.py): one unless the model mixes windows; fallback_reason says why
        # a windowed model runs as one group that keeps every block
        self.kv_config = plan_kv_cache_groups(self.spec.layers) if self.spec.layers else None
        self.runner = ModelRunner(runner_model, self.spec, config.block_size, 1, backend, self.device,
                                  self.kv_config)
        num_blocks = resolve_num_blocks(config, self.spec, self.runner, self.max_model_len)
        self.runner.allocate_kv(num_blocks)
        self.pool = BlockPool(num_blocks, config.block_size, config.enable_prefix_caching)
        self.kv = KVCacheManager(self.pool, self.kv_config, config.max_num_batched_tokens)
        self.scheduler = Scheduler(config, self.kv, self.max_model_len, _eos_ids(model, tokenizer))
        self.speculator: Speculator | None = None  # speculative decoding (spec_decode/), when configured
        if config.speculative_config is not None:
            self.speculator = build_speculator(
                config.speculative_config, target_vocab=self.spec.vocab_size, target_tokenizer=tokenizer,
                block_size=config.block_size, num_blocks=num_blocks, enable_prefix_caching=config.enable_prefix_caching,
                backend=backend, device=self.device, dtype=dtype, max_model_len=self.max_model_len,
                telemetry=config.telemetry)
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.step_index = 0  # the index of the next recorded step
        self.phase_marks: PhaseMarks = NULL_MARKS  # a Profiler window's, while one is open
        self.recorder: Recorder | None = None
        if config.telemetry:
            meta = self.run_metadata()
            memory = MemoryProbe(self.device, meta["weights_bytes"], meta["kv_pool_bytes"])
            self.recorder = Recorder(meta, memory)
            self.pool.listeners.append(self.recorder.block_event)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a request (unless ``ignore_eos``); the scheduler checks them."""
        return self.scheduler.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: frozenset[int]) -> None:
        self.scheduler.eos_token_ids = frozenset(ids)

    def run_metadata(self) -> dict:
        """What a saved run needs to be read without the engine (all JSON values; docs/telemetry.md)."""
        return run_metadata(self.model_name, self.config, self.spec, self.runner, self.device,
                            weights_bytes(self.model),
                            self.speculator.describe() if self.speculator is not None else None)

    # ---- requests --------------------------------------------------------------------------------
    def make_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> Request:
        """Validate a prompt and its parameters into a ``Request``. Raises ``TypeError`` (a prompt or
        params of the wrong type) or ``ValueError`` (empty, too long, outside the vocabulary, an id in
        use), naming the problem; the engine is left as it was."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, not {type(params).__name__}")
        params.validate()  # again: the fields may have been changed since construction
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise TypeError(f"request_id={request_id!r} must be a non-empty string (or None for a new one)")
        text = None
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass prompts as lists of token ids")
            text = prompt
            ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            ids = token_ids(prompt)
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.spec.vocab_size
        if vocab and not all(0 <= t < vocab for t in ids):
            raise ValueError(f"the prompt has token ids outside the vocabulary [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens but the model allows at most {self.max_model_len - 1} "
                f"(max_model_len={self.max_model_len}, one position is needed for the output): shorten it"
            )
        request_id = request_id or next_request_id()
        self._check_id_free(request_id)
        return Request(request_id, ids, params, prompt=text, arrival_time=time.perf_counter())

    def _check_id_free(self, request_id: str) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")

    @_locked
    def add_request(
        self, prompt: Prompt | Request, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Queue a request; returns its id. A bad one raises here (``make_request``) and changes nothing:
        the requests already queued go on. An id may be reused once its request has finished; the
        records then keep the two apart (the later one is recorded as ``id#2``; docs/reliability.md)."""
        if isinstance(prompt, Request):
            request = prompt
            self._check_id_free(request.request_id)
        else:
            request = self.make_request(prompt, params, request_id)
        self.requests[request.request_id] = request
        self.scheduler.add_request(request)
        self._event("queued", request)
        return request.request_id

    @_locked
    def abort(self, request_id: str) -> bool:
        """Stop a request wherever it is; its blocks return to the pool. False if it is unknown or done."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
        if self.speculator is not None:
            self.speculator.free(request_id)
        self._event("finished", request)
        return True

    @_locked
    def abort_all(self) -> None:
        """Abort every unfinished request and record the resulting state (``record_state``)."""
        for request_id in list(self.requests):
            self.abort(request_id)
        self.record_state()

    @_locked
    def reject(self, prompt: Any, params: Any, error: str) -> Request:
        """A request that cannot run, recorded as queued and at once finished with status ``error``
        (so a background run can fail one bad prompt alone while the others go on)."""
        text = prompt if isinstance(prompt, str) else None
        try:
            tokens = self.tokenizer.encode(prompt) if text and self.tokenizer else token_ids(prompt)
        except (TypeError, ValueError):
            tokens = []
        if not isinstance(params, SamplingParams):
            params = SamplingParams()
        request = Request(next_request_id(), tokens, params, prompt=text, arrival_time=time.perf_counter())
        request.status, request.error = RequestStatus.FINISHED_ERROR, error
        self._event("queued", request)
        self._event("finished", request)
        return request

    @_locked
    def record_state(self) -> StepRecord | None:
        """Record the engine's state if it changed since the last record without a step (requests
        aborted or failed between steps): a ``StepRecord`` with nothing scheduled and zero duration,
        under the next step index. Returns it, or ``None`` when there was nothing new to record."""
        if self.recorder is None:
            return None
        stats = self.scheduler.make_stats()
        if not self.recorder.state_changed(stats):
            return None
        timings = StepTimings.instant(time.perf_counter_ns())
        spec = self.speculator.stats({}, [], {}, {}, self.config.block_size) if self.speculator is not None else None
        record = self.recorder.record_step(BatchSummary(self.step_index, spec_decode=spec), timings, stats)
        self.step_index += 1  # a recorded step: keep step indices unique
        return record

    @_locked
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---- the step ----------------------------------------------------------------------------------
    @_locked
    def step(self) -> list[StreamDelta]:
        """Schedule, run the model once over the packed batch, sample, and update requests.

        Returns one ``StreamDelta`` per request that got a token or finished (``text`` left empty).
        If the forward pass raises, every request of that batch ends with status ``error``, the
        blocks cached for it are forgotten, and the exception propagates; the engine stays usable.
        """
        t0 = time.perf_counter_ns()
        marks = self.phase_marks
        marks.begin("schedule")
        if self.speculator is not None:  # drafts for the requests that decode in this step
            self.speculator.propose(self.scheduler.running)
        sched = self.scheduler.schedule()
        deltas = [self._finish(r, r.status) for r in sched.failed]
        t1 = time.perf_counter_ns()
        if sched.is_empty:
            if self.recorder is not None and (sched.failed or sched.preempted):
                self._record(sched, [], len(sched.failed), StepTimings(t0, t1, t1, t1, t1, time.perf_counter_ns()))
                self.step_index += 1  # a recorded step: keep step indices unique
            return deltas
        marks.begin("prepare")
        inp = self.runner.prepare(sched)
        t2 = time.perf_counter_ns()
        marks.begin("forward")
        try:
            logits = self.runner.forward(inp)
            t3 = time.perf_counter_ns()
            marks.begin("sample")
            if inp.spec_drafts is None:
                sampled, num_accepted = self.runner.sample(logits, inp), None
            else:  # drafts in the step: verify them (rejection sampling)
                draft_probs = self.speculator.draft_probs if self.speculator is not None else None
                sampled, num_accepted = self.runner.verify(logits, inp, draft_probs)
        except BaseException as exc:
            marks.end(self.step_index)
            self._fail_batch(sched, exc)
            raise
        t4 = time.perf_counter_ns()
        marks.begin("update")
        update = self.scheduler.update_from_output(sched, inp.sample_requests, sampled, num_accepted)
        running = RequestStatus.RUNNING  # what a sampled request is unless it just finished
        accepted = update.spec_accepted
        for request, token in zip(update.requests, update.token_ids):
            if accepted:  # accepted drafts come first, one delta each
                for t in accepted.get(request.request_id, ()):
                    deltas.append(StreamDelta(request.request_id, request.index, t, "", False))
            if request.status is running:
                deltas.append(StreamDelta(request.request_id, request.index, token, "", False))
            else:
                deltas.append(StreamDelta(request.request_id, request.index, token, "", True, request.status.value))
        for request in update.finished:
            self.requests.pop(request.request_id, None)
        if self.speculator is not None:  # finished: its draft state (a draft model's blocks) goes too
            for request in update.finished:
                self.speculator.free(request.request_id)
        marks.end(self.step_index)
        if self.recorder is not None:
            for request in update.requests:  # events the step's tokens caused, in sampling order
                n = len(request.output_token_ids)  # all of them new: its first token (+ accepted drafts)
                if n == 1 or (accepted and n == 1 + len(accepted.get(request.request_id, ()))):
                    self._event("first_token", request)
                if request.status is not running:
                    self._event("finished", request)
            timings = StepTimings(t0, t1, t2, t3, t4, time.perf_counter_ns())
            self._record(sched, update.requests, len(update.finished) + len(sched.failed), timings, update)
        self.step_index += 1
        return deltas

    # ---- telemetry ----------------------------------------------------------------------------------
    def _record(self, sched: SchedulerOutput, sampled: list[Request], num_finished: int,
                timings: StepTimings, update: SchedulerUpdate | None = None) -> StepRecord:
        accepted, spec = update.spec_accepted if update is not None else {}, None
        if self.speculator is not None:
            spec = self.speculator.stats(sched.scheduled_spec_decode_tokens, sched.requests, accepted,
                                         update.spec_freed if update is not None else {}, self.config.block_size)
        batch = batch_summary(self.step_index, sched, sampled, num_finished, accepted, spec)
        return self.recorder.record_step(batch, timings, self.scheduler.make_stats())

    def _event(self, kind: str, request: Request) -> None:
        if self.recorder is not None:
            self.recorder.request_event(kind, request.request_id, self.step_index, request.num_prompt_tokens,
                                        request.num_output_tokens, request.finish_reason, request.error)

    @_locked
    def set_phase_marks(self, marks: PhaseMarks | None) -> None:
        """Report each step's phases to ``marks`` (``begin(phase)``, ``end(step)``), or to nobody
        with ``None``. One observer at a time: ``RuntimeError`` while another has them."""
        if marks is not None and self.phase_marks is not NULL_MARKS:
            raise RuntimeError("a profiling window is already open on this engine")
        self.phase_marks = marks if marks is not None else NULL_MARKS

    def profile(self, num_steps: int = 3, wait: int = 0, warmup: int = 1, **kwargs):
        """Capture the next steps with torch.profiler: a started ``telemetry.profiler.Profiler``
        (also a context manager); per-step kernel time by category lands in ``StepRecord.profile``."""
        from kvscope.telemetry.profiler import Profiler

        if self.recorder is None:
            raise ValueError(
                "profiling attaches its summaries to step records: create the engine with telemetry=True"
            )
        return Profiler(self.recorder, self.set_phase_marks, partial(wrap_backend, self.runner),
                        cuda=self.device.type == "cuda", num_steps=num_steps, wait=wait, warmup=warmup,
                        **kwargs).start()

    # ---- finishing ----------------------------------------------------------------------------------
    def _finish(self, request: Request, status: RequestStatus, error: str | None = None) -> StreamDelta:
        self.scheduler.finish(request, status, error)
        if self.speculator is not None:
            self.speculator.free(request.request_id)
        request.status = status  # failed requests were marked by the scheduler already
        self.requests.pop(request.request_id, None)
        self._event("finished", request)
        return StreamDelta(request.request_id, request.index, None, "", True, status.value)

    def _fail_batch(self, sched, exc: BaseException) -> None:
        self.kv.rollback_step()
        message = f"the forward pass failed: {type(exc).__name__}: {exc}"
        status = (
            RequestStatus.FINISHED_ABORTED
            if isinstance(exc, KeyboardInterrupt)
            else RequestStatus.FINISHED_ERROR
        )
        for request in sched.requests:
            if not request.is_finished:
                self._finish(request, status, message)
        self.record_state()  # the failed requests' blocks are free again

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @_locked
    def output(self, request: Request) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            token_ids=list(request.output_token_ids),
            text=self.decode(request.output_token_ids),
            finish_reason=request.finish_reason,
            error=request.error,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            num_preemptions=request.num_preemptions,
        )


def _eos_ids(model, tokenizer) -> frozenset[int]:
    """The token ids that end a request, as ``generate`` reads them (generation config, else tokenizer)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos) if isinstance(eos, (list, tuple, set)) else frozenset([eos])
