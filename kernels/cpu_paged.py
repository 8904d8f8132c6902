"""The CPU backend: a C++ paged decode-attention kernel, built at run time, and the torch path for the rest.

Why: the torch path (``torch_paged.py``) answers a bucket of decodes with two page gathers (a copy of
every key and value it reads) and one ``scaled_dot_product_attention``; on the benchmark workload the
gathers alone took as long as SDPA. This kernel reads K and V in place from the pages, one task per
sequence (all its heads), on the calling thread; every sequence runs to its own length,
so decodes need no buckets and a layer makes one call for all of them.

Per task: scores ``q . k * scale`` of every query head against every visible key, the max, ``exp``,
their sum, then ``sum_t p_t v_t / sum``: the float32 softmax attention of SDPA in another summation
order (differences ~1e-7; ``tests/kernels/test_cpu_paged.py`` checks it against the oracle, and the
engine's greedy tokens against transformers'). A window or a chunk comes in as each sequence's first
visible position, so pages before it (freed ones included) are never read. Prefill chunks, other
dtypes than float32 and exact-score layers (softcap, sinks) keep the torch path.

Built by ``torch.utils.cpp_extension.load_inline`` (a C++ compiler and ninja are needed) into a folder
keyed by what the binary depends on (torch, compiler, flags, CPU features; ``cpu_build.py``) under torch's
extension cache (``~/.cache/torch_extensions/py<ver>_cpu``) or under ``$KVSCOPE_EXTENSIONS_DIR`` when set,
so only the first process with a given torch, compiler and CPU pays the build (~30-60 s, announced on
stderr); a process that starts meanwhile waits for it. It registers ``torch.ops.kvscope.paged_decode_attention``.
``load()`` is False where it cannot be built, and ``resolve_backend("auto")`` then picks the torch path;
where it is not built yet, ``resolve_backend("auto")`` starts on the torch path and builds it in the background
(``background_build.py``), never making a run wait for the compiler.

One thread: splitting the sequences over a second one (torch's inter-op pool; ``at::parallel_for``
would need the extension built with OpenMP, a second runtime beside torch's) made the kernel alone
1.4-1.8x faster on 48 decodes (~1.0 ms -> ~0.6 ms) but not the engine: 0.87-1.09x over six paired
runs of the throughput benchmark at 2 threads, as the step's GEMMs leave OpenMP's worker spinning
on the other core. The simpler form is kept.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from . import cpu_build, torch_paged, torch_run
from .torch_paged import AttentionPlan

log = logging.getLogger(__name__)
NAME = "kvscope_cpu_paged"  # the extension's name: its folder in the build cache

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cpu/vec/vec.h>
#include <algorithm>
#include <limits>
#include <vector>

using Vec = at::vec::Vectorized<float>;

static inline float hsum(const Vec& v) {
  float lanes[Vec::size()];
  v.store(lanes);
  float s = 0.f;
  for (int64_t j = 0; j < Vec::size(); ++j) s += lanes[j];
  return s;
}

static inline float dot(const float* a, const float* b, int64_t n) {
  int64_t d = 0;
  Vec acc(0.f);
  for (; d + Vec::size() <= n; d += Vec::size()) acc = at::vec::fmadd(Vec::loadu(a + d), Vec::loadu(b + d), acc);
  float s = hsum(acc);
  for (; d < n; ++d) s += a[d] * b[d];
  return s;
}

static inline void axpy(float p, const float* x, float* y, int64_t n) {  // y += p * x
  int64_t d = 0;
  const Vec pv(p);
  for (; d + Vec::size() <= n; d += Vec::size()) at::vec::fmadd(pv, Vec::loadu(x + d), Vec::loadu(y + d)).store(y + d);
  for (; d < n; ++d) y[d] += p * x[d];
}

// out[i, h * G + g, :] = softmax_t(q[i, h * G + g] . K[t, h] * scale) @ V[t, h] over the keys
// t = starts[i] .. seq_lens[i] - 1 of decode row i (its pages: block_tables[i]).
void paged_decode_attention(const at::Tensor& query,        // [T, Hq, D] float32, any strides
                  const at::Tensor& key_cache,    // [num_blocks, block_size, Hkv, D] contiguous
                  const at::Tensor& value_cache,  // [num_blocks, block_size, Hkv, Dv] contiguous
                  const at::Tensor& block_tables, // [B, max_blocks] int64 contiguous
                  const at::Tensor& seq_lens,     // [num_decodes] int64
                  const at::Tensor& starts,       // [num_decodes] int64
                  at::Tensor& out,                // [T, Hq, Dv] float32, any strides
                  double scale) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && key_cache.scalar_type() == at::kFloat &&
              value_cache.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && block_tables.is_contiguous() &&
              seq_lens.is_contiguous() && starts.is_contiguous(), "caches, tables and lengths must be contiguous");
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

  const int64_t num_heads = num_kv_heads * group;
  // one task per sequence, all its heads: each token's K (then V) row of all heads is read once, in
  // order, page by page. On the calling thread (see the module doc for why not split over threads).
  std::vector<float> q(num_heads * head_dim), scores, acc(num_heads * head_dim_v), total(num_heads);
  for (int64_t i = 0; i < num_decodes; ++i) {
    const int64_t lo = firsts[i], hi = lens[i], n = hi - lo;
    const int64_t* table = tables + i * max_blocks;
    for (int64_t hq = 0; hq < num_heads; ++hq) {  // the row's queries, contiguous [Hq, D]
      const float* src = q_base + i * q_row + hq * q_head;
      for (int64_t d = 0; d < head_dim; ++d) q[hq * head_dim + d] = src[d * q_dim];
    }
    scores.resize(num_heads * std::max<int64_t>(n, 1));  // [Hq][t - lo]
    for (int64_t page = lo / block_size, t = lo; t < hi; ++page) {
      const int64_t stop = std::min(hi, (page + 1) * block_size);
      const float* k = k_base + (table[page] * block_size + t % block_size) * k_token;
      for (; t < stop; ++t, k += k_token)
        for (int64_t hq = 0; hq < num_heads; ++hq)
          scores[hq * n + (t - lo)] = dot(q.data() + hq * head_dim, k + (hq / group) * head_dim, head_dim) * fscale;
    }
    for (int64_t hq = 0; hq < num_heads; ++hq) {  // softmax numerators and denominators, vectorised
      float* sh = scores.data() + hq * n;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < n; ++t) top = std::max(top, sh[t]);
      const Vec topv(top);
      Vec sum(0.f);
      int64_t t = 0;
      for (; t + Vec::size() <= n; t += Vec::size()) {
        Vec e = (Vec::loadu(sh + t) - topv).exp_u20();
        e.store(sh + t);
        sum = sum + e;
      }
      float rest = 0.f;
      if (t < n) {
        Vec e = (Vec::loadu(sh + t, n - t) - topv).exp_u20();
        e.store(sh + t, n - t);
        for (int64_t j = t; j < n; ++j) rest += sh[j];
      }
      total[hq] = hsum(sum) + rest;
    }
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t page = lo / block_size, t = lo; t < hi; ++page) {
      const int64_t stop = std::min(hi, (page + 1) * block_size);
      const float* v = v_base + (table[page] * block_size + t % block_size) * v_token;
      for (; t < stop; ++t, v += v_token)
        for (int64_t hq = 0; hq < num_heads; ++hq)
          axpy(scores[hq * n + (t - lo)], v + (hq / group) * head_dim_v, acc.data() + hq * head_dim_v, head_dim_v);
    }
    for (int64_t hq = 0; hq < num_heads; ++hq) {
      float* dst = o_base + i * o_row + hq * o_head;
      const float inv = n > 0 ? 1.f / total[hq] : 0.f;
      for (int64_t d = 0; d < head_dim_v; ++d) dst[d * o_dim] = acc[hq * head_dim_v + d] * inv;
    }
  }
}


// A dispatcher op (not a pybind function): torch.profiler records it like any aten op, and
// torch.ops.kvscope.paged_decode_attention calls it without Python in between.
TORCH_LIBRARY_FRAGMENT(kvscope, m) {
  m.def("paged_decode_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor starts, Tensor(a!) out, float scale) -> ()");
}
TORCH_LIBRARY_IMPL(kvscope, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
"""


