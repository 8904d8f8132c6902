"""``check_watch``: a watch description read from a file (``meta["watch"]``) checked field by field before
anything reads it, so a crafted file is refused in one ``ValueError`` instead of failing deep inside a panel
or a report, and no size derived from a file value (a hot prefix's depth, a block size, a layout's rows) is
beyond what a real watch can write. Standard library only."""

from __future__ import annotations

import math
from typing import Any

MAX_DEPTH = 1 << 32  # blocks before a block in its sequence
MAX_BLOCK_SIZE = 1 << 16  # tokens per block (limits.py)
MAX_NUM_BLOCKS = 1 << 32
MAX_LAYOUT_ROWS = 1 << 20  # blocks drawn in one residency icicle
MAX_MEDIA = 9  # media counted apart per engine, and "other" (limits.py)
ROLES = ("kv_producer", "kv_consumer", "kv_both")  # vLLM's kv_role (kv_transfer.py)
_RES_COUNTS = ("kv_blocks_stored", "kv_blocks_resident", "kv_block_stores", "kv_blocks_evicted",
               "kv_blocks_restored", "kv_blocks_cleared", "kv_chains", "kv_shared_blocks")
_LAYOUT_INTS = ("x0", "x1", "y0", "y1", "chains", "stored_ns")


def _is_int(x: Any, low: int = 0, high: int = 2**63 - 1) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and low <= x <= high


def _is_num(x: Any, none: bool = True) -> bool:
    return (x is None and none) or (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x))


def _objects(watch: dict, key: str) -> dict:
    value = watch.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"watch.{key} is not an object of objects")
    return value


def _columns(lane: Any, where: str) -> None:
    if not isinstance(lane, dict) or not isinstance(lane.get("t_ns"), list):
        raise ValueError(f"{where} is not a lane (columns with t_ns)")
    if not all(_is_int(t, -(2**63)) for t in lane["t_ns"]):
        raise ValueError(f"{where}: t_ns holds a value that is no integer")
    for name, values in lane.items():
        if not isinstance(values, list) or len(values) < len(lane["t_ns"]) or not all(
                isinstance(v, bool) or _is_num(v) for v in values):
            raise ValueError(f"{where}.{name} is not a column of numbers as long as t_ns")


def _engine(name: str, e: dict) -> None:
    for key in ("block_size", "num_gpu_blocks"):
        top = MAX_BLOCK_SIZE if key == "block_size" else MAX_NUM_BLOCKS
        if e.get(key) is not None and not _is_int(e[key], 1, top):
            raise ValueError(f"watch.engines[{name!r}].{key} is not a whole number from 1 to {top:,}")
    if e.get("kv_role") not in (None, *ROLES):
        raise ValueError(f"watch.engines[{name!r}].kv_role is not one of {', '.join(ROLES)}")
    for key in ("url", "server", "engine", "state", "error", "model"):
        if e.get(key) is not None and not isinstance(e[key], str):
            raise ValueError(f"watch.engines[{name!r}].{key} is not text")
    _config(f"watch.engines[{name!r}].config", e.get("config"))


def _config(where: str, c: Any) -> None:
    """A server's settings (``plugin_config.py``): an object of plain values (or null)."""
    if c is not None and (not isinstance(c, dict) or len(c) > 64 or not all(
            isinstance(k, str) and (v is None or isinstance(v, bool) or _is_num(v) or
                                    (isinstance(v, str) and len(v) <= 64)) for k, v in c.items())):
        raise ValueError(f"{where} is not an object of settings (numbers, true/false, short text)")


def _totals(name: str, t: dict) -> None:
    for key, value in t.items():
        inner = value.values() if isinstance(value, dict) else [value]
        if not all(_is_int(v) or (_is_num(v, none=False) and v >= 0) for v in inner):
            raise ValueError(f"watch.totals[{name!r}][{key!r}] holds a value that is no count")


def _histogram(where: str, h: Any) -> None:
    les, counts = (h.get("le"), h.get("counts")) if isinstance(h, dict) else (None, None)
    if not isinstance(les, list) or not isinstance(counts, list) or len(les) != len(counts) or not all(
            (le == "+Inf" or _is_num(le, none=False)) and _is_num(c, none=False) for le, c in zip(les, counts)) \
            or not all(_is_num(h.get(k, 0), none=False) for k in ("sum", "count")):
        raise ValueError(f"{where} is not a histogram")


