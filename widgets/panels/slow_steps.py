"""Slow steps and the profiler windows they opened (``--capture-slow``), live and in the report.

``SlowStepsPanel``: each step's time (grey) against what the run's own online step model expected from the steps
before it (dashed; ``kvscope.telemetry.step_baseline``, replayed over the records: the same verdicts as the
capture made online), every slow step marked in red with what set it apart (``kvscope.explain.slow``: GC pause,
new batch shape, long prefill chunk, block-table growth), and each capture window shaded over the steps it
profiled. A slow step that opened a window says which (``window 0: steps 31-33``), and so does the window, so a
reader goes from the spike to the steps whose kernels are in the trace (its ``profiler`` events; Perfetto
shows them under the engine's steps). Recomputed like ``PrefixMissesPanel``; shown for runs that armed
``--capture-slow`` (``meta["capture_slow"]``) once steps are judged, hidden otherwise (``kvscope explain RUN``
lists any run's slow steps).
"""

from __future__ import annotations

import html
from typing import Any

from bokeh.layouts import column
from bokeh.models import Div

from kvscope.explain.slow import slow_steps
from kvscope.telemetry.step_baseline import SlowRule, judge_steps

from ..feed import Tick
from ..theme import AMOUNT, FULL_WIDTH, add_hover, empty_source, format_axis, new_figure, style_legend
from .prefix_misses import PrefixMissesPanel

MAX_LINE_POINTS = 20_000  # the step-time line of a longer run is thinned (every slow step is still marked)


def capture_of(meta: dict) -> dict[str, Any] | None:
    """``meta["capture_slow"]`` if it is the object the capture writes (a loaded file may hold anything)."""
    capture = meta.get("capture_slow")
    return capture if isinstance(capture, dict) else None


def windows_of(capture: dict[str, Any] | None) -> list[tuple[int, int, int, int]]:
    """(index, trigger step, first step, last step) of each well-formed window."""
    out = []
    for w in (capture or {}).get("windows") or []:
        fields = [w.get(k) for k in ("index", "trigger_step", "first_step", "last_step")] if isinstance(w, dict) \
            else []
        if len(fields) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in fields):
            out.append((fields[0], fields[1], fields[2], fields[3]))
    return out


def rule_of(capture: dict[str, Any] | None) -> SlowRule:
    """The rule the capture judged by (the default one when there was no capture or it is unreadable)."""
    rule = (capture or {}).get("rule")
    try:
        return SlowRule(float(rule["ratio"]), float(rule["min_excess_ms"]) / 1e3, int(rule["warmup_steps"]))
    except (KeyError, TypeError, ValueError):
        return SlowRule()


class SlowStepsPanel(PrefixMissesPanel):
    name = "slow_steps"
    title = "Slow steps and their profiler windows"

    def build(self) -> None:
        self.line = empty_source("step", "ms")  # every timed step, the windows' own included
        self.expected = empty_source("step", "expected_ms")  # the judged steps
        self.marks = empty_source("step", "ms", "expected_ms", "ratio", "why", "window")
        self.boxes = empty_source("left", "right", "label")
        fig = new_figure(self.title, width=FULL_WIDTH, height=260, x_axis_label="step",
                         y_axis_label="step time (ms)")
        boxes = fig.quad(left="left", right="right", bottom=0, top=0, source=self.boxes, color="#ff7f0e",
                         alpha=0.25, line_alpha=0, legend_label="profiler window (--capture-slow)")
        self.box_glyph = boxes.glyph
        fig.line("step", "ms", source=self.line, color="#7f7f7f", legend_label="step time")
        fig.line("step", "expected_ms", source=self.expected, color="#1f77b4", line_dash="dashed",
                 legend_label="expected (the run's own model)")
        marks = fig.scatter("step", "ms", source=self.marks, size=8, color="#d62728", legend_label="slow step")
        format_axis(fig.yaxis[0], AMOUNT)
        style_legend(fig, ncols=4)
        add_hover(fig, [("step", "@step"), ("time", "@ms{0.00} ms"), ("expected", "@expected_ms{0.00} ms"),
                        ("ratio", "@ratio{0.0}x"), ("why", "@why"), ("window", "@window")], renderers=[marks])
        add_hover(fig, [("", "@label")], renderers=[boxes])
        self.figure = fig
        self.div = Div(text="", width=FULL_WIDTH)
        self.model = column(self.div, fig, visible=False)

    def changed(self, tick: Tick) -> bool:
        return bool(tick.steps)

    def refresh(self) -> None:
        capture = capture_of(self.meta)
        windows = windows_of(capture)
        rule = rule_of(capture)
        in_window = {s for _, _, first, last in windows for s in range(first, last + 1)}
        judged = judge_steps(self.records, rule, in_window)
        if capture is None or not judged:  # drawn for runs that armed the capture: a report's panels are fixed
            return
        expected = {step: e for step, (e, _) in judged.items()}
        slow = slow_steps(self.records, lambda r: expected.get(r.step, float("inf")), rule.ratio, rule.min_excess_s)
        opened = {trigger: f"window {i}: steps {first}-{last}" for i, trigger, first, last in windows}
        timed = [r for r in self.records if r.scheduled and r.duration_ns > 0]
        stride = max(1, -(-len(timed) // MAX_LINE_POINTS))
        self.line.data = {"step": [r.step for r in timed[::stride]],
                          "ms": [r.duration_ns / 1e6 for r in timed[::stride]]}
        steps = sorted(expected)[::stride]
        self.expected.data = {"step": steps, "expected_ms": [expected[s] * 1e3 for s in steps]}
        self.marks.data = {
            "step": [s.step for s in slow],
            "ms": [s.duration_s * 1e3 for s in slow],
            "expected_ms": [s.expected_s * 1e3 for s in slow],
            "ratio": [s.ratio for s in slow],
            "why": [", ".join(s.causes) or f"{s.phase} {s.phase_ratio:.1f}x its median" for s in slow],
            "window": [opened.get(s.step, "none opened") for s in slow],
        }
        self.boxes.data = {"left": [first - 0.5 for _, _, first, _ in windows],
                           "right": [last + 0.5 for _, _, _, last in windows],
                           "label": [f"window {i}: steps {first}-{last}, opened by slow step {trigger}"
                                     for i, trigger, first, last in windows]}
        self.box_glyph.top = max((r.duration_ns / 1e6 for r in timed), default=1.0) * 1.05
        self.div.text = self._summary(len(slow), len(judged), rule, capture, windows)
        self.model.visible = True

    @staticmethod
    def _summary(num_slow: int, num_judged: int, rule: SlowRule, capture: dict | None,
                 windows: list[tuple[int, int, int, int]]) -> str:
        facts = [("slow", f"{num_slow} of {num_judged} steps at least {rule.ratio:g}x the run's own step model "
                          f"and {rule.min_excess_s * 1e3:g} ms over it")]
        if capture is not None:
            listed = ", ".join(f"{i}: steps {first}-{last} (after step {trigger})"
                               for i, trigger, first, last in windows) or "none"
            facts.append(("profiler windows", f"{len(windows)} of at most {capture.get('max_windows', '?')}: {listed}"))
            if windows:
                where = capture.get("trace")
                facts.append(("kernels", f"in the trace {where}" if isinstance(where, str) and where
                              else "in the run's trace (profiler events)"))
        items = " · ".join(f"<b>{html.escape(k)}</b> {html.escape(v)}" for k, v in facts)
        return f"<div style='font-family:sans-serif;font-size:13px'><b>Slow steps</b> — {items}</div>"
