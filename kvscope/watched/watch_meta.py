"""A watch's ``meta["watch"]``: its lanes, and the derived parts (engines, totals, histograms, residency,
faults, lost, servers), rebuilt from a ``WatchSource`` at each tick and replaced whole (a reader on another
thread holds either the old part or the new one, never half of each).

Lanes: one row per poll per engine (and the fleet), bounded for a watch of weeks.

A lane is a dict of columns (``LANE_COLUMNS`` and ``t_ns``, the time appended last so a reader that sees
the time sees the whole row). At ``MAX_LANE_ROWS`` rows its older half is merged two rows into one
(counts added up, states and times from the later row), so a lane keeps the whole watch, at full
resolution for the latest quarter to half of it and coarser the older it gets, never more than
``MAX_LANE_ROWS`` rows. The merged lane is a new dict (``append_row`` returns it): a reader holding the
old one still sees a whole, consistent lane. A reader that follows a lane by row index (the dashboard)
then sees it shorter than what it read and carries on from the new end.
"""

from __future__ import annotations

import time
from typing import Any

from kvscope.watched.limits import MAX_LANE_ROWS

# per-interval lane columns (meta["watch"]["lanes"][engine]); None where not known (not connected)
LANE_COLUMNS = (
    "connected", "running", "waiting", "kv_usage", "prompt_tokens", "generation_tokens", "prefix_queries",
    "prefix_hits", "preemptions", "finished", "blocks_stored", "blocks_evicted", "blocks_resident",
    "kv_transfers", "kv_transfer_bytes", "kv_offload_bytes",  # KV connector metrics (None without one)
)
# columns that count what happened in the interval (added up when rows merge); the others are states
COUNT_COLUMNS = frozenset(("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits", "preemptions",
                           "finished", "blocks_stored", "blocks_evicted", "kv_transfers", "kv_transfer_bytes",
                           "kv_offload_bytes"))


def new_lane() -> dict[str, list]:
    return {"t_ns": [], **{c: [] for c in LANE_COLUMNS}}


def _merged(a: Any, b: Any, counts: bool) -> Any:
    if not counts or a is None:
        return b
    return a if b is None else a + b


def compacted(lane: dict[str, list], keep: int) -> dict[str, list]:
    """``lane`` with its rows before the last ``keep`` merged pairwise (a new dict)."""
    n = len(lane["t_ns"])
    old = max(n - keep, 0) // 2 * 2
    out: dict[str, list] = {}
    for name in (*LANE_COLUMNS, "t_ns"):
        col = lane.get(name, [None] * n)[:n]
        counts = name in COUNT_COLUMNS
        out[name] = [_merged(col[i], col[i + 1], counts) for i in range(0, old, 2)] + col[old:]
    return out


def append_row(lane: dict[str, list], row: dict[str, Any], t_ns: int, limit: int = MAX_LANE_ROWS) -> dict[str, list]:
    """Append ``row`` (at ``t_ns``) to ``lane``; returns the lane (a new, merged one when it was full)."""
    if len(lane["t_ns"]) >= limit:
        lane = compacted(lane, limit // 2)
    for name in LANE_COLUMNS:
        lane.setdefault(name, [None] * len(lane["t_ns"])).append(row[name])
    lane["t_ns"].append(t_ns)
    return lane


def residency_entry(src: Any, eng: Any, layout: bool, force: bool) -> dict[str, Any]:
    """The residency of ``eng`` (an ``EngineState`` of ``src``, a ``WatchSource``): counts always fresh; the
    tree's shape (which walks every cached block) rebuilt when the cache changed, but for a tree so big that
    walking it costs more than 10 ms, at most once a second, and at most a tenth of the time, unless ``force``
    (so a huge cache does not slow the watch down)."""
    res = eng.residency
    cached = src.residency_cache.get(eng.key)  # (version, layout, when, cost, tree)
    now = time.monotonic()
    stale = cached is None or cached[0] != res.version or (layout and not cached[1])
    if stale and (cached is None or force or cached[3] < 0.01 or now - cached[2] >= max(1.0, 10 * cached[3])
                  or (layout and not cached[1])):
        tree = res.tree(5, src.layout_rows if layout else None)
        cached = src.residency_cache[eng.key] = (res.version, layout, now, time.monotonic() - now, tree)
    return {**res.counts(), **cached[4]}


def describe(src: Any, *, layout: bool, force: bool) -> None:
    """Replace the derived parts of ``src.watch``."""
    w = src.watch
    engines, totals, hists, residency, transfer = {}, {}, {}, {}, {}
    for key, eng in src.engines.items():
        last = eng.last
        entry = eng.transfer_json()
        engines[key] = {
            "url": src.urls[eng.server], "server": src.names[eng.server], "engine": eng.label,
            "state": src.state_of(eng), "error": src.server_error[eng.server],
            "model": last.model_name if last else None, "block_size": eng.block_size,
            "num_gpu_blocks": eng.num_gpu_blocks, "events": eng.has_events, "plugin": bool(eng.plugin_totals),
            "kv_role": entry["role"] if entry else None, "config": eng.config,
        }
        totals[key] = eng.totals_json()
        hists[key] = eng.histograms_json()
        if eng.has_events:
            residency[key] = residency_entry(src, eng, layout, force)
        if entry is not None:
            transfer[key] = entry
    w["engines"], w["totals"], w["histograms"], w["residency"] = engines, totals, hists, residency
    # the server's scheduler and cache settings (the plugin's; plugin_config.py): the first engine's that has them
    w["config"] = next((e.config for e in src.engines.values() if e.config is not None), None)
    w["kv_transfer"] = transfer  # per engine with a KV connector: role, NIXL transfers, offloading (kv_transfer.py)
    with_events = [e for e in src.engines.values() if e.has_events]
    w["kv_blocks_stored"] = (src.fleet_hashes.num_distinct if len(with_events) > 1
                             else sum(e.residency.num_distinct for e in with_events)) if with_events else None
    w["faults"] = dict(src.faults)
    w["lost"] = [list(span) for span in src.lost]
    w["servers"] = {name: {"url": url, "state": state, "error": error} for name, url, state, error
                    in zip(src.names, src.urls, src.server_state, src.server_error)}
