"""KPI tiles of a watched vLLM server or fleet, from ``meta["watch"]`` (see ``kvscope/watched/source.py``).

Exact (counters and gauges): running / waiting, KV cache usage, prompt and generation tokens/s (counter
deltas over the last few polls), prefix-cache hit rate and preemptions since the watch began. Estimated
(marked "≈", from histogram buckets): TTFT and ITL p50 / p99. The numbers live in ``source`` (one row)
and ``values``; everything put into the HTML is a number or passes ``html.escape``.
"""

from __future__ import annotations

import html
import math

from bokeh.models import ColumnDataSource, Div

from kvscope.watched.summary import WATCH_KPI_FIELDS, fleet_kpis

from ..feed import Tick
from ..theme import FULL_WIDTH
from .base import Panel, PanelContext

_STYLE = (  # the run KPIs' tiles (panels/kpi.py)
    "<style>.kvs-kpi{display:flex;flex-wrap:wrap;gap:6px;font-family:sans-serif}"
    ".kvs-kpi div{background:#f5f7fa;border-radius:6px;padding:4px 10px;min-width:110px}"
    ".kvs-kpi b{display:block;font-size:18px;color:#1f3b57}.kvs-kpi span{font-size:11px;color:#555}</style>"
)


class WatchKpiPanel(Panel):
    name = "watch_kpi"
    title = "KPIs (watched vLLM)"

    @classmethod
    def create(cls, context: PanelContext) -> WatchKpiPanel:
        return cls(context.meta)

    def __init__(self, meta: dict) -> None:
        self.meta = meta
        self.values: dict[str, float | int | None] = dict.fromkeys(WATCH_KPI_FIELDS)
        self.source = ColumnDataSource({k: [0] for k in WATCH_KPI_FIELDS})
        self.div = Div(text=self._html(), width=FULL_WIDTH)
        self.model = self.div
        self._seen = -1

    def update(self, tick: Tick) -> None:
        watch = self.meta.get("watch")
        if not isinstance(watch, dict):
            return
        n = len(watch.get("fleet", {}).get("t_ns", []))
        if n == self._seen and not tick.final:  # new numbers come with each poll
            return
        self._seen = n
        self.values = fleet_kpis(watch)
        self.source.data = {k: [math.nan if self.values[k] is None else self.values[k]] for k in WATCH_KPI_FIELDS}
        self.div.text = self._html()

    def _html(self) -> str:
        v = self.values

        def num(key: str, fmt: str = "{:,.0f}") -> str:
            return "–" if v[key] is None else fmt.format(v[key])

        def ms(key: str) -> str:
            return "–" if v[key] is None else f"≈{v[key] * 1e3:.1f} ms"

        tiles = [
            ("running / waiting", f"{num('running')} / {num('waiting')}"),
            ("KV cache usage", num("kv_usage", "{:.1%}")),
            ("prompt / generation tok/s", f"{num('prompt_tokens_per_s', '{:,.1f}')} / "
                                          f"{num('generation_tokens_per_s', '{:,.1f}')}"),
            ("prefix-cache hits", num("prefix_hit_rate", "{:.1%}")),
            ("preemptions", num("preemptions")),
            ("requests finished", num("finished")),
            ("TTFT p50 / p99 (est., buckets)", f"{ms('ttft_p50')} / {ms('ttft_p99')}"),
            ("ITL p50 / p99 (est., buckets)", f"{ms('itl_p50')} / {ms('itl_p99')}"),
            ("blocks cached / ever stored", f"{num('blocks_cached')} / {num('blocks_stored')}"),
        ]
        if v["kv_transfers"] is not None:  # a KV connector (NIXL): transfers and MB/s since the watch began
            tiles.append(("KV transfers / MB/s", f"{num('kv_transfers')} / {num('kv_transfer_mb_per_s', '{:,.1f}')}"))
        watch = self.meta.get("watch") if isinstance(self.meta.get("watch"), dict) else {}
        model = watch.get("model") or self.meta.get("model")
        if model:
            tiles.append(("model", html.escape(str(model))))
        lost = [name for name, s in watch.get("servers", {}).items() if s.get("state") != "ok"]
        if lost:
            tiles.append(("not answering", "<span style='color:#d62728'>" + html.escape(", ".join(lost)) + "</span>"))
        body = "".join(f"<div><b>{value}</b><span>{label}</span></div>" for label, value in tiles)
        return f'{_STYLE}<div class="kvs-kpi">{body}</div>'
