"""A C++ paged decode-attention kernel for the CPU, built at run time (``EngineConfig.compile``).

Why: the torch path answers a bucket of decodes with two page gathers (a copy of every key and value
read) and one ``scaled_dot_product_attention``, whose CPU kernel does its small GEMMs through MKL; on
the AMD EPYC machines measured here MKL runs a generic code path (~55 GFLOP/s per core against
oneDNN's 110-130), and CPU SDPA with two query rows per KV head took ~5x the time its bytes need. This
kernel reads K and V in place from the pages (no gather), one task per (sequence, KV head), split
over torch's intra-op threads; every sequence runs to its own length, so decodes need no buckets and
a layer makes one call for all of them.

Per task: scores ``q . k * scale`` of the G query heads of the KV head for every visible key, the
max, ``exp``, their sum, then ``sum_t p_t v_t / sum``: the same float32 softmax attention as SDPA, in
another summation order (differences ~1e-7; greedy tokens are checked against transformers in
``tests/test_cpu_attention.py``). Windows and chunks come in as each sequence's first visible
position; softcap and sinks (plans with ``exact=True``) keep the torch path.

Built with ``torch.utils.cpp_extension.load_inline`` (a C++ compiler and ninja are needed; the build
is cached under ``~/.cache/torch_extensions``, so only the first process pays its ~30-60 s).
``load()`` returns None where it cannot be built, and the engine then keeps the torch path.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// out[i, h * G + g, :] = softmax_t(q[i, h * G + g] . K[t, h] * scale) @ V[t, h] over the keys
// t = starts[i] .. seq_lens[i] - 1 of decode row i (its pages: block_tables[i]).
void paged_decode(const at::Tensor& query,        // [T, Hq, D] float32, any strides
                  const at::Tensor& key_cache,    // [num_blocks, block_size, Hkv, D] contiguous
                  const at::Tensor& value_cache,  // [num_blocks, block_size, Hkv, Dv] contiguous
                  const at::Tensor& block_tables, // [B, max_blocks] int64 contiguous
                  const at::Tensor& seq_lens,     // [num_decodes] int64
                  const at::Tensor& starts,       // [num_decodes] int64
                  at::Tensor& out,                // [T, Hq, Dv] float32, any strides
                  double scale) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && key_cache.scalar_type() == at::kFloat &&
              value_cache.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && block_tables.is_contiguous(),
              "caches and block tables must be contiguous");
  const int64_t num_decodes = seq_lens.size(0);
  const int64_t block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
  const int64_t head_dim = key_cache.size(3), head_dim_v = value_cache.size(3);
  const int64_t group = query.size(1) / num_kv_heads, max_blocks = block_tables.size(1);
  const float* q_base = query.data_ptr<float>();
  const int64_t q_row = query.stride(0), q_head = query.stride(1), q_dim = query.stride(2);
  float* o_base = out.data_ptr<float>();
  const int64_t o_row = out.stride(0), o_head = out.stride(1), o_dim = out.stride(2);
  const float* k_base = key_cache.data_ptr<float>();
  const float* v_base = value_cache.data_ptr<float>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t* firsts = starts.data_ptr<int64_t>();
  const int64_t k_token = num_kv_heads * head_dim, v_token = num_kv_heads * head_dim_v;
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, num_decodes * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(group * head_dim), scores, acc(group * head_dim_v);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / num_kv_heads, h = task % num_kv_heads;
      const int64_t lo = firsts[i], hi = lens[i], n = hi - lo;
      const int64_t* table = tables + i * max_blocks;
      for (int64_t g = 0; g < group; ++g) {  // this KV head's queries, contiguous
        const float* src = q_base + i * q_row + (h * group + g) * q_head;
        for (int64_t d = 0; d < head_dim; ++d) q[g * head_dim + d] = src[d * q_dim];
      }
      scores.resize(group * std::max<int64_t>(n, 1));
      std::vector<float> top(group, -std::numeric_limits<float>::infinity()), total(group, 0.f);
      for (int64_t t = lo; t < hi; ++t) {
        const float* k = k_base + (table[t / block_size] * block_size + t % block_size) * k_token + h * head_dim;
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = q.data() + g * head_dim;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < head_dim; ++d) s += qg[d] * k[d];
          s *= fscale;
          scores[g * n + (t - lo)] = s;
          top[g] = std::max(top[g], s);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* sg = scores.data() + g * n;
        float sum = 0.f;
        for (int64_t t = 0; t < n; ++t) {
          sg[t] = std::exp(sg[t] - top[g]);
          sum += sg[t];
        }
        total[g] = sum;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = lo; t < hi; ++t) {
        const float* v = v_base + (table[t / block_size] * block_size + t % block_size) * v_token + h * head_dim_v;
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * n + (t - lo)];
          float* a = acc.data() + g * head_dim_v;
#pragma omp simd
          for (int64_t d = 0; d < head_dim_v; ++d) a[d] += p * v[d];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* dst = o_base + i * o_row + (h * group + g) * o_head;
        const float inv = n > 0 ? 1.f / total[g] : 0.f;
        for (int64_t d = 0; d < head_dim_v; ++d) dst[d * o_dim] = acc[g * head_dim_v + d] * inv;
      }
    }
  });
}
"""


@functools.cache
def load():
    """The built extension (``.paged_decode``), or None where it cannot be built (logged once)."""
    try:
        from torch.utils.cpp_extension import load_inline

        return load_inline(
            name="kvscope_cpu_attention", cpp_sources=[_SOURCE], functions=["paged_decode"],
            extra_cflags=["-O3", "-march=native", "-fopenmp-simd"], verbose=False,
            build_directory=_build_dir(),
        )
    except Exception as exc:  # no compiler, no ninja, a failing build: keep the torch path
        log.warning("kvscope: the C++ decode attention could not be built (%s); using the torch path", exc)
        return None


def _build_dir() -> str | None:
    """Where the build goes: ``$KVSCOPE_EXTENSIONS_DIR`` if set, else torch's default cache."""
    folder = os.environ.get("KVSCOPE_EXTENSIONS_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
    return folder or None


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, starts: torch.Tensor, out: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """Decode attention of query rows ``0..len(seq_lens) - 1`` into the same rows of ``out``."""
    load().paged_decode(query, key_cache, value_cache, block_tables, seq_lens, starts, out, scale)
    return out
