"""KPI tiles: throughput, queue, KV usage and latency percentiles, as one Bokeh ``Div``.

While the run goes on the tiles show the last step (running / waiting, KV blocks used, the step); once
it is over (the ``final`` tick) they show the run: the peaks of running / waiting and of KV blocks used,
the number of steps and the mean throughput, and their labels say so. The last step's values stay in
``values`` (``running``, ``waiting``, ``kv_usage``): a stopped run ends with everything freed. The
dashboard's status line carries no number of its own: the step shown is the step the plots show.

The numbers live in ``KpiPanel.source`` (one row, replaced each tick) so tests and reports can read
them; the ``Div`` shows them. Everything put into the HTML is a number or passes ``html.escape``.
"""

from __future__ import annotations

import html

from bokeh.models import ColumnDataSource, Div

from ..feed import Tick
from ..stats import LatencyStats
from ..theme import FULL_WIDTH
from .base import Panel, PanelContext

KPI_FIELDS = (
    "step", "tokens_per_s", "mean_tokens_per_s", "running", "waiting", "finished", "requests",
    "kv_usage", "preemptions", "prefix_hit_rate", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99",
    "steps", "peak_running", "peak_waiting", "peak_kv_usage",
)

# the engine's counters (vLLM's prefix_cache_hits / prefix_cache_queries): every lookup, a request looked up again
# after a preemption or while the pool was full counted each time; the prefix-cache panel counts first lookups
PREFIX_TILE = "prefix-cache hits (all lookups)"

_STYLE = (
    "<style>.kvs-kpi{display:flex;flex-wrap:wrap;gap:6px;font-family:sans-serif}"
    ".kvs-kpi div{background:#f5f7fa;border-radius:6px;padding:4px 10px;min-width:110px}"
    ".kvs-kpi b{display:block;font-size:18px;color:#1f3b57}.kvs-kpi span{font-size:11px;color:#555}</style>"
)


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.1f} ms"


class KpiPanel(Panel):
    name = "kpi"
    title = "KPIs"

    @classmethod
    def create(cls, context: PanelContext) -> KpiPanel:
        return cls(context.stats, context.meta)

    def __init__(self, stats: LatencyStats, meta: dict) -> None:
        self.stats = stats
        self.meta = meta
        self.values: dict[str, float | int | None] = dict.fromkeys(KPI_FIELDS)
        self._final = False
        self.source = ColumnDataSource({k: [0] for k in KPI_FIELDS})
        self.div = Div(text=self._html(), width=FULL_WIDTH)
        self.model = self.div

    def update(self, tick: Tick) -> None:
        s = self.stats
        v = self.values
        if tick.steps:
            self._peaks(tick)
            last = tick.steps[-1]
            v.update(
                step=last.step, running=last.num_running, waiting=last.num_waiting, kv_usage=last.kv.block_usage,
                prefix_hit_rate=(last.kv.prefix_cache_hits / last.kv.prefix_cache_queries
                                 if last.kv.prefix_cache_queries else None),
            )
        if not tick and not tick.final:
            return
        v.update(
            tokens_per_s=s.mean_tokens_per_s() if tick.final else s.tokens_per_s(),
            mean_tokens_per_s=s.mean_tokens_per_s(),
            finished=s.num_finished, requests=s.num_requests, preemptions=s.num_preemptions,
        )
        v["ttft_p50"], v["ttft_p99"] = s.percentiles("ttft", (50, 99))
        v["itl_p50"], v["itl_p99"] = s.percentiles("itl", (50, 99))
        self._final = tick.final  # running / waiting at a stop: the engine records the aborts (record_state)
        self.source.data = {k: [float("nan") if v[k] is None else v[k]] for k in KPI_FIELDS}
        self.div.text = self._html()

    def _peaks(self, tick: Tick) -> None:
        v = self.values
        v["steps"] = (v["steps"] or 0) + len(tick.steps)
        for key, values in (("peak_running", [r.num_running for r in tick.steps]),
                            ("peak_waiting", [r.num_waiting for r in tick.steps]),
                            ("peak_kv_usage", [r.kv.block_usage for r in tick.steps])):
            v[key] = max(values if v[key] is None else [v[key], *values])

    def _html(self) -> str:
        v = self.values

        def num(key: str, fmt: str = "{:,.0f}") -> str:
            return "–" if v[key] is None else fmt.format(v[key])

        if self._final:  # the run, not its last step (which has everything freed)
            queue = ("peak running / waiting", f"{num('peak_running')} / {num('peak_waiting')}")
            kv = ("peak KV blocks used", num("peak_kv_usage", "{:.1%}"))
            step = ("steps", num("steps"))
        else:
            queue = ("running / waiting", f"{num('running')} / {num('waiting')}")
            kv = ("KV blocks used", num("kv_usage", "{:.1%}"))
            step = ("step", num("step"))
        tiles = [
            ("output tokens/s (run mean)" if self._final else "output tokens/s", num("tokens_per_s", "{:,.1f}")),
            queue,
            ("finished / requests", f"{num('finished')} / {num('requests')}"),
            kv,
            ("TTFT p50 / p99", f"{_ms(v['ttft_p50'])} / {_ms(v['ttft_p99'])}"),
            ("ITL p50 / p99", f"{_ms(v['itl_p50'])} / {_ms(v['itl_p99'])}"),
            ("preemptions", num("preemptions")),
            (PREFIX_TILE, num("prefix_hit_rate", "{:.1%}")),
            step,
        ]
        model = self.meta.get("model")
        if model:
            tiles.append(("model", html.escape(str(model))))
        body = "".join(f"<div><b>{value}</b><span>{label}</span></div>" for label, value in tiles)
        return f'{_STYLE}<div class="kvs-kpi">{body}</div>'
