"""Step telemetry: records, the recorder, memory probes, torch.profiler capture and exports."""

from .records import RequestEvent, StepRecord
from .recorder import Recorder

__all__ = ["Recorder", "RequestEvent", "StepRecord"]
