"""Engine: requests in, tokens out, one scheduled step at a time (vLLM's ``LLM`` / ``LLMEngine`` shape)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial

import torch

from . import attention
from .block_pool import BlockPool
from .config import EngineConfig, ModelSpec
from .engine_telemetry import batch_summary, run_metadata, weights_bytes, wrap_backend
from .kernels import resolve_backend
from .kv_cache_manager import KVCacheManager
from .models import load_model
from .request import Request, RequestOutput, RequestStatus, SamplingParams, StreamDelta, next_request_id
from .runner import ModelRunner
from .scheduler import Scheduler, SchedulerOutput
from .sizing import resolve_dtype, resolve_max_model_len, resolve_num_blocks
from .telemetry.probes import MemoryProbe
from .telemetry.recorder import Recorder
from .telemetry.records import NULL_MARKS, BatchSummary, PhaseMarks, StepRecord, StepTimings

Prompt = str | list[int]


class Engine:
    """A paged-KV inference engine around an unchanged HuggingFace causal LM.

    ``Engine("tiny")``, ``Engine("smollm2")``, ``Engine("path/to/folder")`` or ``Engine(model, tokenizer=tok)``;
    keyword arguments are the fields of ``EngineConfig`` (``block_size``, ``num_blocks``, ...).
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
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = resolve_dtype(config.dtype, self.device)
        if isinstance(model, str):
            model, loaded_tok, self.model_name = load_model(model, dtype=dtype)
            tokenizer = tokenizer or loaded_tok
        else:
            self.model_name = type(model).__name__
        self.tokenizer = tokenizer
        attention.check_attention_supported(model.config)
        attention.register()
        model.set_attn_implementation(attention.ATTN_NAME)
        self.model = model.to(device=self.device, dtype=dtype).eval()

        self.spec = ModelSpec.from_hf_config(model.config, dtype=dtype)
        self.spec.num_params = sum(p.numel() for p in model.parameters())
        self.max_model_len = resolve_max_model_len(config, self.spec, model.config)
        self.spec.max_model_len = self.max_model_len

        backend = resolve_backend(config.attention_backend, self.device)
        self.runner = ModelRunner(self.model, self.spec, config.block_size, 1, backend, self.device)
        num_blocks = resolve_num_blocks(config, self.spec, self.runner, self.max_model_len)
        self.runner.allocate_kv(num_blocks)
        self.pool = BlockPool(num_blocks, config.block_size, config.enable_prefix_caching)
        self.kv = KVCacheManager(self.pool)
        self.scheduler = Scheduler(config, self.kv, self.max_model_len, _eos_ids(model, tokenizer))
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
                            weights_bytes(self.model))

    # ---- requests --------------------------------------------------------------------------------
    def make_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> Request:
        """Validate a prompt and its parameters into a ``Request`` (raises ``ValueError`` naming the problem)."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, not {type(params).__name__}")
        text = None
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass prompts as lists of token ids")
            text = prompt
            token_ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            token_ids = [int(t) for t in prompt]
        if not token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.spec.vocab_size
        if vocab and not all(0 <= t < vocab for t in token_ids):
            raise ValueError(f"the prompt has token ids outside the vocabulary [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens but the model allows at most {self.max_model_len - 1} "
                f"(max_model_len={self.max_model_len}, one position is needed for the output): shorten it"
            )
        request_id = request_id or next_request_id()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        return Request(request_id, token_ids, params, prompt=text, arrival_time=time.perf_counter())

    def add_request(
        self, prompt: Prompt | Request, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        request = prompt if isinstance(prompt, Request) else self.make_request(prompt, params, request_id)
        self.requests[request.request_id] = request
        self.scheduler.add_request(request)
        self._event("queued", request)
        return request.request_id

    def abort(self, request_id: str) -> bool:
        """Stop a request wherever it is; its blocks return to the pool. False if it is unknown or done."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
        self._event("finished", request)
        return True

    def abort_all(self) -> None:
        """Abort every unfinished request and record the resulting state (``record_state``)."""
        for request_id in list(self.requests):
            self.abort(request_id)
        self.record_state()

    def reject(self, prompt: Prompt, params: SamplingParams | None, error: str) -> Request:
        """A request that cannot run, recorded as queued and at once finished with status ``error``
        (so a background run can fail one bad prompt alone while the others go on)."""
        text = prompt if isinstance(prompt, str) else None
        try:
            tokens = self.tokenizer.encode(prompt) if text and self.tokenizer else [int(t) for t in prompt or ()]
        except (TypeError, ValueError):
            tokens = []
        request = Request(next_request_id(), tokens, params or SamplingParams(), prompt=text,
                          arrival_time=time.perf_counter())
        request.status, request.error = RequestStatus.FINISHED_ERROR, error
        self._event("queued", request)
        self._event("finished", request)
        return request

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
        record = self.recorder.record_step(BatchSummary(self.step_index), timings, stats)
        self.step_index += 1  # a recorded step: keep step indices unique
        return record

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---- the step ----------------------------------------------------------------------------------
    def step(self) -> list[StreamDelta]:
        """Schedule, run the model once over the packed batch, sample, and update requests.

        Returns one ``StreamDelta`` per request that got a token or finished (``text`` left empty).
        If the forward pass raises, every request of that batch ends with status ``error``, the
        blocks cached for it are forgotten, and the exception propagates; the engine stays usable.
        """
        t0 = time.perf_counter_ns()
        marks = self.phase_marks
        marks.begin("schedule")
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
            sampled = self.runner.sample(logits, inp)
        except BaseException as exc:
            marks.end(self.step_index)
            self._fail_batch(sched, exc)
            raise
        t4 = time.perf_counter_ns()
        marks.begin("update")
        update = self.scheduler.update_from_output(sched, inp.sample_requests, sampled)
        running = RequestStatus.RUNNING  # what a sampled request is unless it just finished
        for request, token in zip(update.requests, update.token_ids):
            if request.status is running:
                deltas.append(StreamDelta(request.request_id, request.index, token, "", False))
            else:
                deltas.append(StreamDelta(request.request_id, request.index, token, "", True, request.status.value))
        for request in update.finished:
            self.requests.pop(request.request_id, None)
        marks.end(self.step_index)
        if self.recorder is not None:
            for request in update.requests:  # events the step's tokens caused, in sampling order
                if len(request.output_token_ids) == 1:
                    self._event("first_token", request)
                if request.status is not running:
                    self._event("finished", request)
            timings = StepTimings(t0, t1, t2, t3, t4, time.perf_counter_ns())
            self._record(sched, update.requests, len(update.finished) + len(sched.failed), timings)
        self.step_index += 1
        return deltas

    # ---- telemetry ----------------------------------------------------------------------------------
    def _record(self, sched: SchedulerOutput, sampled: list[Request], num_finished: int,
                timings: StepTimings) -> StepRecord:
        batch = batch_summary(self.step_index, sched, sampled, num_finished)
        return self.recorder.record_step(batch, timings, self.scheduler.make_stats())

    def _event(self, kind: str, request: Request) -> None:
        if self.recorder is not None:
            self.recorder.request_event(kind, request.request_id, self.step_index, request.num_prompt_tokens,
                                        request.num_output_tokens, request.finish_reason, request.error)

    def set_phase_marks(self, marks: PhaseMarks | None) -> None:
        """Report each step's phases to ``marks`` (``begin(phase)``, ``end(step)``), or to nobody
        with ``None``. One observer at a time: ``RuntimeError`` while another has them."""
        if marks is not None and self.phase_marks is not NULL_MARKS:
            raise RuntimeError("a profiling window is already open on this engine")
        self.phase_marks = marks if marks is not None else NULL_MARKS

    def profile(self, num_steps: int = 3, wait: int = 0, warmup: int = 1, **kwargs):
        """Capture the next steps with torch.profiler: a started ``telemetry.profiler.Profiler``
        (also a context manager); per-step kernel time by category lands in ``StepRecord.profile``."""
        from .telemetry.profiler import Profiler

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

    # ---- convenience ---------------------------------------------------------------------------
    def _make_requests(self, prompts: Prompt | Sequence[Prompt], params) -> list[Request]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt
        params_list = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams")
        requests = []
        for i, (prompt, p) in enumerate(zip(prompts, params_list)):
            try:
                request = self.make_request(prompt, p)
            except ValueError as exc:
                raise ValueError(f"prompt {i}: {exc}") from None
            request.index = i
            requests.append(request)
        return requests

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; one ``RequestOutput`` per prompt, in order.

        All prompts are validated before any runs. A request that cannot run (e.g. larger than the
        whole pool) comes back with ``finish_reason == "error"`` and ``error`` set; the rest go on.
        On an exception or KeyboardInterrupt every request of this call is aborted before it propagates.
        """
        requests = self._make_requests(prompts, params)
        for request in requests:
            self.add_request(request)
        try:
            while any(not r.is_finished for r in requests):
                self.step()
        except BaseException:
            for request in requests:
                self.abort(request.request_id)
            self.record_state()
            raise
        return [self.output(r) for r in requests]

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamDelta]:
        """Yield tokens as they are produced (with the text each adds), then a final delta per request."""
        requests = self._make_requests(prompts, params)
        by_id = {r.request_id: r for r in requests}
        texts = dict.fromkeys(by_id, "")
        for request in requests:
            self.add_request(request)
        try:
            while any(not r.is_finished for r in requests):
                for delta in self.step():
                    request = by_id.get(delta.request_id)
                    if request is None:
                        continue
                    if self.tokenizer is not None:
                        text = self.decode(request.output_token_ids)
                        delta.text, texts[delta.request_id] = text[len(texts[delta.request_id]) :], text
                    yield delta
        finally:
            for request in requests:
                self.abort(request.request_id)
            self.record_state()

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

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
