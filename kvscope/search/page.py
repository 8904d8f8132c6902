"""A search's HTML page: the Pareto front of goodput per dollar (per GPU where no cost is known) against the
tightest SLO term's percentile at the goodput rate, every configuration a point (hover: its settings, goodput,
percentiles and what broke first), the best one starred, and the table below. One file, BokehJS inlined, so it
opens offline.

A configuration is on the front when no other has at least its goodput per dollar at no more latency, with one
of the two strictly better.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from kvscope.search.goodput import Outcome
from kvscope.search.slo import SLO
from kvscope.search.table import columns, rows, serve_line
from kvscope.utils.files import atomic_write


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points ``(latency, value)`` on the front (lower latency, higher value), by latency."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, top = [], float("-inf")
    for i in order:
        if points[i][1] > top:
            front.append(i)
            top = points[i][1]
    return front


def save_page(path: str | Path, outcomes: Sequence[Outcome], names: Sequence[str], slo: SLO,
              chosen: Outcome | None, model: str, title: str = "kvscope search") -> Path:
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, Div, HoverTool
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    tight = slo.tightest()
    ok = [o for o in outcomes if o.error is None and o.goodput > 0 and tight.name in o.percentiles]
    costed = all(o.per_dollar_hour is not None for o in ok) and bool(ok)
    value_name = "requests per USD" if costed else "goodput per GPU (req/s)"

    def value(o: Outcome) -> float:
        return float(o.per_dollar_hour) if costed and o.per_dollar_hour is not None else o.per_gpu

    xy = [(o.percentiles[tight.name], value(o)) for o in ok]
    front = pareto(xy)
    data = {"x": [p[0] for p in xy], "y": [p[1] for p in xy], "label": [o.point.label() for o in ok],
            "goodput": [o.goodput for o in ok], "gpus": [o.num_gpus for o in ok],
            "broke": [o.broke or "-" for o in ok],
            "pct": [", ".join(f"{k}={v:.4g}s" for k, v in o.percentiles.items()) for o in ok],
            "front": ["yes" if i in front else "" for i in range(len(ok))]}
    fig = figure(width=900, height=480, title=f"{value_name} vs {tight.name} at the goodput rate (SLO {slo})",
                 x_axis_label=f"{tight.name} at the goodput rate (s); SLO {tight.seconds:g} s", y_axis_label=value_name,
                 tools="pan,wheel_zoom,box_zoom,reset,save")
    src = ColumnDataSource(data)
    dots = fig.scatter("x", "y", source=src, size=9, alpha=0.6, color="#4C72B0", legend_label="configurations")
    line = ColumnDataSource({"x": [xy[i][0] for i in front], "y": [xy[i][1] for i in front]})
    fig.line("x", "y", source=line, color="#DD8452", line_width=2, legend_label="Pareto front")
    fig.scatter("x", "y", source=line, size=11, color="#DD8452")
    if chosen is not None and chosen in ok:
        i = ok.index(chosen)
        fig.scatter([xy[i][0]], [xy[i][1]], marker="star", size=22, color="#C44E52", legend_label="best")
    fig.add_tools(HoverTool(renderers=[dots], tooltips=[("config", "@label"), ("goodput", "@goodput{0.000} req/s"),
                                                        ("GPUs", "@gpus"), ("at goodput", "@pct"),
                                                        ("broke first", "@broke"), ("on the front", "@front")]))
    fig.legend.location = "top_right"
    head = [html.escape(c) for c in columns(names, slo)]
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>"
                   for r in rows(outcomes, slo, chosen))
    table = ("<table border=1 cellpadding=3 style='border-collapse:collapse;font:12px monospace'><tr>"
             + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{body}</table>")
    best = html.escape(serve_line(model, chosen)) if chosen is not None else "no configuration met the SLO"
    intro = Div(text=f"<h2>{html.escape(title)}</h2><p>{len(outcomes)} configurations of {html.escape(model)}, "
                     f"SLO {html.escape(str(slo))} met by at least {slo.fraction:.0%} of requests (goodput: the "
                     f"highest rate at which it holds).</p><p>Best:</p><pre>{best}</pre>", width=900)
    doc = column(intro, fig, Div(text=table, width=1200))
    text = file_html(doc, resources=INLINE, title=title)
    return atomic_write(Path(path), lambda f: f.write(text))
