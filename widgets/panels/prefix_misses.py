"""Prefix-cache misses by cause (``kvscope.explain``), live and in the report.

``PrefixMissesPanel``: one horizontal bar per kind of prompt token over the requests looked up so far: hit,
missed because the blocks were evicted, in flight, cache off or out of a sliding window, and not reusable (no
earlier prompt had them), with a line above naming the token where most requests diverged from an earlier one.

The panel keeps the run's records and events and recomputes the rows (``kvscope.explain.prefix``) at most once
every ``REFRESH_S`` seconds of wall time while a run goes on (less often when a recomputation takes more than a
tenth of that), and once at its end; it stays hidden while no request has its prompt recorded (a watched vLLM's
run has none).
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from bokeh.layouts import column
from bokeh.models import Div, FactorRange, LayoutDOM
from bokeh.plotting import figure

from kvscope.explain.prefix import MISS_CAUSES, prefix_misses
from kvscope.explain.report import row_dicts, top_divergences, totals
from kvscope.telemetry.records import RequestEvent, StepRecord

from ..feed import Tick
from ..theme import COUNT, FULL_WIDTH, add_hover, empty_source, format_axis, new_figure
from .base import Panel, PanelContext
from .report_parts import ReportContext

REFRESH_S = 2.0
KINDS = ("hit", *MISS_CAUSES, "not reusable")
COLORS = {
    "hit": "#2ca02c",
    "evicted": "#d62728",
    "in_flight": "#ff7f0e",
    "cache_off": "#7f7f7f",
    "window": "#9467bd",
    "not reusable": "#c7c7c7",
}


class PrefixMissesPanel(Panel):
    name = "prefix_misses"
    title = "Prefix-cache misses by cause"

    @classmethod
    def create(cls, context: PanelContext) -> PrefixMissesPanel:
        return cls(context.meta)

    def __init__(self, meta: dict) -> None:
        self.meta = meta
        self.records: list[StepRecord] = []
        self.events: list[RequestEvent] = []
        self.computed_at = 0.0
        self.wait_s = REFRESH_S
        self.dirty = False
        self.build()

    def build(self) -> None:
        self.build_bars("kind", KINDS, "tokens", ("kind", "tokens", "requests", "share", "color"), height=230,
                        x_axis_label="prompt tokens (first lookups)", axis=COUNT,
                        tooltips=[("tokens", "@tokens"), ("requests", "@requests"),
                                  ("share of prompt tokens", "@share{0%}")])

    def build_bars(self, y: str, factors: Sequence[str], x: str, source_columns: Sequence[str], *, height: int,
                   x_axis_label: str, axis: str, tooltips: list[tuple[str, str]]) -> figure:
        """The panel's figure: one horizontal bar per factor of ``y`` (top to bottom), ``x`` long, coloured by
        the source's ``color``, under a line of text (``div``); hidden until something is drawn."""
        self.source = empty_source(*source_columns)
        fig = new_figure(self.title, width=FULL_WIDTH, height=height, y_range=FactorRange(*reversed(factors)),
                         x_axis_label=x_axis_label)
        fig.hbar(y=y, right=x, height=0.7, source=self.source, color="color")
        format_axis(fig.xaxis[0], axis)
        add_hover(fig, tooltips)
        self.figure = fig
        self.div = Div(text="", width=FULL_WIDTH)
        self.model = column(self.div, fig, visible=False)
        return fig

    def update(self, tick: Tick) -> None:
        self.records.extend(tick.steps)
        self.events.extend(tick.events)
        self.dirty = self.dirty or self.changed(tick)
        now = time.monotonic()
        if self.dirty and (tick.final or now - self.computed_at >= self.wait_s):
            self.dirty = False
            self.refresh()
            self.computed_at = time.monotonic()
            # at most a tenth of the dashboard thread's time: a long run's recomputation comes less often
            self.wait_s = max(REFRESH_S, 10 * (self.computed_at - now))

    def changed(self, tick: Tick) -> bool:
        """Whether the tick can change what is drawn (a request was looked up)."""
        return any(e.kind == "scheduled" for e in tick.events)

    def refresh(self) -> None:
        if "block_size" not in self.meta or not any(
            e.kind == "queued" and e.prompt_token_ids is not None for e in self.events
        ):
            return
        try:
            rows = prefix_misses(self.records, self.events, self.meta)
        except ValueError:  # some requests came without their prompts: nothing to explain
            return
        if not rows:
            return
        t = totals(rows)
        prompt = max(t["prompt_tokens"], 1)
        tokens = {
            "hit": t["tokens_hit"],
            **t["tokens_missed_by_cause"],
            "not reusable": t["prompt_tokens"] - t["tokens_reusable"],
        }
        requests = {
            "hit": sum(1 for r in rows if r.num_cached_tokens),
            **t["requests_by_cause"],
            "not reusable": sum(1 for r in rows if r.num_prompt_tokens > r.num_reusable_tokens),
        }
        self.source.data = {
            "kind": list(KINDS),
            "tokens": [tokens[k] for k in KINDS],
            "requests": [requests[k] for k in KINDS],
            "share": [tokens[k] / prompt for k in KINDS],
            "color": [COLORS[k] for k in KINDS],
        }
        self.div.text = self._html(t, top_divergences(row_dicts(rows), 1))
        self.model.visible = True

    @staticmethod
    def _html(t: dict, top: list[dict]) -> str:
        rate = t["tokens_hit"] / t["prompt_tokens"] if t["prompt_tokens"] else 0.0
        facts = [
            ("hit at first lookup", f"{rate:.1%} of prompt tokens (the tile's all-lookups rate also counts a "
                                    "request looked up again after a preemption)"),
            ("reusable", f"{t['tokens_reusable']:,d}"),
            ("missed", f"{t['tokens_missed']:,d}"),
        ]
        if top:
            d = top[0]
            facts.append(
                ("most requests diverge at token", f"{d['diverged_at']} ({d['num_requests']} requests)")
            )
        return facts_html("Prefix cache", facts)


def facts_html(title: str, facts: list[tuple[str, str]]) -> str:
    """The line above a bar panel: its title, then each fact's name in bold and its value."""
    items = " · ".join(f"<b>{html.escape(k)}</b> {html.escape(v)}" for k, v in facts)
    return f"<div style='font-family:sans-serif;font-size:13px'><b>{html.escape(title)}</b> — {items}</div>"


def if_drawn(panel: Panel, context: ReportContext) -> LayoutDOM | None:
    """The report part of a panel that stays hidden until it has something to draw: left out if it has not."""
    return panel.model if panel.model.visible else None
