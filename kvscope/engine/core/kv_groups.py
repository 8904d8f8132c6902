"""KV cache groups: which layers share a block table, and where each layer's pages live.

The idea of vLLM's hybrid KV cache manager. Layers are grouped by their sliding window (``None`` for
full attention; chunked-attention layers count as full: they keep every block). A model whose layers all
have one window (every full-attention model, Mistral with a window) is **one group** holding every layer,
each layer with its own K/V tensors, as before groups existed; only a window makes it free blocks.

A hybrid model (Gemma 2/3, gpt-oss: some layers full, some sliding) gets several groups. To waste no
memory, every group has the same number ``S`` of layers, ``S`` = the smallest kind's layer count: a kind
with more layers is split into several groups of ``S`` (the last one padded when ``S`` does not divide
its count; a padded slot holds pages nobody reads). The physical KV tensors are **shared**: there are
``S`` tensor pairs ("slots"), the ``j``-th layer of every group uses slot ``j``, and a block id indexes a
page in every slot. So a block of group ``g`` is one page in each of ``g``'s ``S`` layers, and memory per
block id is ``S`` layers' pages. Each group has its own block table per request, all drawn from the one
``BlockPool``.

Sharing slots needs every layer's page shape ``(num_kv_heads, head_dim, value_dim)`` to be equal; when
it is not, the model falls back to one group holding every layer with no window freeing (exact, but it
holds every token in every layer), and ``KVCacheConfig.fallback_reason`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.engine.config import LayerSpec

NULL_BLOCK = -1  # a block-table entry whose block left the window (vLLM's null_block); never read


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """One group: its KV layers (``layer_ids[j]`` lives in slot ``j``) and their window (None: full)."""

    layer_ids: tuple[int, ...]
    sliding_window: int | None = None


@dataclass(slots=True)
class KVCacheConfig:
    """The grouping of a model's KV layers (vLLM's ``KVCacheConfig``)."""

    groups: list[KVCacheGroupSpec]
    num_slots: int  # S: tensor pairs the runner allocates
    layer_group: tuple[int, ...]  # per KV layer: its group
    layer_slot: tuple[int, ...]  # per KV layer: its slot (the tensors it reads and writes)
    fallback_reason: str | None = None  # why a windowed model runs as one group without freeing
    num_layers: int = field(default=0)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def num_padded_slots(self) -> int:
        """Slots of groups that have fewer than ``num_slots`` layers: pages that hold nothing."""
        return sum(self.num_slots - len(g.layer_ids) for g in self.groups)

    @property
    def frees_blocks(self) -> bool:
        return any(g.sliding_window for g in self.groups)

    def describe(self) -> dict:
        """Plain data for the run metadata."""
        return {
            "num_groups": self.num_groups,
            "num_slots": self.num_slots,
            "num_padded_slots": self.num_padded_slots,
            "groups": [{"layers": list(g.layer_ids), "sliding_window": g.sliding_window} for g in self.groups],
            "fallback_reason": self.fallback_reason,
        }


def single_group(num_layers: int, sliding_window: int | None = None, reason: str | None = None) -> KVCacheConfig:
    """Every layer in one group, each in its own slot (the layout without groups)."""
    ids = tuple(range(num_layers))
    return KVCacheConfig([KVCacheGroupSpec(ids, sliding_window)], num_layers, (0,) * num_layers, ids,
                         reason, num_layers)  # fmt: skip


def plan_kv_cache_groups(layers: tuple[LayerSpec, ...]) -> KVCacheConfig:
    """Group ``layers`` (one ``LayerSpec`` per KV layer) as the module docstring describes."""
    windows: dict[int | None, list[int]] = {}  # window -> its layers, in order of first appearance
    for i, layer in enumerate(layers):
        windows.setdefault(layer.sliding_window or None, []).append(i)
    if len(windows) <= 1:
        return single_group(len(layers), next(iter(windows), None))
    shapes = {(la.num_kv_heads, la.head_dim, la.value_dim) for la in layers}
    if len(shapes) > 1:
        reason = (f"layers with different windows have different page shapes {sorted(shapes)} "
                  "(kv heads, head size, value head size), so they cannot share KV slots")  # fmt: skip
        return single_group(len(layers), None, reason)
    size = min(len(ids) for ids in windows.values())
    groups = []
    for window, ids in windows.items():
        for start in range(0, len(ids), size):
            groups.append(KVCacheGroupSpec(tuple(ids[start : start + size]), window))
    layer_group, layer_slot = [0] * len(layers), [0] * len(layers)
    for g, spec in enumerate(groups):
        for j, i in enumerate(spec.layer_ids):
            layer_group[i], layer_slot[i] = g, j
    return KVCacheConfig(groups, size, tuple(layer_group), tuple(layer_slot), None, len(layers))


def num_skipped_tokens(sliding_window: int | None, num_computed_tokens: int) -> int:
    """Tokens at the start of a sequence that no later query of a sliding layer reads.

    The next token to compute is at position ``p >= num_computed_tokens`` (with chunked prefill the
    first token of the next chunk is the earliest query), and a query at ``p`` sees keys
    ``p - W + 1..p``; so keys before ``num_computed_tokens - W + 1`` are never read again. A block is
    skipped when all its tokens are: the first ``num_skipped_tokens // block_size`` blocks.
    """
    if not sliding_window:
        return 0
    return max(0, num_computed_tokens - sliding_window + 1)


def num_skipped_blocks(sliding_window: int | None, num_computed_tokens: int, block_size: int) -> int:
    return num_skipped_tokens(sliding_window, num_computed_tokens) // block_size


def max_blocks_held(sliding_window: int | None, num_tokens: int, block_size: int, max_new_tokens: int) -> int:
    """The most blocks one group of a request of ``num_tokens`` tokens holds at once, when a step
    computes at most ``max_new_tokens`` of its tokens: all of them for a full group; for a sliding one
    the blocks from the window's first key up to the step's last token."""
    full = -(-num_tokens // block_size)
    if not sliding_window:
        return full
    return min(full, -(-(sliding_window - 1 + max_new_tokens) // block_size) + 1)
