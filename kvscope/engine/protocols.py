"""The engine's seams, as ``typing.Protocol`` s that ``.ci/typecheck`` (mypy) checks both sides of.

- ``Worker``: what ``Engine.step`` and the run metadata need of the engine's worker. Two satisfy it:
  ``kvscope.engine.worker.model_runner.ModelRunner`` (a model, its KV pages, tensors) and
  ``kvscope.sim.worker.SimWorker`` (no model: the step-time model moves a virtual clock). ``EngineParts.runner``
  is typed with it, so each is checked where it is built (``build.py``, ``kvscope.sim.build``).
- ``EngineClient`` (vLLM's name for the engine its API server drives): what the runs and the faces call on an
  engine, whichever it is: ``Engine``, ``kvscope.pd.engine.PDEngine`` (instances in their own processes), a
  simulated ``Engine`` or ``kvscope.pd.sim_engine.SimPDEngine``. ``RunRecorder`` is its ``recorder`` as the runs
  read it (``kvscope.telemetry.recorder.Recorder``, or ``kvscope.pd.recorder.PDRecorder``).

Members are read-only properties where the runs only read them, so a class may hold a narrower type (a
``ModelSpec`` where ``ModelShape`` is asked for) or set the attribute itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kvscope.engine.config import EngineConfig
from kvscope.engine.core.kv_groups import KVCacheConfig
from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request, RequestOutput, SamplingParams
from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.utils.clock import Clock

if TYPE_CHECKING:
    from kvscope.telemetry.slow_capture import SlowCapture

__all__ = ["EngineClient", "ModelShape", "RunRecorder", "StepInput", "Worker"]


# ---- the worker an Engine drives ------------------------------------------------------------------------
class StepInput(Protocol):
    """What ``Engine.step`` reads of a prepared step (``ModelInput``, or the simulator's ``SimInput``)."""

    @property
    def sample_requests(self) -> list[Request]:
        """The request of each token the step samples, in the order ``sample`` returns them."""

    @property
    def spec_drafts(self) -> list[list[int]] | None:
        """Per sample request, the drafts it verifies; ``None`` when nothing in the step has drafts."""


InputT = TypeVar("InputT", bound=StepInput)
LogitsT = TypeVar("LogitsT")


class Worker(Protocol[InputT, LogitsT]):
    """What ``Engine`` needs of its worker: a step is ``prepare`` -> ``forward`` -> ``sample`` (or, with
    drafts, ``verify``); the rest is what ``Engine.run_metadata`` reports. ``InputT`` is the worker's own
    prepared step (``ModelInput``), ``LogitsT`` what its ``forward`` hands ``sample`` (a tensor; ``None`` for a
    model-free worker). ``ModelRunner`` is a ``Worker[ModelInput, torch.Tensor]``, ``SimWorker`` a
    ``Worker[SimInput, None]``; an engine holds a ``Worker[Any, Any]``, whose step it only passes along."""

    @property
    def backend_name(self) -> str:
        """The attention backend (``"torch"``, ``"triton"``, ``"cpu"``; ``"simulated"``: no kernels run)."""

    @property
    def num_blocks(self) -> int:
        """KV blocks the worker holds pages for (the block pool's size)."""

    @property
    def kv_bytes_per_block(self) -> int:
        """What one block id holds: a page in every KV slot."""

    @property
    def kv_cache_bytes(self) -> int:
        """The whole KV cache."""

    @property
    def kv_config(self) -> KVCacheConfig:
        """The KV cache groups (``kvscope.engine.core.kv_groups``)."""

    def prepare(self, sched: SchedulerOutput) -> InputT:
        """The scheduled step packed for ``forward``; its ``sample_requests`` in the worker's packing order."""

    def forward(self, inp: InputT) -> LogitsT:
        """Run the step (or advance a virtual clock by its predicted time)."""

    def sample(self, logits: LogitsT, inp: InputT) -> list[int]:
        """A token per ``inp.sample_requests``, in their order."""

    def verify(self, logits: LogitsT, inp: InputT,
               draft_probs: Any = None) -> tuple[list[int], dict[str, int]]:
        """A step with drafts: a token per sample request, and how many drafts of each request were accepted."""


# ---- the engine the runs and faces drive ------------------------------------------------------------------
class ModelShape(Protocol):
    """What the runs read of ``engine.spec`` (the synthetic workload: the vocabulary)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...


class RunRecorder(Protocol):
    """An engine's ``recorder`` as a run reads it: a ring of records and events, what a run starts from
    (``baseline``), a live feed (``subscribe``) and the snapshot a ``Run`` is made of."""

    @property
    def capacity(self) -> int:
        """How many step records the ring keeps (events: four times as many)."""

    @property
    def baseline(self) -> dict[str, int]:
        """Cumulative counters at the run's start (``SummaryStream``'s starting point)."""

    @property
    def events(self) -> deque[RequestEvent]: ...

    def clear(self) -> None:
        """A new run from the same engine: forget what was recorded."""

    def subscribe(self, fn: Callable[[StepRecord | RequestEvent], None]) -> Callable[[], None]:
        """Call ``fn`` with every new record and event; returns the function that unsubscribes it."""

    def snapshot(self) -> tuple[list[StepRecord], list[RequestEvent], dict[str, Any], list[dict[str, Any]]]:
        """Copies of the records, events, metadata and profiler events: ``Run(*recorder.snapshot())``."""


class EngineClient(Protocol):
    """An engine as ``LiveRun``, ``Run.from_engine``, the sweeps and the faces drive it (``Engine``,
    ``PDEngine``, a simulated ``Engine``, ``SimPDEngine``): requests in (``make_request`` / ``add_request``,
    ``reject`` for one that cannot run), ``step`` until ``has_unfinished_requests`` is false, outputs and
    texts out, a ``recorder`` to read (``None``: telemetry off), and a ``clock`` (a simulation's is virtual)."""

    @property
    def config(self) -> EngineConfig: ...

    @property
    def model_name(self) -> str: ...

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer, or ``None`` (token ids only)."""

    @property
    def spec(self) -> ModelShape: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def requests(self) -> Mapping[str, object]:
        """The unfinished requests, by id."""

    @property
    def recorder(self) -> RunRecorder | None: ...

    def run_metadata(self) -> dict[str, Any]: ...

    def make_request(self, prompt: Any, params: SamplingParams | None = None,
                     request_id: str | None = None) -> Request: ...

    def add_request(self, prompt: Any, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str: ...

    def reject(self, prompt: Any, params: Any, error: str) -> Request: ...

    def abort(self, request_id: str) -> bool: ...

    def record_state(self) -> object:
        """Record the state if it changed between steps (aborts); what it returns is the engine's own."""

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> Sequence[object]:
        """One step; what it returns (stream deltas, finished outputs) is the engine's own."""

    def generate(self, prompts: Any, params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[RequestOutput]: ...

    def output(self, request: Request) -> RequestOutput: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def profile(self, num_steps: int = 3) -> AbstractContextManager[Any]: ...

    def capture_slow(self, num_steps: int, max_windows: int | None = None) -> SlowCapture: ...