@functools.cache
def load() -> bool:
    """Build (or find in the cache) and load the kernel; False, logged once, where it cannot be built or
    another process's build of it takes longer than ``cpu_build.WAIT_S``. The build folder, its lock and
    the notices are ``cpu_build``'s."""
    try:
        from torch.utils.cpp_extension import load_inline

        flags = build_flags()
        key = cpu_build.current_key(_SOURCE, flags)
        folder = cpu_build.build_folder(NAME, key)
        cpu_build.build_once(folder, NAME, key, lambda: load_inline(
            name=NAME, cpp_sources=[_SOURCE], is_python_module=False, verbose=False, extra_cflags=flags,
            build_directory=folder))
        return hasattr(torch.ops.kvscope, "paged_decode_attention")
    except Exception as exc:  # no compiler, no ninja, a failing build, a build elsewhere too slow: the torch path
        log.warning("kvscope: the C++ decode attention could not be built (%s); using the torch path", exc)
        return False


def ready() -> bool:
    """Can ``load()`` be had without compiling: loaded in this process already, or built on disk for this
    torch, compiler and CPU with nothing for ninja to redo (a check of ~0.1 s)? False where the folder is
    refused (``build_trust``) or anything else goes wrong: ``load()`` then says why."""
    cache_info = getattr(load, "cache_info", None)
    if cache_info is None or cache_info().currsize:  # load() ran in this process: its answer stands
        return load()
    try:
        flags = build_flags()
        key = cpu_build.current_key(_SOURCE, flags)
        return not cpu_build.needs_build(cpu_build.build_folder(NAME, key), NAME)
    except Exception:  # load() reports it when it runs
        return False


