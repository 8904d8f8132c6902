"""Request timeline: one lane per request, one bar per stretch of time in one state.

States: a queue segment per reason the request waited (queued, not yet scheduled), prefill (prompt
chunks, or a recompute after a preemption), decode (one token per step), preempted (evicted, waiting to be
recomputed). A request enters prefill when ``scheduled`` / ``resumed``, decode at the first step that
decodes it, preempted at ``preempted``, and its last bar ends at ``finished``.

Queue segments split the wait as ``kvscope.explain.waits`` does (the queue-reasons panel's totals are the
sums of these bars): from ``queued`` to the first step that starts after it, "step_in_progress"; from each
later step's start, that step's ``wait_reason`` ("unknown" where a step recorded none); and the admitting
step's own schedule, from its start to ``scheduled``, "step_in_progress" again. Records arrive at their end,
after the events inside them, so that last split is made when the admitting step's record comes.

Each state is its own renderer over the one source (a ``GroupFilter`` on ``state``), so the legend
below the plot names the states and a click on one hides its bars.

Bars stream in with ``rollover`` (oldest bars scroll out); the bar each unfinished request is in is
stretched to the newest step by ``patch`` each tick. Patch indices account for rolled-over rows.
"""

from __future__ import annotations

from bokeh.models import CDSView, ColumnDataSource, GroupFilter
from bokeh.plotting import figure

from kvscope.explain.waits import UNKNOWN
from kvscope.telemetry.records import (
    WAIT_MAX_NUM_SEQS,
    WAIT_NO_FREE_BLOCKS,
    WAIT_PREEMPTED,
    WAIT_STEP_IN_PROGRESS,
    WAIT_TOKEN_BUDGET,
    RequestEvent,
    StepRecord,
)

from ..feed import Tick
from ..theme import (
    AMOUNT,
    COUNT,
    FULL_WIDTH,
    STATE_COLORS,
    add_hover,
    columns,
    empty_source,
    format_axis,
    new_figure,
    style_legend,
)
from .base import Panel, PanelContext
from .wait_styles import QUEUE_COLORS, QUEUE_LABELS

COLUMNS = ("lane", "left", "right", "state", "request")
QUEUE_STATES = (WAIT_STEP_IN_PROGRESS, WAIT_TOKEN_BUDGET, WAIT_MAX_NUM_SEQS, WAIT_NO_FREE_BLOCKS, UNKNOWN)
# state -> (legend label, colour), in the legend's order
STATES = {
    **{s: (QUEUE_LABELS[s], QUEUE_COLORS[s]) for s in QUEUE_STATES},
    "prefill": ("prefill", STATE_COLORS["prefill"]),
    "decode": ("decode", STATE_COLORS["decode"]),
    "preempted": (QUEUE_LABELS[WAIT_PREEMPTED], STATE_COLORS["preempted"]),
}
EVENT_STATES = {
    "queued": WAIT_STEP_IN_PROGRESS, "scheduled": "prefill", "first_token": "decode", "resumed": "prefill",
    "preempted": "preempted",
}


def lanes_figure(title: str, source: ColumnDataSource, states: dict[str, tuple[str, str]],
                 tooltips: list[tuple[str, str]], *, width: int, height: int, ncols: int) -> figure:
    """A figure of request lanes over ``source`` (columns lane, left, right, state): one lane per request, top
    to bottom, seconds along; one bar renderer per state of ``states`` (state -> (legend label, colour)), each a
    ``GroupFilter`` on ``state``, so the legend names the states and a click on one hides its bars."""
    fig = new_figure(title, width=width, height=height, x_axis_label="seconds since start", y_axis_label="request")
    fig.y_range.flipped = True
    format_axis(fig.xaxis[0], AMOUNT)  # seconds: 0.00005 apart in a tiny run, 5 in a long one
    format_axis(fig.yaxis[0], COUNT)  # lanes
    bars = [fig.hbar(y="lane", left="left", right="right", height=0.8, color=color, source=source,
                     view=CDSView(filter=GroupFilter(column_name="state", group=state)), legend_label=label)
            for state, (label, color) in states.items()]
    add_hover(fig, tooltips, renderers=bars)
    style_legend(fig, ncols=ncols)
    return fig


