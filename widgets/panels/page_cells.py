"""A cell of the KV page map: how one block (or a run of blocks) looks, and the grid the cells fill.

Colour = the request that owns the block (``PageEntry.owner``), opacity = how full it is; shared
blocks are outlined, cached-free blocks (no holder, still findable by the prefix cache) grey, free
blocks light. ``cell_style`` is the single definition of a cell's look; the report's step slider
(``replay.py``) runs its mirror in JavaScript (``CELL_STYLE_JS``), so replayed steps look the same as
live ones.

A pool too large to draw a cell per block is drawn with one cell per run of blocks (``merge_entries``):
the cell takes the most-held state of its blocks (shared > used > cached > free), the owner of its first
block in that state, and the tokens of all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvscope.telemetry.records import PageEntry

from ..theme import CACHED_COLOR, FREE_COLOR, OWNER_PALETTE, OwnerColors

MIN_ALPHA = 0.3
STATE_RANK = {"free": 0, "cached": 1, "used": 2, "shared": 3}
SHARED_OUTLINE = "#111111"  # a block held by more than one request (a shared prefix)
NO_OUTLINE = "rgba(0,0,0,0)"
DRAFT_MARK_COLORS = ("#d62728", "#ff7f0e", "#2ca02c")  # draft slots: block returned, some rejected, all accepted
# The legend under the map: (label, fill, outline) of one swatch per look of a cell (``cell_style``).
STATE_LEGEND = (
    ("free", FREE_COLOR, "#cccccc"),
    ("cached: no holder, kept for reuse", CACHED_COLOR, NO_OUTLINE),
    ("used: colour = request, shade = fill", OWNER_PALETTE[0], NO_OUTLINE),
    ("shared by requests (outlined)", OWNER_PALETTE[0], SHARED_OUTLINE),
)
LEGEND_CHAR_PX = 5.5  # a 10 px sans-serif label's width per character, a little over the average


def legend_columns(width: int) -> int:
    """How many legend items a row of a page map ``width`` px wide has room for (2, or 1 when a second column
    would be cut off at the figure's edge: a sweep's side-by-side maps are narrow)."""
    item = 16 + 12 + LEGEND_CHAR_PX * max(len(label) for label, _, _ in STATE_LEGEND)  # glyph, gaps, label
    return 2 if 2 * item + 24 <= width else 1


def cell_style(entry: PageEntry, block_size: int, colors: OwnerColors) -> tuple[str, float, str]:
    """(fill colour, fill alpha, outline colour) of one block. (No hatch patterns: BokehJS builds a
    canvas per patterned cell on every repaint, which made the browser the live view's bottleneck.)"""
    if entry.state == "free" or (not entry.owner and entry.state != "cached"):
        return FREE_COLOR, 1.0, NO_OUTLINE
    if entry.state == "cached":
        return CACHED_COLOR, 0.8, NO_OUTLINE
    fill = min(entry.filled / block_size, 1.0) if block_size else 1.0
    outline = SHARED_OUTLINE if entry.state == "shared" else NO_OUTLINE
    return colors(entry.owner), MIN_ALPHA + (1 - MIN_ALPHA) * fill, outline


CELL_STYLE_JS = f"""
function cell_style(owner_color, filled, state, block_size) {{
  if (state == "free" || (owner_color == null && state != "cached")) return ["{FREE_COLOR}", 1.0, "{NO_OUTLINE}"];
  if (state == "cached") return ["{CACHED_COLOR}", 0.8, "{NO_OUTLINE}"];
  const fill = block_size ? Math.min(filled / block_size, 1.0) : 1.0;
  const outline = state == "shared" ? "{SHARED_OUTLINE}" : "{NO_OUTLINE}";
  return [owner_color, {MIN_ALPHA} + {1 - MIN_ALPHA} * fill, outline];
}}
"""


def merge_entries(entries: Sequence[PageEntry]) -> PageEntry:
    """One cell's entry for a run of blocks (see the module docstring)."""
    top = max(entries, key=lambda e: STATE_RANK.get(e.state, 0))  # the first block of the top state
    return PageEntry(top.owner, sum(e.filled for e in entries), top.state, max(e.refs for e in entries),
                     top.kv_group)


def grid_shape(num_blocks: int, aspect: float) -> tuple[int, int]:
    """(columns, rows) of a grid for ``num_blocks`` cells whose width/height is about ``aspect``."""
    cols = max(1, math.ceil(math.sqrt(num_blocks * aspect)))
    return cols, math.ceil(num_blocks / cols)
