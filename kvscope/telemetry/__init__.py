"""Step telemetry: records, the recorder, memory probes, torch.profiler capture and exports."""

from .probes import MemoryProbe
from .recorder import Recorder
from .records import FREE_PAGE, KVState, PageEntry, RequestEvent, ScheduledItem, StepRecord

__all__ = [
    "FREE_PAGE",
    "KVState",
    "MemoryProbe",
    "PageEntry",
    "Recorder",
    "RequestEvent",
    "ScheduledItem",
    "StepRecord",
]