class TimelinePanel(Panel):
    name = "timeline"
    title = "Requests"

    @classmethod
    def create(cls, context: PanelContext) -> TimelinePanel:
        return cls(context.rollover, context.meta)

    def __init__(self, rollover: int | None, meta: dict | None = None, width: int = FULL_WIDTH,
                 height: int = 260) -> None:
        self.rollover = rollover
        self.meta = meta if meta is not None else {}  # its "t0_ns", once known, is time zero
        self.source: ColumnDataSource = empty_source(*COLUMNS)
        self.source.name = "request-timeline-bars"  # names a test or a screenshot finds it by
        fig = lanes_figure(self.title + " (one lane per request)", self.source, STATES,
                           [("request", "@request"), ("state", "@state"), ("from", "@left{0.000} s"),
                            ("to", "@right{0.000} s")], width=width, height=height, ncols=4)
        fig.name = "request-timeline"
        self.figure = fig
        self.model = fig
        self.t0_ns: int | None = None
        self._lanes: dict[str, int] = {}  # unfinished requests -> lane
        self._open: dict[str, tuple[int, str]] = {}  # unfinished requests -> (row, state) of its open bar
        self._next_lane = 0
        self._rows_sent = 0  # rows streamed so far (including rolled-over ones)
        self._pending: list[dict] = []  # rows created this tick, streamed at its end
        self._patches: dict[int, float] = {}  # row -> new right edge, for rows already sent
        self._since: dict[str, int] = {}  # waiting (not after a preemption) -> queued at (ns)
        self._fresh: dict[str, int] = {}  # of those, the ones no step has given a reason yet
        self._reason: str | None = None  # the reason of the last step: every older waiting request's bar is in it
        # admitted, the admitting step's record not seen yet -> (its last queue bar's row, lane, step, t scheduled)
        self._admitted: dict[str, tuple[int, int, int, float]] = {}

    @property
    def num_active(self) -> int:
        return len(self._open)

    def _t(self, t_ns: int) -> float:
        if self.t0_ns is None:
            self.t0_ns = self.meta.get("t0_ns", t_ns)
        return (t_ns - self.t0_ns) / 1e9

    def _set_right(self, row: int, t: float) -> None:
        if row >= self._rows_sent:
            self._pending[row - self._rows_sent]["right"] = t
        else:
            self._patches[row] = t

    def _switch(self, rid: str, state: str | None, t: float) -> None:
        """Close ``rid``'s open bar at ``t`` and open one in ``state`` (None: the request ended)."""
        if rid in self._open:
            row, current = self._open.pop(rid)
            if current == state:
                self._open[rid] = (row, current)
                return
            self._set_right(row, t)
        if state is None:
            self._lanes.pop(rid, None)
            return
        if rid not in self._lanes:
            self._lanes[rid] = self._next_lane
            self._next_lane += 1
        self._open[rid] = (self._add_bar(self._lanes[rid], t, t, state, rid), state)

    def _add_bar(self, lane: int, left: float, right: float, state: str, rid: str) -> int:
        row = self._rows_sent + len(self._pending)
        self._pending.append({"lane": lane, "left": left, "right": right, "state": state, "request": rid})
        return row

    def _event(self, event: RequestEvent) -> None:
        t, rid = self._t(event.t_ns), event.request_id
        if event.kind == "queued":
            self._since[rid] = self._fresh[rid] = event.t_ns
        elif event.kind == "scheduled" and rid in self._since:
            del self._since[rid]
            self._fresh.pop(rid, None)
            row, state = self._open.get(rid, (-1, ""))
            if state in QUEUE_STATES and state != WAIT_STEP_IN_PROGRESS:
                self._admitted[rid] = (row, self._lanes[rid], event.step, t)
        if event.kind == "finished":
            self._since.pop(rid, None)
            self._fresh.pop(rid, None)
            self._switch(rid, None, t)
        elif event.kind in EVENT_STATES and (event.kind == "queued" or rid in self._open):
            self._switch(rid, EVENT_STATES[event.kind], t)

    def _queue_reasons(self, record: StepRecord, t: float) -> None:
        """A step started: the admitting step's schedule of requests it admitted is "step_in_progress"; every
        request still waiting since before the step's start waits, from there, for the step's reason."""
        for rid, (row, lane, step, t_scheduled) in list(self._admitted.items()):
            if step > record.step:
                continue
            del self._admitted[rid]
            if step == record.step and self.source_left(row) <= t < t_scheduled:
                self._set_right(row, t)
                self._add_bar(lane, t, t_scheduled, WAIT_STEP_IN_PROGRESS, rid)
        reason = record.wait_reason or UNKNOWN
        # only the requests whose bar changes: all older ones when the reason changed, else the fresh ones
        waiting = self._since if reason != self._reason else self._fresh
        self._reason = reason
        for rid in [r for r, since in waiting.items() if since <= record.t_start_ns]:
            self._fresh.pop(rid, None)
            if self._open.get(rid, (0, ""))[1] in QUEUE_STATES:
                self._switch(rid, reason, t)

    def _step(self, record: StepRecord) -> None:
        t = self._t(record.t_start_ns)
        if record.t_end_ns > record.t_start_ns or record.scheduled:  # a step, not a state record (as waits.py)
            self._queue_reasons(record, t)
        for item in record.scheduled:
            open_bar = self._open.get(item.request_id)
            if item.kind == "decode" and open_bar is not None and open_bar[1] != "decode":
                self._switch(item.request_id, "decode", max(t, self.source_left(open_bar[0])))

    def source_left(self, row: int) -> float:
        if row >= self._rows_sent:
            return self._pending[row - self._rows_sent]["left"]
        dropped = self._rows_sent - len(self.source.data["left"])
        return self.source.data["left"][row - dropped] if row >= dropped else 0.0

    def update(self, tick: Tick) -> None:
        for item in tick.ordered():
            if isinstance(item, StepRecord):
                self._step(item)
            else:
                self._event(item)
        if tick.steps:  # open bars reach the newest step
            now = self._t(tick.steps[-1].t_end_ns)
            for row, _state in self._open.values():
                self._set_right(row, now)
        self._flush()

    def _flush(self) -> None:
        dropped = self._rows_sent - len(self.source.data["right"])
        patches = [(row - dropped, t) for row, t in self._patches.items() if row >= dropped]
        if patches:
            self.source.patch({"right": patches})
        self._patches = {}
        if self._pending:
            rows = self._pending
            self.source.stream(columns(rows), rollover=self.rollover)
            self._rows_sent += len(rows)
            self._pending = []
