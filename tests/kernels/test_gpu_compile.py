"""The Triton kernels compile for real GPUs (sm_80, sm_89, sm_90) on this CPU-only machine.

The interpreter accepts programs the compiler rejects (tl.dot shapes, loop-carried types, early returns),
so the kernels are also compiled ahead of time, through PTX to a cubin with the ptxas that ships with
Triton, for the tile configurations the launcher picks, and their shared memory is checked against
each architecture's limit. It runs in a subprocess without TRITON_INTERPRET (the interpreter is chosen
when a kernel is defined) and loads ``kernels/`` on its own, skipping kvscope's heavier imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import triton

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"

SCRIPT = textwrap.dedent(
    """
    import importlib.machinery, importlib.util, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # kernels/ is a namespace folder (no __init__.py): a bare package over it
    spec = importlib.machinery.ModuleSpec("aot_kernels", None, is_package=True)
    spec.submodule_search_locations = [sys.argv[1]]
    sys.modules["aot_kernels"] = importlib.util.module_from_spec(spec)
    from aot_kernels import attention_kernel as ak, paged_attention as pa, store_kv as sk

    SMEM_LIMIT = {80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}

    def build(fn, arch, pointers, constants):
        floats = ("scale_log2", "scale", "softcap")
        sig = {n: "constexpr" if n in constants else pointers.get(n, "fp32" if n in floats else "i32")
               for n in fn.arg_names}
        aligned = [n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride_")]
        attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
        src = ASTSource(fn=fn, signature=sig, constexprs=constants, attrs=attrs)
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})
        assert kernel.asm["cubin"], fn
        assert kernel.metadata.shared <= SMEM_LIMIT[arch], (fn, arch, kernel.metadata.shared)
        print(fn.__name__, arch, kernel.metadata.shared)

    # (dtype, arch, head size, value head size, group, block size, decode only, splits, features on)
    for dt, arch, head_dim, head_dim_v, group, block_size, decode, splits, local in [
        ("fp16", 90, 128, 128, 4, 16, True, 1, False), ("bf16", 80, 80, 80, 1, 32, False, 1, False),
        ("fp32", 89, 256, 256, 2, 128, False, 1, False), ("fp16", 89, 64, 64, 8, 16, True, 8, False),
        ("bf16", 90, 192, 128, 1, 16, False, 1, True), ("bf16", 89, 256, 256, 2, 16, True, 4, True),
    ]:
        d_pad, dv_pad = triton.next_power_of_2(head_dim), triton.next_power_of_2(head_dim_v)
        block_m, tile_n = pa._tile_config(4 if dt == "fp32" else 2, max(d_pad, dv_pad), group, decode)
        pointers = {n: "*" + dt for n in ("out_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr")}
        pointers.update(part_acc_ptr="*fp32", part_ml_ptr="*fp32", block_tables_ptr="*i64",
                        query_start_loc_ptr="*i32", seq_lens_ptr="*i32", sinks_ptr="*fp32")
        build(ak.paged_attention_kernel, arch, pointers, dict(
            HEAD_DIM=head_dim, D_PAD=d_pad, HEAD_DIM_V=head_dim_v, DV_PAD=dv_pad, HAS_WINDOW=local,
            HAS_CHUNK=local, USE_SOFTCAP=local, HAS_SINKS=local, GROUP=group, BLOCK_SIZE=block_size,
            BLOCK_Q=block_m // group, BLOCK_M=block_m, TILE_N=tile_n, NUM_SPLITS=splits, DOT_FP32=False,
            DOT_PRECISION="ieee" if dt == "fp32" else "tf32"))
    build(ak.merge_splits_kernel, 90, {"out_ptr": "*bf16", "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32",
          "sinks_ptr": "*fp32"}, dict(HEAD_DIM=96, D_PAD=128, NUM_SPLITS=16, HAS_SINKS=True))
    build(sk._store_kv_kernel, 80, {"key_ptr": "*fp32", "value_ptr": "*fp32", "key_cache_ptr": "*bf16",
          "value_cache_ptr": "*bf16", "slot_mapping_ptr": "*i64"},
          dict(NUM_KV_HEADS=3, HEAD_DIM=96, HEAD_DIM_V=64, BLOCK_SIZE=16, BLOCK_H=4, D_PAD=128))
    """
)


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build ships no ptxas")
def test_kernels_compile_for_gpus():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(KERNELS)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.splitlines()) == 8, result.stdout
