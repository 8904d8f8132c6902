"""Running request statistics for the live panels: TTFT, ITL and throughput, in bounded memory.

Definitions follow vLLM's metrics: TTFT = first token time - queued time; ITL = time between two
consecutive output tokens of one request (a preemption stall counts, as the user waits through it).
A token's time is the end of the step that sampled it (the ``first_token`` event carries that same
time). Feed items in ``Tick.ordered()`` order.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from kvscope.telemetry.records import RequestEvent, StepRecord

NS = 1e9


class LatencyStats:
    """TTFT and ITL samples (seconds, the most recent ``max_samples`` of each) and token rates."""

    def __init__(self, max_samples: int = 50_000, rate_window_s: float = 2.0) -> None:
        self.ttft: deque[float] = deque(maxlen=max_samples)
        self.itl: deque[float] = deque(maxlen=max_samples)
        self._num_added = {"ttft": 0, "itl": 0}  # samples ever added: the version of each deque
        self._arrays: dict[str, tuple[int, np.ndarray]] = {}  # name -> (version, its samples as an array)
        self.rate_window_ns = int(rate_window_s * NS)
        self._queued_ns: dict[str, int] = {}  # only requests still waiting for their first token
        self._last_token_ns: dict[str, int] = {}  # only unfinished requests that have a token
        self._done: list[str] = []  # finished, forgotten at the next record
        self._recent: deque[tuple[int, int, int]] = deque()  # (t_start, t_end, tokens) in the window
        self.num_requests = 0
        self.num_finished = 0
        self.num_preemptions = 0
        self.output_tokens = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None

    @property
    def num_active(self) -> int:
        """Requests with per-request state held (memory is bounded by the unfinished requests)."""
        return len(self._queued_ns.keys() | self._last_token_ns.keys())

    def add(self, item: StepRecord | RequestEvent) -> None:
        if isinstance(item, StepRecord):
            self._add_step(item)
        else:
            self._add_event(item)

    def _add_event(self, event: RequestEvent) -> None:
        rid = event.request_id
        if self.first_ns is None:
            self.first_ns = event.t_ns
        if event.kind == "queued":
            self.num_requests += 1
            self._queued_ns[rid] = event.t_ns
        elif event.kind == "first_token":
            queued = self._queued_ns.pop(rid, None)
            if queued is not None:
                self.ttft.append((event.t_ns - queued) / NS)
                self._num_added["ttft"] += 1
        elif event.kind == "preempted":
            self.num_preemptions += 1
        elif event.kind == "finished":
            self.num_finished += 1
            self._queued_ns.pop(rid, None)
            self._done.append(rid)  # a step's "finished" comes before its record, whose token still counts

    def _add_step(self, step: StepRecord) -> None:
        if self.first_ns is None:
            self.first_ns = step.t_start_ns
        self.last_ns = step.t_end_ns
        self.output_tokens += step.num_output_tokens
        for item in step.scheduled:
            if not (item.sampled or item.kind == "decode"):
                continue
            last = self._last_token_ns.get(item.request_id)
            if last is not None:
                self.itl.append((step.t_end_ns - last) / NS)
                self._num_added["itl"] += 1
            self._last_token_ns[item.request_id] = step.t_end_ns
        self.flush()
        self._recent.append((step.t_start_ns, step.t_end_ns, step.num_output_tokens))
        while self._recent and self._recent[0][1] < step.t_end_ns - self.rate_window_ns:
            self._recent.popleft()

    def samples(self, name: str) -> np.ndarray:
        """The ``"ttft"`` or ``"itl"`` samples (seconds) as an array, made once per change and shared by everything
        a tick reads of them (the KPI tiles' percentiles, the histograms): up to 50,000 ITLs read out of the deque
        by each reader, and sorted for each percentile, took ~8 ms of the update thread per tick."""
        version = self._num_added[name]
        cached = self._arrays.get(name)
        if cached is None or cached[0] != version:
            samples = self.ttft if name == "ttft" else self.itl
            cached = (version, np.fromiter(samples, dtype=float, count=len(samples)))
            self._arrays[name] = cached
        return cached[1]

    def percentiles(self, name: str, qs: tuple[float, ...]) -> list[float | None]:
        """The ``qs``-th percentiles of the ``"ttft"`` or ``"itl"`` samples (seconds; None when there are none),
        from one partition of the samples."""
        values = self.samples(name)
        if not len(values):
            return [None] * len(qs)
        return [float(v) for v in np.percentile(values, qs)]

    def flush(self) -> None:
        """Forget finished requests (after the record of their last step, or at the end)."""
        for rid in self._done:
            self._last_token_ns.pop(rid, None)
        self._done.clear()

    def tokens_per_s(self) -> float:
        """Output tokens per second over the last ``rate_window_s`` of steps."""
        if not self._recent:
            return 0.0
        span = self._recent[-1][1] - self._recent[0][0]
        return sum(n for *_, n in self._recent) * NS / span if span > 0 else 0.0

    def mean_tokens_per_s(self) -> float:
        """Output tokens per second over the whole run so far."""
        if self.first_ns is None or self.last_ns is None or self.last_ns <= self.first_ns:
            return 0.0
        return self.output_tokens * NS / (self.last_ns - self.first_ns)
