"""Kernel tests: on a machine without CUDA the Triton kernels run on CPU tensors through Triton's
interpreter; with a GPU they run compiled, on CUDA tensors (``DEVICE``).

``TRITON_INTERPRET`` must be set before ``triton`` is imported (``triton.jit`` reads it when a kernel is
defined): tests/conftest.py sets it (without CUDA) before any test module loads; it is set here again for
a run of this folder alone from elsewhere.
``make_paged_batch`` builds a random flat batch in the layout of ``kvscope.kernels.reference``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class PagedBatch:
    query: torch.Tensor  # [T, Hq, D]
    key_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks]
    query_start_loc: torch.Tensor  # [B + 1]
    seq_lens: torch.Tensor  # [B]
    scale: float
    query_lens: list[int]
    seq_lens_list: list[int]

    def args(self) -> tuple:
        return (self.query, self.key_cache, self.value_cache, self.block_tables, self.query_start_loc,
                self.seq_lens, self.scale)  # fmt: skip


def make_paged_batch(
    seed: int,
    *,
    query_lens: list[int],
    context_lens: list[int],  # cached positions before the new tokens
    num_kv_heads: int = 2,
    group: int = 1,
    head_dim: int = 64,
    head_dim_v: int | None = None,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    spare_blocks: int = 3,
    index_dtype: torch.dtype = torch.int32,
    device: torch.device = DEVICE,
) -> PagedBatch:
    """Pages of every sequence drawn from a random permutation of the cache's blocks (never in order);
    unused block-table entries hold other valid block ids, so ``reference.paged_attention`` may read them."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(query_lens, context_lens)]
    pages = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(pages) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max([*pages, 1]) + 1
    block_tables = torch.randint(0, num_blocks, (len(seq_lens), max_blocks), generator=gen)
    used = 0
    for b, n in enumerate(pages):
        block_tables[b, :n] = perm[used : used + n]
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen).to(dtype)
    value_cache = torch.randn((*shape[:3], head_dim_v or head_dim), generator=gen).to(dtype)
    query = torch.randn(sum(query_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    return PagedBatch(
        query=query.to(device),
        key_cache=key_cache.to(device),
        value_cache=value_cache.to(device),
        block_tables=block_tables.to(device, index_dtype),
        query_start_loc=torch.tensor(starts, dtype=index_dtype, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=index_dtype, device=device),
        scale=head_dim**-0.5,
        query_lens=list(query_lens),
        seq_lens_list=seq_lens,
    )


@pytest.fixture(scope="session")
def paged_batch():
    """The ``make_paged_batch`` factory (a fixture, so test modules need no import path tricks)."""
    return make_paged_batch