def _residency(name: str, res: dict) -> None:
    where = f"watch.residency[{name!r}]"
    for key in _RES_COUNTS:
        if res.get(key) is not None and not _is_int(res[key]):
            raise ValueError(f"{where}.{key} is not a count")
    media = res.get("kv_blocks_by_medium", {})
    if not isinstance(media, dict) or len(media) > MAX_MEDIA or not all(
            isinstance(m, str) and len(m) <= 32 and _is_int(n) for m, n in media.items()):
        raise ValueError(f"{where}.kv_blocks_by_medium is not an object of counts by medium")
    if res.get("kv_block_size") is not None and not _is_int(res["kv_block_size"], 1, MAX_BLOCK_SIZE):
        raise ValueError(f"{where}.kv_block_size is not a whole number from 1 to {MAX_BLOCK_SIZE:,}")
    hot = res.get("hot", [])
    if not isinstance(hot, list) or not all(
            isinstance(h, list) and len(h) == 3 and isinstance(h[0], str) and _is_int(h[1])
            and _is_int(h[2], 0, MAX_DEPTH) for h in hot):
        raise ValueError(f"{where}.hot is not a list of [hash, chains, depth]")
    layout = res.get("layout")
    if layout is not None:
        cols = (*_LAYOUT_INTS, "key", "restored")
        if not isinstance(layout, dict) or not all(isinstance(layout.get(c), list) for c in cols) \
                or len({len(layout[c]) for c in cols}) != 1 or len(layout["key"]) > MAX_LAYOUT_ROWS \
                or not all(_is_int(v, -(2**63)) for c in _LAYOUT_INTS for v in layout[c]) \
                or not all(isinstance(k, str) for k in layout["key"]) \
                or not all(isinstance(r, bool) for r in layout["restored"]) \
                or any(abs(v) > MAX_DEPTH for c in ("x0", "x1", "y0", "y1") for v in layout[c]):
            raise ValueError(f"{where}.layout is not an icicle layout")


def _kv_transfer(name: str, e: dict) -> None:
    """One engine's KV-transfer entry (``kv_transfer.engine_entry``)."""
    where = f"watch.kv_transfer[{name!r}]"
    if e.get("role") not in (None, *ROLES) or not isinstance(e.get("role_from", ""), str):
        raise ValueError(f"{where}.role is not one of {', '.join(ROLES)}")
    if not isinstance(e.get("connectors", []), list) or not all(isinstance(c, str) for c in e.get("connectors", [])):
        raise ValueError(f"{where}.connectors is not a list of names")
    for key in ("counts", "kv_fetch"):
        part = e.get(key, {})
        if not isinstance(part, dict) or not all(_is_int(v) for v in part.values()):
            raise ValueError(f"{where}.{key} is not an object of counts")
    seconds = e.get("seconds", {})
    if not isinstance(seconds, dict) or not all(_is_num(v, none=False) and v >= 0 for v in seconds.values()):
        raise ValueError(f"{where}.seconds is not an object of durations")
    hists = e.get("histograms", {})
    if not isinstance(hists, dict):
        raise ValueError(f"{where}.histograms is not an object")
    for short, h in hists.items():
        _histogram(f"{where}.histograms[{short!r}]", h)
    offload = e.get("offload", {})
    if not isinstance(offload, dict) or not all(
            isinstance(o, dict) and _is_int(o.get("bytes", 0)) and _is_int(o.get("transfers", 0))
            and _is_num(o.get("seconds", 0), none=False) and o.get("seconds", 0) >= 0 for o in offload.values()):
        raise ValueError(f"{where}.offload is not an object of {{bytes, seconds, transfers}} by transfer_type")


def check_watch(watch: Any) -> None:
    """``ValueError`` unless ``watch`` has the shape and the value ranges the panels and reports read (a
    file may hold anything)."""
    if not isinstance(watch, dict):
        raise ValueError("watch is not an object")
    for key in ("lanes", "servers"):
        _objects(watch, key)
    if not _is_num(watch.get("interval_s", 0.5), none=False) or not watch.get("interval_s", 0.5) > 0 \
            or not _is_int(watch.get("t0_ns", 0), -(2**63)):
        raise ValueError("watch.interval_s / t0_ns are not numbers")
    for name, lane in watch.get("lanes", {}).items():
        _columns(lane, f"watch.lanes[{name!r}]")
    if "fleet" in watch:
        _columns(watch["fleet"], "watch.fleet")
    for name, e in _objects(watch, "engines").items():
        _engine(name, e)
    for name, t in _objects(watch, "totals").items():
        _totals(name, t)
    for name, hists in _objects(watch, "histograms").items():
        for short, h in hists.items():
            _histogram(f"watch.histograms[{name!r}][{short!r}]", h)
    for name, res in _objects(watch, "residency").items():
        _residency(name, res)
    for name, entry in _objects(watch, "kv_transfer").items():
        _kv_transfer(name, entry)
    faults = watch.get("faults", {})
    if not isinstance(faults, dict) or not all(_is_int(v) for v in faults.values()):
        raise ValueError("watch.faults is not an object of counts")
    if watch.get("kv_blocks_stored") is not None and not _is_int(watch["kv_blocks_stored"]):
        raise ValueError("watch.kv_blocks_stored is not a count")
    _config("watch.config", watch.get("config"))
    _config("watch.prompts", watch.get("prompts"))  # the prompt match's counts (prompt_match.py)
    if watch.get("model") is not None and not isinstance(watch["model"], str):
        raise ValueError("watch.model is not text")
    lost = watch.get("lost", [])
    if not isinstance(lost, list) or not all(isinstance(s, list) and len(s) == 3 for s in lost):
        raise ValueError("watch.lost is not a list of [server, t_lost_ns, t_back_ns]")
