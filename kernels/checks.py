"""Input checks of the Triton launchers (``store_kv.py``, ``paged_attention.py``): shapes, dtypes, devices and
the strides the kernels rely on. Each raises ``ValueError`` saying what is wrong and how to fix it."""

from __future__ import annotations

import torch
import triton

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int32, torch.int64)


def fail(message: str) -> None:
    raise ValueError(message)


def check_float(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        fail(f"{name} must be a torch.Tensor {layout}, got {type(t).__name__}")
    if t.dim() != ndim:
        fail(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        fail(f"{name} has dtype {t.dtype}; the Triton kernels take float32, float16 or bfloat16: cast it")
    if t.numel() > 0 and t.stride(-1) != 1:
        fail(
            f"{name} needs a contiguous last (head) dimension, got strides {t.stride()}; "
            f"pass {name}.contiguous() (the other dimensions may have any stride)"
        )


def check_int(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        fail(f"{name} must be a torch.Tensor {layout}, got {type(t).__name__}")
    if t.dim() != ndim:
        fail(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in INT_DTYPES:
        fail(
            f"{name} has dtype {t.dtype}; it must be torch.int32 or torch.int64: use {name}.to(torch.int32)"
        )


def check_caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Both caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, alike but for the head size
    (values may have their own); returns the key cache's shape."""
    layout = "[num_blocks, block_size, num_kv_heads, head_dim]"
    check_float("key_cache", key_cache, 4, layout)
    check_float("value_cache", value_cache, 4, layout)
    if value_cache.shape[:3] != key_cache.shape[:3]:
        fail(
            f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} differ in shape "
            "(only the head size, the last dimension, may differ)"
        )
    if 0 in key_cache.shape[1:] or value_cache.shape[3] == 0:
        fail(
            f"key_cache has shape {tuple(key_cache.shape)}: block_size, num_kv_heads and head_dim must be > 0"
        )
    return tuple(key_cache.shape)


def check_device(kernel: object, **tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and that device usable by ``kernel``; returns it.

    Whether a kernel runs in Triton's interpreter is fixed when its module is imported (``triton.jit``
    reads ``TRITON_INTERPRET`` then), so the kernel object itself is asked, not the environment.
    """
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{name} on {d}" for name, d in devices.items())
        fail(f"all tensors must be on one device, got {listing}; move them with .to(device)")
    if first.type != "cuda" and isinstance(kernel, triton.runtime.JITFunction):
        fail(
            f"the Triton kernels got {first.type} tensors: they need CUDA tensors, or Triton's interpreter "
            "to run on the CPU (set TRITON_INTERPRET=1 before importing triton or kvscope); "
            "or use the torch backend"
        )
    return first
