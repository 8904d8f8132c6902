"""The block pool's plain parts: a full block's chained hash (``BlockHash``), a KV page (``KVBlock``) and the
queue of free ones (``FreeBlockQueue``). The pool that uses them, and what the fields mean (states, hashes,
verification): ``kvscope.engine.core.block_pool``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True, unsafe_hash=True)
class BlockHash:
    """Chained hash of one full block plus the tokens it covers (for verification). Never changed once
    made; not ``frozen`` only because a frozen dataclass's ``__init__`` costs 2.5 times as much (one is
    made per full block of every sequence); hashable and comparable as before."""

    value: int
    token_ids: tuple[int, ...]


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    parent: KVBlock | None = None  # the block before this one in the sequence it was cached from
    parent_epoch: int = 0
    epoch: int = 0  # bumped each time the block's cached contents are dropped
    group: int = 0  # the KV cache group it was last allocated to (kvscope.engine.core.kv_groups)


class FreeBlockQueue:
    """Free blocks: empty ones first (a stack), then cached ones, least recently freed first."""

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self.empty: list[KVBlock] = list(reversed(list(blocks)))  # pop() hands out block 0 first
        self.cached: OrderedDict[int, KVBlock] = OrderedDict()

    def __len__(self) -> int:
        return len(self.empty) + len(self.cached)

    def append(self, block: KVBlock) -> None:
        if block.block_hash is None:
            self.empty.append(block)
        else:
            self.cached[block.block_id] = block

    def pop(self) -> KVBlock:
        if self.empty:
            return self.empty.pop()
        return self.cached.popitem(last=False)[1]

    def remove(self, block: KVBlock) -> None:
        """Take a free cached block out of the queue (a prefix-cache hit revives it)."""
        del self.cached[block.block_id]
