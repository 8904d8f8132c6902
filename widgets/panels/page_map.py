"""The KV page map: every block of the pool as a cell of a grid (a cell's look: ``page_cells.py``).

Pools of more than ``MAX_CELLS`` blocks (a GPU's pool can hold hundreds of thousands) are drawn with
one cell per run of ``group`` consecutive blocks, so the browser stays responsive (``merge_entries``);
the hover names the block range. The grid is sent once, when the first record tells the pool size;
after that only the cells that changed go out, with ``ColumnDataSource.patch``.

KV cache groups (a sliding-window or hybrid model, ``kvscope.engine.core.kv_groups``): the title names the
groups from the run metadata (``kv_groups_label``): how many, their layers and windows, and why a window is
not freed when the model fell back to one group. Blocks that left a window show as cached (or free) while
their request runs on.

With speculative decoding, a small triangle marks each block that held draft slots in the step
(``SpecDecodeStats.draft_slots``): green when the target accepted all of them, orange when it rejected
some, red when the block held nothing but rejected drafts and went back to the pool (``freed_blocks``).
``pool_of`` / ``map_of`` say which pool a panel draws (``speculation.DraftPageMapPanel`` draws the draft
model's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from bokeh.models import Range1d

from kvscope.telemetry.pagemap import mapped_blocks
from kvscope.telemetry.records import FREE_PAGE, PageEntry, StepRecord

from ..feed import Tick
from ..theme import HALF_WIDTH, HEIGHT, OwnerColors, add_hover, columns, empty_source, new_figure, style_legend
from .base import Panel, PanelContext
from .page_cells import DRAFT_MARK_COLORS, STATE_LEGEND, cell_style, grid_shape, legend_columns, merge_entries

COLUMNS = ("x", "y", "block", "blocks", "owner", "filled", "state", "refs", "kv_group", "color", "alpha", "outline")
PATCHED = ("owner", "filled", "state", "refs", "kv_group", "color", "alpha", "outline")
MAX_CELLS = 8192


def kv_groups_label(meta: dict) -> str | None:
    """A short description of a run's KV cache groups (``meta["kv_cache_groups"]``), or None where
    there is nothing to say (one group of full-attention layers, or a run without the key)."""
    groups = meta.get("kv_cache_groups") or {}
    specs = groups.get("groups") or []
    if groups.get("fallback_reason"):
        return "one KV group, window not freed: " + groups["fallback_reason"].split(" (")[0]
    windows = [g.get("sliding_window") for g in specs]
    if not any(windows):
        return None
    slots = groups.get("num_slots", 0)
    sliding = sum(1 for w in windows if w)
    kinds = ", ".join(sorted({f"window {w}" if w else "full" for w in windows}, key=str))
    text = f"{len(specs)} KV group{'s' * (len(specs) > 1)} of {slots} layer{'s' * (slots > 1)} ({kinds})"
    return text + (f", {sliding} freeing by window" if len(specs) > 1 else ", freeing by window")


class PageMapPanel(Panel):
    name = "page_map"
    title = "KV page map"
    marks_drafts = True  # mark the blocks that held draft slots in the step (speculative decoding)

    @classmethod
    def create(cls, context: PanelContext) -> PageMapPanel:
        panel = cls()
        panel.meta = context.meta  # filled in place as a live run learns it: read on the first grid
        return panel

    def __init__(self, width: int = HALF_WIDTH, height: int = HEIGHT, max_cells: int | None = None) -> None:
        self.colors = OwnerColors()
        self.meta: dict = {}
        self.entries: list[PageEntry] = []
        self.block_size = 0
        self.max_cells = max_cells or MAX_CELLS
        self.group = 1  # blocks per cell
        self.num_cells = 0
        self.step: int | None = None
        self.source = empty_source(*COLUMNS)
        prefix = self.name.replace("_", "-")  # names a test or the report's JS finds a source by
        self.source.name = f"{prefix}-cells"
        fig = new_figure(self.title, width=width, height=height, x_range=Range1d(-0.5, 0.5),
                         y_range=Range1d(0.5, -0.5))
        cells = fig.rect("x", "y", width=0.92, height=0.92, source=self.source, fill_color="color",
                         fill_alpha="alpha", line_color="outline", line_width=2)
        fig.axis.visible = False
        fig.grid.visible = False
        nowhere = [float("nan")]  # swatches only: one point each (a legend draws no swatch without data), not drawn
        for label, fill, outline in STATE_LEGEND:
            fig.rect(x=nowhere, y=nowhere, width=1, height=1, fill_color=fill, line_color=outline, line_width=2,
                     legend_label=label)
        add_hover(fig, [("block", "@blocks"), ("owner", "@owner"), ("tokens", "@filled"), ("state", "@state"),
                        ("holders", "@refs"), ("KV group", "@kv_group")], renderers=[cells])
        self.marks = empty_source("x", "y", "block", "drafted", "accepted", "color")
        self.marks.name = f"{prefix}-draft-slots"
        if self.marks_drafts:
            marks = fig.scatter("x", "y", source=self.marks, marker="triangle", size=8, fill_color="color",
                                line_color="#ffffff")
            add_hover(fig, [("block", "@block"), ("draft slots this step", "@drafted"),
                            ("accepted", "@accepted")], renderers=[marks])
        self.plot_height = fig.height  # the legend adds its rows below
        style_legend(fig, ncols=legend_columns(width))  # never wider than the figure (page_cells.py)
        fig.legend[0].click_policy = "none"  # a key, not a filter
        self.figure = fig
        self.model = fig

    @property
    def num_blocks(self) -> int:
        return len(self.entries)

    def _build_grid(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.entries = [FREE_PAGE] * num_blocks
        self.group = math.ceil(num_blocks / self.max_cells)
        self.num_cells = math.ceil(num_blocks / self.group)
        aspect = (self.figure.width - 40) / max(self.plot_height - 40, 1)
        self.cols, rows = grid_shape(self.num_cells, aspect)
        self.figure.x_range.update(start=-0.5, end=self.cols - 0.5)
        self.figure.y_range.update(start=rows - 0.5, end=-0.5)  # block 0 at the top left

    def grid(self, num_blocks: int, block_size: int) -> None:
        """Lay out an empty grid for a pool (a panel drawn from whole maps, not from steps: ``cells_of``)."""
        self._build_grid(num_blocks, block_size)

    def cells_of(self, entries: Sequence[PageEntry]) -> dict[str, list]:
        """The grid's columns showing the whole map ``entries`` (``entries`` becomes the shown map)."""
        self.entries = list(entries)
        return columns([self._cell(c) for c in range(self.num_cells)])

    def xy_of(self, block: int) -> tuple[int, int]:
        """The grid position of the cell that draws ``block``."""
        cell = block // self.group
        return cell % self.cols, cell // self.cols

    def _cell(self, cell: int) -> dict:
        g = self.group
        first, last = cell * g, min((cell + 1) * g, len(self.entries)) - 1
        entry = self.entries[first] if g == 1 else merge_entries(self.entries[first:last + 1])
        color, alpha, outline = cell_style(entry, self.block_size * g, self.colors)
        return {"x": cell % self.cols, "y": cell // self.cols, "block": first,
                "blocks": str(first) if g == 1 else f"{first}–{last}", "owner": entry.owner,
                "filled": entry.filled, "state": entry.state, "refs": entry.refs, "kv_group": entry.kv_group,
                "color": color,
                "alpha": alpha, "outline": outline}

    def apply(self, page_map: dict[int, PageEntry], changed: set[int]) -> None:
        """Fold one record's page map (a diff or a full snapshot) into ``entries``."""
        entries = self.entries
        for block, entry in page_map.items():
            if 0 <= block < len(entries) and entries[block] != entry:
                entries[block] = PageEntry(*entry)
                changed.add(block)

    def pool_of(self, record: StepRecord) -> tuple[int, int] | None:
        """(blocks, block size) of the pool this panel draws, as ``record`` tells it (None: it does not)."""
        return record.kv.num_blocks, record.kv.block_size

    def map_of(self, record: StepRecord) -> dict[int, PageEntry]:
        """The page-map entries ``record`` holds for this panel's pool (a diff or a snapshot)."""
        return record.page_map

    def update(self, tick: Tick) -> None:
        if not tick.steps:
            return
        fresh = not self.entries
        if fresh:
            pool = next((p for p in map(self.pool_of, tick.steps) if p is not None), None)
            if pool is None:
                return
            mapped = mapped_blocks(pool[0])  # the blocks its page map covers (bounded: telemetry/pagemap.py)
            self._build_grid(mapped, pool[1])
            label = kv_groups_label(self.meta)
            if mapped < pool[0]:
                label = ", ".join(filter(None, [f"first {mapped:,} of {pool[0]:,} blocks", label]))
            if label:
                self.figure.title.text = f"{self.title} · {label}"
        changed: set[int] = set()
        for record in tick.steps:
            self.apply(self.map_of(record), changed)
        self.step = tick.steps[-1].step
        if fresh:  # the one full send of the grid
            self.source.data = columns([self._cell(c) for c in range(self.num_cells)], arrays=True)
        elif changed:
            self.source.patch(self._patches(sorted({b // self.group for b in changed})))
        if self.marks_drafts:
            self.mark_drafts(tick.steps)

    def mark_drafts(self, records: list[StepRecord]) -> None:
        """Triangles on the blocks that held draft slots in the last speculative step of ``records``."""
        spec = next((r.spec_decode for r in reversed(records) if r.spec_decode is not None), None)
        if spec is None or not self.entries:
            return
        rows, freed = [], set(spec.freed_blocks)
        for block, (drafted, accepted) in sorted(spec.draft_slots.items()):
            cell = block // self.group
            rank = 0 if block in freed else 2 if accepted == drafted else 1
            rows.append({"x": cell % self.cols + 0.3, "y": cell // self.cols - 0.3, "block": block,
                         "drafted": drafted, "accepted": accepted, "color": DRAFT_MARK_COLORS[rank]})
        data = columns(rows) if rows else {c: [] for c in self.marks.data}
        if data != dict(self.marks.data):
            self.marks.data = data

    def show_entries(self, entries: list[PageEntry]) -> None:
        """Show a whole map (a replayed step): patch the cells that differ from what is shown."""
        if len(entries) != len(self.entries):
            raise ValueError(f"the map has {len(entries)} blocks, the grid {len(self.entries)}")
        self.entries = [PageEntry(*e) for e in entries]
        patches = self._patches(range(self.num_cells))
        if patches:
            self.source.patch(patches)

    def _patches(self, cells: Iterable[int]) -> dict[str, list[tuple[int, object]]]:
        """Per column, only the cells whose value in that column changed (a decode usually changes
        just one block's fill and shade, not its owner, state or colour)."""
        data = self.source.data
        patches: dict[str, list[tuple[int, object]]] = {c: [] for c in PATCHED}
        for index in cells:
            cell = self._cell(index)
            for c in PATCHED:
                if data[c][index] != cell[c]:
                    patches[c].append((index, cell[c]))
        return {c: p for c, p in patches.items() if p}
