"""Speculative decoding, as it happens: what each step drafted, accepted and rejected, acceptance by
draft position over the steps, and the draft model's own KV pool.

``SpeculationPanel`` (one row of two plots under a line of running totals):

- *draft tokens per step*: accepted (green) stacked on rejected (red), so the bar's height is what
  was drafted; the line is how many requests had drafts;
- *acceptance by draft position*: one cell per step and draft position (1 = the first draft), coloured
  by the share of that step's drafts at that position that the target accepted. Acceptance stops at
  the first rejection, so the colour fades upwards; a row that stays red says k is too large.

``DraftPageMapPanel``: the page map of the draft model's pool (``SpecDecodeStats.draft_page_map``),
drawn like the target's, in the same colours per request. The target's page map marks the blocks that
held draft slots in the step (``page_map.PageMapPanel``). Both panels stay hidden until a record with
speculation arrives, so runs without it look as before.
"""

from __future__ import annotations

import html

from bokeh.layouts import column, row
from bokeh.models import ColorBar, Div, LinearColorMapper, Range1d
from bokeh.palettes import RdYlGn11

from kvscope.telemetry.records import PageEntry, StepRecord

from ..feed import Tick
from ..theme import (
    COUNT,
    FULL_WIDTH,
    add_hover,
    empty_source,
    format_axis,
    new_figure,
    stream_rows,
    style_legend,
)
from .base import Panel, PanelContext
from .page_map import PageMapPanel

ACCEPTED_COLOR, REJECTED_COLOR = "#2ca02c", "#d62728"
RATE_PALETTE = tuple(reversed(RdYlGn11))  # red (nothing accepted) .. green (everything)


class SpeculationPanel(Panel):
    name = "speculation"
    title = "Speculative decoding"

    @classmethod
    def create(cls, context: PanelContext) -> SpeculationPanel:
        return cls(context.rollover)

    def __init__(self, rollover: int | None) -> None:
        self.rollover = rollover
        self.k = 0  # draft positions shown (the run's num_speculative_tokens)
        self.totals = {"steps": 0, "drafts": 0, "drafted": 0, "accepted": 0}
        self.tokens = empty_source("step", "accepted", "rejected", "drafted", "requests")
        self.tokens.name = "spec-tokens"
        self.cells = empty_source("step", "position", "rate", "drafted", "accepted")
        self.cells.name = "spec-positions"

        fig = new_figure("Draft tokens per step", x_axis_label="step", y_axis_label="tokens")
        fig.vbar_stack(["accepted", "rejected"], x="step", width=0.9, source=self.tokens,
                       color=[ACCEPTED_COLOR, REJECTED_COLOR], legend_label=["accepted", "rejected"])
        fig.line("step", "requests", source=self.tokens, color="#555555", width=1.5,
                 legend_label="requests with drafts")
        add_hover(fig, [("step", "@step"), ("drafted", "@drafted"), ("accepted", "@accepted"),
                        ("rejected", "@rejected"), ("requests with drafts", "@requests")], mode="vline")
        format_axis(fig.yaxis[0], COUNT)
        style_legend(fig, ncols=3)
        self.tokens_figure = fig

        heat = new_figure("Acceptance by draft position", x_axis_label="step", y_axis_label="draft position",
                          y_range=Range1d(0.5, 1.5))
        mapper = LinearColorMapper(palette=RATE_PALETTE, low=0.0, high=1.0)
        heat.rect("step", "position", width=1, height=0.9, source=self.cells,
                  fill_color={"field": "rate", "transform": mapper}, line_color=None)
        heat.add_layout(ColorBar(color_mapper=mapper, width=8, title="accepted"), "right")
        format_axis(heat.yaxis[0], COUNT)  # draft positions 1..k
        add_hover(heat, [("step", "@step"), ("draft position", "@position"), ("drafted", "@drafted"),
                         ("accepted", "@accepted"), ("share accepted", "@rate{0%}")])
        self.positions_figure = heat

        self.div = Div(text=self._html(), width=FULL_WIDTH)
        self.model = column(self.div, row(fig, heat), visible=False)

    def _html(self) -> str:
        t = self.totals
        rate = f"{t['accepted'] / t['drafted']:.1%}" if t["drafted"] else "–"
        length = f"{1 + t['accepted'] / t['drafts']:.2f}" if t["drafts"] else "–"
        facts = [("acceptance rate", rate), ("mean acceptance length", length),
                 ("draft tokens", f"{t['drafted']:,d}"), ("accepted", f"{t['accepted']:,d}")]
        items = " · ".join(f"<b>{html.escape(k)}</b> {v}" for k, v in facts)
        return f"<div style='font-family:sans-serif;font-size:13px'><b>Speculative decoding</b> — {items}</div>"

    def update(self, tick: Tick) -> None:
        token_rows, cell_rows = [], []
        t = self.totals
        for record in tick.steps:
            spec = record.spec_decode
            if spec is None:
                continue
            if spec.num_spec_tokens > self.k:
                self.k = spec.num_spec_tokens
                self.positions_figure.y_range.update(start=0.5, end=self.k + 0.5)
            t["steps"] += 1
            t["drafts"] += spec.num_drafts
            t["drafted"] += spec.num_draft_tokens
            t["accepted"] += spec.num_accepted_tokens
            token_rows.append({"step": record.step, "accepted": spec.num_accepted_tokens,
                               "rejected": spec.num_rejected_tokens, "drafted": spec.num_draft_tokens,
                               "requests": spec.num_drafts})
            for i, (drafted, accepted) in enumerate(zip(spec.num_draft_tokens_per_pos,
                                                        spec.num_accepted_tokens_per_pos)):
                if drafted:
                    cell_rows.append({"step": record.step, "position": i + 1, "rate": accepted / drafted,
                                      "drafted": drafted, "accepted": accepted})
        if not token_rows:
            return
        self.model.visible = True
        stream_rows(self.tokens, token_rows, self.rollover)
        stream_rows(self.cells, cell_rows, self.rollover * max(self.k, 1) if self.rollover else None)
        self.div.text = self._html()


class DraftPageMapPanel(PageMapPanel):
    """The draft model's KV pool, block by block (see ``PageMapPanel``)."""

    name = "draft_page_map"
    title = "Draft model's KV page map"
    marks_drafts = False

    @classmethod
    def create(cls, context: PanelContext) -> DraftPageMapPanel:
        panel = cls()
        panel.model.visible = False
        return panel

    def pool_of(self, record: StepRecord) -> tuple[int, int] | None:
        spec = record.spec_decode
        if spec is None or not spec.draft_num_blocks:
            return None
        return spec.draft_num_blocks, record.kv.block_size

    def map_of(self, record: StepRecord) -> dict[int, PageEntry]:
        spec = record.spec_decode
        return spec.draft_page_map if spec is not None else {}

    def update(self, tick: Tick) -> None:
        super().update(tick)
        if self.entries:
            self.model.visible = True
