"""A search's HTML page: the Pareto front of goodput per dollar (per GPU where no cost is known) against the
tightest SLO term's percentile at the goodput rate, every configuration a point (hover: its settings, goodput,
percentiles and what broke first), the best one starred, and the table below. One file, BokehJS inlined, so it
opens offline.

A configuration is on the front when no other has at least its goodput per dollar at no more latency, with one
of the two strictly better.

Links (``links``: a point's index -> the path of its simulated run's report, ``kvscope.search.reports``): a
linked point opens its report on a click (``TapTool`` + ``OpenURL``), and its table row has an ``<a href>``;
paths are made relative to the page's folder, so the page and its ``.runs`` folder move together. Points without
a report are drawn apart (not clickable) and ``note`` says why they have none.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

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


def plotted(outcomes: Sequence[Outcome], slo: SLO) -> tuple[list[Outcome], list[tuple[float, float]], list[int], bool]:
    """What the page draws: the configurations with a goodput (and the tightest term's percentile), each one's
    point (latency, value), the front's indices among them, and whether the value is per dollar (else per GPU)."""
    tight = slo.tightest()
    ok = [o for o in outcomes if o.error is None and o.goodput > 0 and tight.name in o.percentiles]
    costed = all(o.per_dollar_hour is not None for o in ok) and bool(ok)

    def value(o: Outcome) -> float:
        return float(o.per_dollar_hour) if costed and o.per_dollar_hour is not None else o.per_gpu

    xy = [(o.percentiles[tight.name], value(o)) for o in ok]
    return ok, xy, pareto(xy), costed


def front(outcomes: Sequence[Outcome], slo: SLO) -> list[Outcome]:
    """The configurations on the page's Pareto front."""
    ok, _, on, _ = plotted(outcomes, slo)
    return [ok[i] for i in on]


def relative_path(target: str | os.PathLike, page: str | os.PathLike) -> str:
    """``target``'s path relative to ``page``'s folder, with forward slashes (not yet a URL: ``quote`` it for an
    ``href``; Bokeh's ``OpenURL`` encodes it itself, with ``encodeURI``)."""
    return Path(os.path.relpath(os.path.abspath(target), os.path.dirname(os.path.abspath(page)))).as_posix()


def save_page(path: str | Path, outcomes: Sequence[Outcome], names: Sequence[str], slo: SLO,
              chosen: Outcome | None, model: str, title: str = "kvscope search",
              links: Mapping[int, str | os.PathLike] | None = None, note: str | None = None,
              unlinked: Mapping[int, str] | None = None) -> Path:
    """The page at ``path`` (atomically). ``links``: point index -> its run report; ``note``: which points have
    one, in words; ``unlinked``: point index -> why a report meant for it was not written (shown in its row)."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, Div, HoverTool, OpenURL, TapTool
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    tight = slo.tightest()
    ok, xy, on_front, costed = plotted(outcomes, slo)
    value_name = "requests per USD" if costed else "goodput per GPU (req/s)"
    rel = {i: relative_path(target, path) for i, target in (links or {}).items()}
    data = {"x": [p[0] for p in xy], "y": [p[1] for p in xy], "label": [o.point.label() for o in ok],
            "goodput": [o.goodput for o in ok], "gpus": [o.num_gpus for o in ok],
            "broke": [o.broke or "-" for o in ok],
            "pct": [", ".join(f"{k}={v:.4g}s" for k, v in o.percentiles.items()) for o in ok],
            "front": ["yes" if i in on_front else "" for i in range(len(ok))],
            "url": [rel.get(o.point.index, "") for o in ok],
            "report": ["click to open" if o.point.index in rel else "none" for o in ok]}
    fig = figure(width=900, height=480, title=f"{value_name} vs {tight.name} at the goodput rate (SLO {slo})",
                 x_axis_label=f"{tight.name} at the goodput rate (s); SLO {tight.seconds:g} s", y_axis_label=value_name,
                 tools="pan,wheel_zoom,box_zoom,reset,save")
    linked = [i for i in range(len(ok)) if data["url"][i]]
    plain = [i for i in range(len(ok)) if not data["url"][i]]
    dots = []

    def draw(keep: list[int], color: str, legend: str) -> None:
        if keep:
            src = ColumnDataSource({k: [v[i] for i in keep] for k, v in data.items()})
            dots.append(fig.scatter("x", "y", source=src, size=9, alpha=0.8, color=color, legend_label=legend))

    draw(plain, "#4C72B0", "configurations")
    line = ColumnDataSource({"x": [xy[i][0] for i in on_front], "y": [xy[i][1] for i in on_front]})
    fig.line("x", "y", source=line, color="#DD8452", line_width=2, legend_label="Pareto front")
    fig.scatter("x", "y", source=line, size=13, color="#DD8452")
    if chosen is not None and chosen in ok:
        i = ok.index(chosen)
        fig.scatter([xy[i][0]], [xy[i][1]], marker="star", size=22, color="#C44E52", legend_label="best")
    draw(linked, "#2CA02C", "configurations with a run report (click)")  # on top of the front's markers
    fig.add_tools(HoverTool(renderers=dots, tooltips=[("config", "@label"), ("goodput", "@goodput{0.000} req/s"),
                                                      ("GPUs", "@gpus"), ("at goodput", "@pct"),
                                                      ("broke first", "@broke"), ("on the front", "@front"),
                                                      ("run report", "@report")]))
    if linked:  # the linked points' renderer only: a click elsewhere opens nothing
        fig.add_tools(TapTool(renderers=[dots[-1]], callback=OpenURL(url="@url")))
    fig.legend.location = "bottom_right"  # the best is high on the value axis: the legend stays off it
    head = [html.escape(c) for c in [*columns(names, slo), "run report"]]
    ordered = sorted(outcomes, key=lambda o: o.point.index)  # rows()'s order
    cells = [f"<a href=\"{html.escape(quote(rel[o.point.index]))}\">{html.escape(Path(rel[o.point.index]).name)}</a>"
             if o.point.index in rel else html.escape(f"not written: {(unlinked or {})[o.point.index]}")
             if o.point.index in (unlinked or {}) else "-" for o in ordered]
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + f"<td>{cell}</td></tr>"
                   for r, cell in zip(rows(outcomes, slo, chosen), cells))
    table = ("<table border=1 cellpadding=3 style='border-collapse:collapse;font:12px monospace'><tr>"
             + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{body}</table>")
    best = html.escape(serve_line(model, chosen)) if chosen is not None else "no configuration met the SLO"
    intro = Div(text=f"<h2>{html.escape(title)}</h2><p>{len(outcomes)} configurations of {html.escape(model)}, "
                     f"SLO {html.escape(str(slo))} met by at least {slo.fraction:.0%} of requests (goodput: the "
                     f"highest rate at which it holds).</p><p>Best:</p><pre>{best}</pre>"
                     f"<p>Run reports: {html.escape(note or 'none written (points are not linked)')}. "
                     f"{len(rel)} of {len(ok)} plotted configurations link to one (green points: click; "
                     "the table's last column).</p>", width=900)
    doc = column(intro, fig, Div(text=table, width=1200))
    text = file_html(doc, resources=INLINE, title=title)
    return atomic_write(Path(path), lambda f: f.write(text))
