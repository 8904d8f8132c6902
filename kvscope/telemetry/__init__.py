"""Step telemetry: records, the recorder, memory probes, torch.profiler capture and exports.

Telemetry imports nothing of the engine: a source hands the ``Recorder`` plain records
(``BatchSummary``, ``StepTimings``, ``SchedulerStats``, block-pool events, request events).
"""

from kvscope.telemetry.memory import MemoryProbe
from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import (
    FREE_PAGE,
    BatchSummary,
    KVState,
    PageEntry,
    RequestEvent,
    RequestProgress,
    ScheduledItem,
    SchedulerStats,
    StepRecord,
    StepTimings,
)

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
