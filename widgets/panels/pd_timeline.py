"""A P/D run's request lanes in the report: one lane per request, its path as bars, from
``kvscope.telemetry.pd_lanes`` (``meta["pd"]``): queue at the router, prefill on its prefill instance, the wait
for a hand-over, the KV transfer (blocks, bytes, start, end), the queue on the decode instance and decode; the
hover names the instance of each bar.

``timeline_part`` is the request timeline's report part: for a P/D run these lanes above the decode
instance's own timeline (its queue segments coloured by reason), else the timeline as it is.
"""

from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import LayoutDOM
from bokeh.plotting import figure

from kvscope.telemetry.pd_lanes import LANE_STATES, request_segments

from ..theme import FULL_WIDTH, columns, empty_source
from .base import Panel
from .report_parts import ReportContext
from .timeline import lanes_figure

LANE_COLORS = dict(zip(LANE_STATES, ("#c7c7c7", "#ff7f0e", "#dbdb8d", "#9467bd", "#aec7e8", "#1f77b4")))
COLUMNS = ("lane", "left", "right", "state", "request", "instance", "label", "blocks", "bytes")


def pd_lanes_figure(meta: dict, t0_ns: int) -> figure | None:
    """The lanes of ``meta["pd"]`` (None: not a P/D run, or no request recorded its path)."""
    pd = meta.get("pd")
    lanes = request_segments(pd) if isinstance(pd, dict) else []
    rows = [{"lane": lane, "left": (s.start_ns - t0_ns) / 1e9, "right": (s.end_ns - t0_ns) / 1e9, "state": s.state,
             "request": s.request_id, "instance": s.instance, "label": s.label,
             "blocks": -1 if s.num_blocks is None else s.num_blocks,
             "bytes": -1 if s.num_bytes is None else s.num_bytes}
            for lane, segments in enumerate(lanes) for s in segments]
    if not rows:
        return None
    source = empty_source(*COLUMNS)
    source.data = columns(rows)
    title = f"P/D requests ({pd.get('layout')}): one lane per request, on the instance where each part ran"
    fig = lanes_figure(title, source, {state: (state, color) for state, color in LANE_COLORS.items()},
                       [("request", "@request"), ("", "@label"), ("from", "@left{0.0000} s"),
                        ("to", "@right{0.0000} s")],
                       width=FULL_WIDTH, height=min(700, 140 + 14 * len(lanes)), ncols=len(LANE_COLORS))
    fig.name = "pd-request-lanes"
    return fig


def timeline_part(panel: Panel, context: ReportContext) -> LayoutDOM:
    """The request timeline in the report: a P/D run's lanes above it (see the module docstring)."""
    run = context.run
    lanes = pd_lanes_figure(run.meta, run.t0_ns) if isinstance(run.meta.get("pd"), dict) else None
    return panel.model if lanes is None else column(lanes, panel.model)
