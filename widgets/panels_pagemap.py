"""The KV page map: every block of the pool as a cell of a grid.

Colour = the request that owns the block (``PageEntry.owner``), opacity = how full it is; shared
blocks are hatched, cached-free blocks (no holder, still findable by the prefix cache) grey, free
blocks light. The grid is sent once, when the first record tells the pool size; after that only the
cells that changed go out, with ``ColumnDataSource.patch``.

``cell_style`` is the single definition of a cell's look; ``report.py`` mirrors it in the JavaScript
of the step slider (``CELL_STYLE_JS``), so replayed steps look the same as live ones.
"""

from __future__ import annotations

import math

from bokeh.models import Range1d

from kvscope.telemetry.records import FREE_PAGE, PageEntry

from .feed import Tick
from .panels import Panel
from .theme import (
    CACHED_COLOR,
    FREE_COLOR,
    HALF_WIDTH,
    HEIGHT,
    OwnerColors,
    add_hover,
    empty_source,
    new_figure,
)

COLUMNS = ("x", "y", "block", "owner", "filled", "state", "refs", "color", "alpha", "hatch")
MIN_ALPHA = 0.3


def cell_style(entry: PageEntry, block_size: int, colors: OwnerColors) -> tuple[str, float, str]:
    """(fill colour, fill alpha, hatch pattern) of one block."""
    if entry.state == "free" or (not entry.owner and entry.state != "cached"):
        return FREE_COLOR, 1.0, " "
    if entry.state == "cached":
        return CACHED_COLOR, 0.8, " "
    fill = min(entry.filled / block_size, 1.0) if block_size else 1.0
    return colors(entry.owner), MIN_ALPHA + (1 - MIN_ALPHA) * fill, "/" if entry.state == "shared" else " "


CELL_STYLE_JS = f"""
function cell_style(owner_color, filled, state, block_size) {{
  if (state == "free" || (owner_color == null && state != "cached")) return ["{FREE_COLOR}", 1.0, " "];
  if (state == "cached") return ["{CACHED_COLOR}", 0.8, " "];
  const fill = block_size ? Math.min(filled / block_size, 1.0) : 1.0;
  return [owner_color, {MIN_ALPHA} + {1 - MIN_ALPHA} * fill, state == "shared" ? "/" : " "];
}}
"""


def grid_shape(num_blocks: int, aspect: float) -> tuple[int, int]:
    """(columns, rows) of a grid for ``num_blocks`` cells whose width/height is about ``aspect``."""
    cols = max(1, math.ceil(math.sqrt(num_blocks * aspect)))
    return cols, math.ceil(num_blocks / cols)


class PageMapPanel(Panel):
    name = "page_map"
    title = "KV page map"

    def __init__(self, width: int = HALF_WIDTH, height: int = HEIGHT) -> None:
        self.colors = OwnerColors()
        self.entries: list[PageEntry] = []
        self.block_size = 0
        self.step: int | None = None
        self.source = empty_source(*COLUMNS)
        fig = new_figure(self.title, width=width, height=height, x_range=Range1d(-0.5, 0.5),
                         y_range=Range1d(0.5, -0.5))
        fig.rect("x", "y", width=0.92, height=0.92, source=self.source, fill_color="color", fill_alpha="alpha",
                 hatch_pattern="hatch", hatch_color="#333333", hatch_alpha=0.5, hatch_scale=4, line_color=None)
        fig.axis.visible = False
        fig.grid.visible = False
        add_hover(fig, [("block", "@block"), ("owner", "@owner"), ("tokens", "@filled"), ("state", "@state"),
                        ("holders", "@refs")])
        self.figure = fig
        self.model = fig

    @property
    def num_blocks(self) -> int:
        return len(self.entries)

    def _build_grid(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.entries = [FREE_PAGE] * num_blocks
        aspect = (self.figure.width - 40) / max(self.figure.height - 40, 1)
        self.cols, rows = grid_shape(num_blocks, aspect)
        self.figure.x_range.update(start=-0.5, end=self.cols - 0.5)
        self.figure.y_range.update(start=rows - 0.5, end=-0.5)  # block 0 at the top left

    def _cell(self, block: int) -> dict:
        entry = self.entries[block]
        color, alpha, hatch = cell_style(entry, self.block_size, self.colors)
        return {"x": block % self.cols, "y": block // self.cols, "block": block, "owner": entry.owner,
                "filled": entry.filled, "state": entry.state, "refs": entry.refs, "color": color,
                "alpha": alpha, "hatch": hatch}

    def apply(self, page_map: dict[int, PageEntry], changed: set[int]) -> None:
        """Fold one record's page map (a diff or a full snapshot) into ``entries``."""
        entries = self.entries
        for block, entry in page_map.items():
            if 0 <= block < len(entries) and entries[block] != entry:
                entries[block] = PageEntry(*entry)
                changed.add(block)

    def update(self, tick: Tick) -> None:
        if not tick.steps:
            return
        fresh = not self.entries
        if fresh:
            kv = tick.steps[0].kv
            self._build_grid(kv.num_blocks, kv.block_size)
        changed: set[int] = set()
        for record in tick.steps:
            self.apply(record.page_map, changed)
        self.step = tick.steps[-1].step
        if fresh:  # the one full send of the grid
            cells = [self._cell(b) for b in range(self.num_blocks)]
            self.source.data = {c: [cell[c] for cell in cells] for c in COLUMNS}
        elif changed:
            cells = [self._cell(b) for b in sorted(changed)]
            self.source.patch({c: [(cell["block"], cell[c]) for cell in cells]
                               for c in ("owner", "filled", "state", "refs", "color", "alpha", "hatch")})
