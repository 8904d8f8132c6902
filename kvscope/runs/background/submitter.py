"""``Submitter``: a live run's workload, submitted to its engine as each item's arrival time comes.

The engine thread of a ``LiveRun`` calls ``submit_due`` between steps: every item whose arrival time (seconds
from ``start``, on the engine's clock) has come becomes a request. A prompt the engine refuses fails alone, as a
request finished with status ``error`` naming the item; the others run. A lazy workload (an iterator: a
simulation of 10**6 requests) is read one item ahead, and with ``keep_outputs=False`` finished requests are let go,
so memory stays bounded at any length.

A simulation of a server whose front end delays each request (``kvscope.sim.admission``) submits each item
``admission_s`` after its arrival time and keeps that arrival time on the request, so its TTFT counts the delay.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from kvscope.engine.protocols import EngineClient
from kvscope.engine.request import Request, RequestOutput
from kvscope.runs.workload.items import WorkItem
from kvscope.telemetry.export import MAX_TEXT

KEEP_FINISHED = 4096  # with keep_outputs=False: finished requests kept past twice the unfinished ones


class Submitter:
    """The items of a run's workload not yet submitted, and the requests made of those that were."""

    __slots__ = ("_next", "_pending", "admission_ns", "keep_outputs", "num_submitted", "requests", "t0_ns",
                 "workload")

    def __init__(self, keep_outputs: bool = True, admission_s: float = 0.0) -> None:
        self.workload: list[WorkItem] = []  # the whole workload, once known as a list (empty for a lazy one)
        self.keep_outputs = keep_outputs
        self.requests: list[Request] = []  # one per submitted item, in workload order (see keep_outputs)
        self.num_submitted = 0
        self.t0_ns = 0  # arrival times count from here
        self.admission_ns = round(admission_s * 1e9)  # from an item's arrival to its submission (the module doc)
        self._pending: Iterator[WorkItem] = iter(())
        self._next: WorkItem | None = None  # the next item to submit, when its arrival time comes

    def start(self, items: Iterable[WorkItem], t0_ns: int) -> None:
        """Submit ``items`` (a list, or an iterator read one ahead) with arrival times from ``t0_ns``."""
        if isinstance(items, Sequence):
            self.workload = list(items)
            items = self.workload
        self._pending = iter(items)
        self._next = next(self._pending, None)
        self.t0_ns = t0_ns

    @property
    def next_arrival_ns(self) -> int | None:
        """When the next item arrives (``None``: every item was submitted)."""
        item = self._next
        return None if item is None else self.t0_ns + round(item.arrival_s * 1e9) + self.admission_ns

    def submit_due(self, engine: EngineClient) -> None:
        """Add the items whose arrival time has come. A prompt the engine refuses (empty, too long, outside
        the vocabulary) fails alone, as a request finished with status ``error`` naming it; the others run."""
        now = engine.clock.now_ns()
        late = self.admission_ns
        while self._next is not None and (due := self.t0_ns + round(self._next.arrival_s * 1e9)) + late <= now:
            item, self._next = self._next, next(self._pending, None)
            self.num_submitted += 1
            try:
                request = engine.make_request(item.prompt_for(engine.tokenizer), item.params)
            except (TypeError, ValueError) as exc:
                total = f" of {len(self.workload)}" if self.workload else ""
                where = item.source or f"request {self.num_submitted}{total}"
                self.requests.append(engine.reject(item.prompt, item.params, f"{where}: {exc}"))
                continue
            if item.arrival_s or late:  # it arrived at its time, maybe during the step that just ended
                request.arrival_time = due / 1e9
            shown = item.shown if item.shown is not None else item.prompt
            if (item.shown is not None or item.chat) and isinstance(shown, str):
                request.prompt = shown  # reports show the user's message, not the chat template around it
            self.requests.append(request)
            engine.add_request(request)
        if not self.keep_outputs and len(self.requests) > KEEP_FINISHED + 2 * len(engine.requests):
            self.requests = [r for r in self.requests if not r.is_finished]

    def abort_unfinished(self, engine: EngineClient) -> None:
        """Abort the submitted requests that have not finished (not those another thread added to the same
        engine)."""
        for request in self.requests:
            if not request.is_finished:
                engine.abort(request.request_id)

    def outputs(self, engine: EngineClient) -> list[RequestOutput]:
        """One ``RequestOutput`` per submitted request, in workload order (partial while running)."""
        return [engine.output(r) for r in list(self.requests)]

    def texts(self, engine: EngineClient) -> dict[str, dict[str, str | None]]:
        """Prompt and output text per submitted request (a run keeps them in ``meta``, for saved runs and
        reports), each cut at ``MAX_TEXT`` characters."""
        texts = {}
        for request in list(self.requests):
            output = engine.decode(list(request.output_token_ids))
            texts[request.request_id] = {"prompt": request.prompt and request.prompt[:MAX_TEXT],
                                         "output": output[:MAX_TEXT]}
        return texts