def build_flags() -> list[str]:
    """The compiler flags: native code, and at::vec's vector width for this CPU (the macros torch's own
    kernels and inductor's code use)."""
    capability = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT", ...
    if capability in ("AVX512", "AVX2"):
        return ["-O3", "-march=native", f"-DCPU_CAPABILITY={capability}", f"-DCPU_CAPABILITY_{capability}"]
    return ["-O3", "-march=native"]


@dataclass(slots=True)
class CpuPlan:
    """One step's attention for one kind of layer: the decode rows for the kernel and a torch plan
    (``torch_paged.AttentionPlan``) holding only the prefill chunks."""

    num_decodes: int
    block_tables: torch.Tensor  # [B, max_blocks] int64; rows 0..num_decodes - 1 are the decodes'
    seq_lens: torch.Tensor  # [num_decodes] int64
    starts: torch.Tensor  # [num_decodes] int64: each decode's first visible key position
    prefills: AttentionPlan


def build_plan(block_tables: torch.Tensor, query_lens: list[int], seq_lens: list[int], num_decodes: int,
               block_size: int, num_queries_per_kv: int, dtype: torch.dtype, kv_row_elems: int = 256, *,
               window: int | None = None, chunk: int | None = None, exact: bool = False) -> CpuPlan | AttentionPlan:
    """``torch_paged.build_plan``'s signature; a ``CpuPlan`` where the kernel applies (float32 on the
    CPU, no softcap / sinks), else the torch plan itself."""
    if exact or dtype != torch.float32 or block_tables.device.type != "cpu" or not num_decodes:
        return torch_paged.build_plan(block_tables, query_lens, seq_lens, num_decodes, block_size, num_queries_per_kv,
                                      dtype, kv_row_elems, window=window, chunk=chunk, exact=exact)
    prefills = torch_paged.build_plan(block_tables[num_decodes:], query_lens[num_decodes:], seq_lens[num_decodes:], 0,
                                      block_size, num_queries_per_kv, dtype, kv_row_elems, window=window, chunk=chunk)
    for c in prefills.prefills:  # their token rows come after the decodes' in the flat batch
        c.start += num_decodes
        c.end += num_decodes
    lens = seq_lens[:num_decodes]
    firsts = [torch_paged.first_visible(n - 1, window, chunk) for n in lens] if window or chunk else [0] * num_decodes
    return CpuPlan(num_decodes, block_tables.contiguous(), torch.tensor(lens, dtype=torch.int64),
                   torch.tensor(firsts, dtype=torch.int64), prefills)


def run_plan(plan: CpuPlan | AttentionPlan, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
             scale: float, out: torch.Tensor, new_key: torch.Tensor | None = None,
             new_value: torch.Tensor | None = None, *, softcap: float | None = None,
             sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``torch_run.run_plan``'s signature: decodes by the kernel, prefill chunks by the torch path.
    ``query`` ``[T, Hq, D]`` (any strides); ``out`` ``[T, Hq, Dv]``."""
    if not isinstance(plan, CpuPlan):
        return torch_run.run_plan(plan, query, key_cache, value_cache, scale, out, new_key, new_value,
                                    softcap=softcap, sinks=sinks)
    torch.ops.kvscope.paged_decode_attention(query, key_cache, value_cache, plan.block_tables, plan.seq_lens,
                                             plan.starts, out, scale)
    if plan.prefills.prefills:
        torch_run.run_plan(plan.prefills, query, key_cache, value_cache, scale, out, new_key, new_value)
    return out
