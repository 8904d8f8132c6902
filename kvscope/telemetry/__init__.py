"""Step telemetry: what a step source records, and everything read from the records afterwards.

Telemetry imports nothing of the engine, the models or the kernels: a source hands the ``Recorder`` plain
records (``BatchSummary``, ``StepTimings``, ``SchedulerStats``, block-pool events, request events).

- ``records``: the record types (``StepRecord``, ``RequestEvent``, ...); ``inputs``: what a source hands in;
- ``recorder``: the ``Recorder`` (ring buffers, subscribers, events held to a step's end); ``request_names``:
  the ids it records (a reused id becomes ``id#2``);
- ``step_record``: a step's ``StepRecord`` and ``KVState`` from the source's plain data;
- ``pagemap``: the page map kept incrementally (``PageMapTracker``) and rebuilt at a step (``page_map_at``);
- ``memory``: the memory readings sampled with each record (``MemoryProbe``: NVML, allocator, host RSS);
- ``profiler``: a torch.profiler window over engine steps; ``phase_marks``: where a source reports its phases;
  ``kernel_time``: the window's ops by category, per step;
- ``step_features``: what a step-time model sees of a step (``StepFeatures``, ``phase_of``); ``step_baseline``:
  the run's own step model learnt online and the slow-step rule; ``slow_capture``: a profiler window after each
  slow step (``--capture-slow``);
- ``frames``: a run's DataFrames (per step, per request, per draft position);
  ``run_summary``: its headline numbers; ``summary_stream``: the same, kept record by record;
- ``detail``: which steps of a long simulation get per-request detail (``DetailWindow``);
- ``pd_lanes``: a P/D request's path, read from ``meta["pd"]``;
- ``serialize``, ``export``, ``load``: records to JSON and back, the trace and metrics files written and read;
  ``trace``: the trace's events (its layout).
"""

from kvscope.telemetry.inputs import BatchSummary, RequestProgress, SchedulerStats, StepTimings
from kvscope.telemetry.memory import MemoryProbe
from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import FREE_PAGE, KVState, PageEntry, RequestEvent, ScheduledItem, StepRecord

__all__ = [
    "FREE_PAGE",
    "BatchSummary",
    "KVState",
    "MemoryProbe",
    "PageEntry",
    "Recorder",
    "RequestEvent",
    "RequestProgress",
    "ScheduledItem",
    "SchedulerStats",
    "StepRecord",
    "StepTimings",
]
