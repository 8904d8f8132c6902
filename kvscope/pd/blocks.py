"""A prompt's KV blocks as a hand-over sees them, on any ``BlockPool`` (no process, no tensors): which full
blocks an instance holds in its prefix cache, and caching the blocks that arrived under their hashes.
Both P/D engines move blocks with these: the process instances (``kvscope.pd.instance``) and the simulated
ones (``kvscope.pd.sim_engine``)."""

from __future__ import annotations

from kvscope.engine.core.block_pool import BlockHash, BlockPool, KVBlock


def prompt_prefix(pool: BlockPool, prompt_ids: list[int]) -> tuple[list[BlockHash], list[KVBlock]]:
    """The hashes of the prompt's full blocks that a hand-over may move (never the block holding the last
    token, which the consumer recomputes to sample the first token) and the chain of them ``pool`` holds."""
    n = (len(prompt_ids) - 1) // pool.block_size
    hashes = pool.hash_blocks(list(prompt_ids[: n * pool.block_size]), [])
    return hashes, pool.find_cached_prefix(hashes) if n else []


def attach(pool: BlockPool, hashes: list[BlockHash], chain: list[KVBlock], new: list[KVBlock]) -> None:
    """Cache the blocks that arrived (``new``, in prompt order) under their hashes, after the ``chain`` of
    the prompt's blocks that ``pool`` already held, so the scheduler's prefix lookup finds all of them."""
    parent = chain[-1] if chain else None
    for block, h in zip(new, hashes[len(chain): len(chain) + len(new)]):
        pool.cache_block(block, h, parent)
        parent = block
