"""Paged-KV kernels and the choice between them.

Three backends share one signature (see ``reference.py`` for the layout):

- ``"torch"``: plain torch (``reference.py``, ``torch_paged.py``, ``torch_run.py``), the reference CPU path;
- ``"cpu"``: the torch path with a C++ decode-attention kernel built at run time (``cpu_paged.py``);
- ``"triton"``: Triton kernels (``store_kv.py``, ``paged_attention.py``), the CUDA path. On CPU tensors
  they run only under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the tests check them.

``resolve_backend("auto", device)`` picks Triton on CUDA, and elsewhere ``"cpu"`` where its kernel is
built already, else ``"torch"`` with the C++ build started in the background (``pending``: the engine switches
to ``"cpu"`` at a step boundary once it is built; ``background_build.py``), or plain ``"torch"`` where the build
failed. ``attention_backend="cpu"`` asks for the C++ kernel and waits for its build.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import cpu_paged, reference, torch_paged, torch_run
from .background_build import BackgroundBuild, cpu_kernel_build

BACKENDS = ("auto", "torch", "cpu", "triton")


@dataclass(frozen=True, slots=True)
class KernelBackend:
    """The kernels of one backend. ``build_plan``/``run_plan``, when present, split paged attention
    into work done once per step (from the batch's shape) and work done per layer; the engine uses
    them instead of ``paged_attention`` (the torch backend has them, see ``torch_paged.py``)."""

    name: str
    store_kv: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]
    build_plan: Callable[..., Any] | None = None
    run_plan: Callable[..., torch.Tensor] | None = None
    # a kernel being built in the background that replaces this one once built (``background_build.py``)
    pending: BackgroundBuild | None = None


def triton_interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off", "no")


def resolve_backend(name: str, device: torch.device | str) -> KernelBackend:
    """Return the kernels for ``name`` ("auto", "torch", "cpu" or "triton") on ``device``, or explain why not."""
    device = torch.device(device)
    if name not in BACKENDS:
        raise ValueError(f"attention_backend={name!r} is not one of {BACKENDS}; pick one of them")
    pending = None
    if name == "auto" and device.type == "cuda":
        name = "triton"
    elif name == "auto" and device.type == "cpu":
        if cpu_paged.ready() and cpu_paged.load():  # built: loading takes about a second
            name = "cpu"
        else:  # never wait for the compiler: torch now, the C++ kernel when its build is done
            name, pending = "torch", cpu_kernel_build()
            if pending.poll() is False:  # this process's build failed: torch for good
                pending = None
    elif name == "auto":
        name = "torch"
    if name == "torch":
        return KernelBackend(
            "torch", reference.store_kv, reference.paged_attention, torch_paged.build_plan, torch_run.run_plan, pending
        )
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError(f"attention_backend='cpu' runs on the CPU, not on {device.type}; use 'auto' or 'triton'")
        if not cpu_paged.load():
            raise ValueError("attention_backend='cpu': its C++ kernel could not be built (a C++ compiler and ninja "
                             "are needed; the log says why); use attention_backend='torch'")
        return KernelBackend(
            "cpu", reference.store_kv, reference.paged_attention, cpu_paged.build_plan, cpu_paged.run_plan
        )
    if device.type != "cuda" and not triton_interpreter_on():
        raise ValueError(
            f"attention_backend='triton' on a {device.type} device needs Triton's interpreter: "
            "set TRITON_INTERPRET=1 before importing kvscope, or use attention_backend='torch'"
        )
    try:
        from .paged_attention import paged_attention
        from .store_kv import store_kv
    except ImportError as exc:  # triton missing or broken
        raise ValueError(
            f"attention_backend='triton' is unavailable ({exc}); install triton or use attention_backend='torch'"
        ) from exc
    return KernelBackend("triton", store_kv, paged_attention)
