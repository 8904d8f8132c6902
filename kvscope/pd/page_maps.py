"""The instances' page maps around KV transfers, for ``meta["pd"]["page_maps"]`` (the P/D report draws them
side by side, a slider over the moments; ``widgets/panels/pd_page_maps.py``).

One moment per transfer (evenly chosen when there are more than ``MAX_MOMENTS``), and one at the end of the
run. At a transfer's moment the producer's map is read after its last step that ended by the transfer's start
(the prefill that computed the blocks) and the consumer's after the step that admitted the request (the
transferred blocks then enter the request's block table); other instances' maps at the transfer's end. The
blocks in flight (``in_flight``): the transfer's own block ids where it records them (``src_block_ids`` /
``dst_block_ids``), else the request's full blocks on that side (owner = the request), which may include
blocks that side already held (``num_held_blocks``) and the consumer's recomputed last prompt block, and which
is empty on a producer whose prompt finished in the step that computed it (the page map attributes no block
to a request that finished in the step that filled them). ``marks_from`` says which. Nothing is marked for a
failed transfer or one that moved no block.

Bounded: maps list their non-free blocks only (``[block, owner, filled, state]``), and moments stop being
added once the listed blocks pass ``MAX_ENTRIES`` (``truncated`` says so). Standard library only.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from kvscope.pd.protocols import Snapshot
from kvscope.telemetry.pagemap import page_map_at
from kvscope.telemetry.records import PageEntry, StepRecord

MAX_MOMENTS = 24
MAX_ENTRIES = 100_000


def _map(records: list[StepRecord], step: int) -> list[PageEntry] | None:
    try:
        return page_map_at(records, step)
    except ValueError:  # the snapshot before it fell out of the ring
        return None


def _listed(entries: list[PageEntry]) -> list[list[Any]]:
    return [[b, e.owner, e.filled, e.state] for b, e in enumerate(entries) if e.state != "free"]


def _marks(entries: list[PageEntry], rid: str, block_size: int) -> list[int]:
    return [b for b, e in enumerate(entries) if e.owner == rid and e.state != "free" and e.filled >= block_size]


class _Instance:
    """One instance's records (at least one), for maps at any time or step."""

    def __init__(self, snap: Snapshot) -> None:
        self.records: list[StepRecord] = list(snap[0])
        self.ends = [r.t_end_ns for r in self.records]
        self.admitted = {e.request_id: e.step for e in snap[1] if e.kind == "scheduled"}
        last = self.records[-1].kv
        self.pool = {"num_blocks": last.num_blocks, "block_size": last.block_size}

    def step_by(self, t_ns: int) -> int:
        """The last step that ended by ``t_ns`` (or the first one)."""
        return self.records[max(bisect_right(self.ends, t_ns) - 1, 0)].step

    def at(self, step: int) -> dict[str, Any] | None:
        """The page map after ``step``; ``None`` if the records no longer reach back to it."""
        entries = _map(self.records, step)
        if entries is None:
            return None
        record = next(r for r in self.records if r.step >= step)
        return {"step": record.step, "t_ns": record.t_end_ns, "blocks": _listed(entries), "in_flight": [],
                "entries": entries}


def _moment(insts: dict[str, _Instance], t: dict[str, Any] | None, index: int | None) -> dict[str, Any]:
    maps: dict[str, Any] = {}
    for name, inst in insts.items():
        if t is None:
            m = inst.at(inst.records[-1].step)
        elif name == t["src"]:
            m = inst.at(inst.step_by(int(t["start_ns"])))
        elif name == t["dst"] and t["request_id"] in inst.admitted:
            m = inst.at(inst.admitted[t["request_id"]])
        else:
            m = inst.at(inst.step_by(int(t["end_ns"])))
        if m is None:
            continue
        entries = m.pop("entries")
        if t is not None and t.get("ok") and t.get("num_blocks") and name in (t["src"], t["dst"]):
            ids = t.get("src_block_ids" if name == t["src"] else "dst_block_ids")
            m["marks_from"] = "transfer" if isinstance(ids, list) else "owner"
            m["in_flight"] = [int(b) for b in ids] if isinstance(ids, list) else \
                _marks(entries, t["request_id"], inst.pool["block_size"])
        maps[name] = m
    if t is None:
        return {"transfer": None, "label": "end of the run", "maps": maps}
    label = (f"transfer {index}: {t['request_id']} {t['src']} -> {t['dst']}, {t.get('num_blocks', 0)} blocks "
             f"({t.get('num_held_blocks', 0)} held), {t.get('num_bytes', 0)} B"
             + ("" if t.get("ok") else f", FAILED: {t.get('error')}"))
    return {"transfer": index, "request_id": t["request_id"], "src": t["src"], "dst": t["dst"],
            "start_ns": int(t["start_ns"]), "end_ns": int(t["end_ns"]), "label": label, "maps": maps}


def transfer_page_maps(snaps: dict[str, Snapshot], transfers: list[dict[str, Any]], roles: dict[str, str]
                       ) -> dict[str, Any]:
    """``meta["pd"]["page_maps"]`` (see the module docstring): ``pools`` (each instance's blocks and block
    size), ``moments`` (transfers in time order, then the end of the run), ``truncated``."""
    insts = {name: _Instance(snap) for name, snap in snaps.items() if snap[0]}  # an instance that recorded a step
    n = len(transfers)
    picked = range(n) if n <= MAX_MOMENTS else sorted({round(i * (n - 1) / (MAX_MOMENTS - 1))
                                                       for i in range(MAX_MOMENTS)})
    moments, listed, truncated = [], 0, n > MAX_MOMENTS
    for i in [*picked, None]:
        moment = _moment(insts, transfers[i] if i is not None else None, i)
        size = sum(len(m["blocks"]) for m in moment["maps"].values())
        if listed + size > MAX_ENTRIES and i is not None:
            truncated = True
            continue
        moments.append(moment)
        listed += size
    return {"pools": {name: inst.pool for name, inst in insts.items()}, "moments": moments,
            "truncated": truncated, "roles": {name: roles.get(name) for name in insts}}
