"""Faster linear layers on the CPU: oneDNN GEMMs on prepacked weights, and merged projections.

The model's own ``nn.Linear`` layers call ``F.linear``, which on a CPU build of torch goes to MKL's
sgemm. On the AMD EPYC machines this project is measured on, that runs at ~55 GFLOP/s per core for
every shape of the benchmark model, while oneDNN (``torch.ops.mkldnn._linear_pointwise``, what vLLM's
CPU backend and inductor's CPU freezing use) runs the same GEMMs at 110-130 GFLOP/s, and a little
faster again on weights reordered once into its blocked layout (``mkldnn._reorder_linear_weight``).
The GEMMs were ~72% of a step, so this is the largest single lever (docs/benchmarks.md, "kvscope vs
vLLM").

``FusedLinears(model)`` prepares, for one engine, a GEMM per linear layer; linears that read the same
input (``q_proj``/``k_proj``/``v_proj``, ``gate_proj``/``up_proj``) get one GEMM over their stacked
weights, whose output is split back into the layers' outputs (views). The model object itself is not
changed in what it computes: every ``nn.Linear`` gets a forward that does the fast GEMM only while a
``FusedLinears`` is active on the calling thread (``with fused.active():``, which ``FastModel`` enters
around each engine forward pass), and the module's own forward otherwise: transformers' ``generate``
on the same model object, in the same process, is untouched.

A merged group computes its GEMM on the first member's call and hands the later members the slices
for the same input (the same tensor object: transformers passes one ``hidden_states`` to all three
projections). A member called with any other input computes its own GEMM, so a model that calls its
projections differently stays correct, only slower. Inference tensors carry no version counter, so
an in-place change of the input between two members' calls would go unnoticed; no model does that.

The results are float32 GEMMs in another summation order: not bit-identical to MKL's, and greedy
tokens are checked against transformers in ``tests/test_fusion.py``. The packed weights are a copy:
one more model's worth of memory for the linear layers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F

from kvscope.engine.config import LINEAR_BACKENDS
from kvscope.utils.thread_scope import thread_value

# Linears of one module that read the same input and can share one GEMM.
MERGE_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
PACK_BATCH_HINT = 64  # the batch size oneDNN blocks its packed weights for (decode batches are ~8-64 rows)

_local = threading.local()
_onednn = torch.ops.mkldnn._linear_pointwise if torch.backends.mkldnn.is_available() else None


def onednn_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN GEMMs are available for weights of ``dtype`` on ``device`` (CPU float32)."""
    return _onednn is not None and torch.device(device).type == "cpu" and dtype == torch.float32


def resolve_linear_backend(name: str, device: torch.device, dtype: torch.dtype) -> str:
    """``auto``: oneDNN where it is usable, else torch. ``onednn`` where it is not: ``ValueError``."""
    if name not in LINEAR_BACKENDS:
        raise ValueError(f"linear_backend={name!r} is not one of {LINEAR_BACKENDS}")
    usable = onednn_usable(device, dtype)
    if name == "onednn" and not usable:
        raise ValueError(f"linear_backend='onednn' needs a CPU device and float32 weights (here {device}, {dtype}); "
                         "use linear_backend='torch' or 'auto'")
    if name == "auto":
        return "onednn" if usable else "torch"
    return name


@dataclass(slots=True)
class _Group:
    """One GEMM standing for ``len(splits)`` linear layers that read the same input."""

    weight: torch.Tensor  # [sum(splits), in] plain, or oneDNN's packed copy of it
    bias: torch.Tensor | None  # [sum(splits)]
    splits: list[int]  # each member's out_features, in member order
    onednn: bool
    x: torch.Tensor | None = None  # the input whose outputs are held for the other members
    outs: tuple[torch.Tensor, ...] = ()
    served: int = 0

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn:
            assert _onednn is not None  # a oneDNN group is built only where onednn_usable
            return _onednn(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if len(self.splits) == 1:
            return self.gemm(x)
        if self.x is not x:  # a new input: one GEMM for every member
            self.outs, self.x, self.served = self.gemm(x).split(self.splits, dim=-1), x, 0
        out = self.outs[index]
        self.served += 1
        if self.served == len(self.splits):  # every member has its part: let go of the tensors
            self.x, self.outs = None, ()
        return out


@dataclass(slots=True)
class FusedLinears:
    """The GEMMs of one model's linear layers for one engine (see the module doc)."""

    members: dict[torch.nn.Module, tuple[_Group, int]] = field(default_factory=dict)
    num_merged: int = 0  # groups of more than one linear
    extra_bytes: int = 0  # memory of the packed / stacked weights

    @classmethod
    def build(cls, model: torch.nn.Module, backend: str = "onednn", merge: bool = True) -> FusedLinears:
        """Prepare every ``nn.Linear`` of ``model`` (float32 on the CPU for ``onednn``; ``torch`` only
        merges) and give each the switchable forward."""
        fused = cls()
        onednn = backend == "onednn"
        grouped: set[torch.nn.Module] = set()
        if merge:
            for module in model.modules():
                for names in MERGE_GROUPS:
                    linears = [getattr(module, n, None) for n in names]
                    if _mergeable(linears):
                        fused._add(linears, onednn)
                        grouped.update(linears)
        for module in model.modules():
            # exactly nn.Linear: a subclass may do more in forward (Llama 4's router returns scores and logits)
            if type(module) is torch.nn.Linear and module not in grouped:
                fused._add([module], onednn)
        return fused

    def _add(self, linears: list[torch.nn.Linear], onednn: bool) -> None:
        with torch.no_grad():
            weight = torch.cat([m.weight for m in linears]) if len(linears) > 1 else linears[0].weight
            bias = torch.cat([m.bias for m in linears]) if linears[0].bias is not None else None
            if onednn:
                weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
            elif len(linears) == 1:
                weight = weight.detach()  # the layer's own weight, no copy
        copied = onednn or len(linears) > 1
        self.extra_bytes += sum(m.weight.numel() * m.weight.element_size() for m in linears) if copied else 0
        group = _Group(weight, bias, [m.out_features for m in linears], onednn)
        self.num_merged += len(linears) > 1
        for index, linear in enumerate(linears):
            self.members[linear] = (group, index)
            _install(linear)

    @contextlib.contextmanager
    def active(self) -> Iterator[FusedLinears]:
        """Route this thread's calls of the prepared linears to their GEMMs, for the ``with``."""
        with thread_value(_local, "fused", self):
            try:
                yield self
            finally:
                for group, _ in self.members.values():  # nothing held past the forward pass
                    group.x, group.outs = None, ()


def _mergeable(linears: list[Any]) -> TypeGuard[list[torch.nn.Linear]]:
    """Linears that can share one GEMM: all ``nn.Linear``, one input size, one dtype, all or no bias."""
    if not all(type(m) is torch.nn.Linear for m in linears):
        return False
    first = linears[0]
    return all(m.in_features == first.in_features and m.weight.dtype == first.weight.dtype
               and m.weight.device == first.weight.device and (m.bias is None) == (first.bias is None)
               for m in linears)  # fmt: skip


def _install(linear: torch.nn.Linear) -> None:
    """Give ``linear`` the forward that asks the active ``FusedLinears`` first (once per module)."""
    if "forward" in linear.__dict__:
        return
    own = linear.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        fused = getattr(_local, "fused", None)
        entry = fused.members.get(linear) if fused is not None else None
        if entry is None:
            return own(x)
        return entry[0].output(x, entry[1])

    linear.__dict__["forward"] = forward  # an instance attribute (what nn.Module.__setattr__ makes of it)


class FastModel:
    """What the engine's runner calls in place of the model: the model, with ``fused`` active."""

    def __init__(self, model: torch.nn.Module, fused: FusedLinears) -> None:
        self.model = model
        self.fused = fused

    def __call__(self, *args, **kwargs):
        with self.fused.active():
            return self.model(*args, **kwargs)


def accelerate(model: torch.nn.Module, linear_backend: str, merge: bool, device: torch.device,
               dtype: torch.dtype) -> tuple[torch.nn.Module | FastModel, FusedLinears | None]:
    """What the engine's runner should call for ``model`` under ``EngineConfig.linear_backend`` /
    ``merge_projections``, and the prepared linears (None: the model's own, unchanged)."""
    backend = resolve_linear_backend(linear_backend, device, dtype)
    if backend == "torch" and not merge:
        return model, None
    fused = FusedLinears.build(model, backend, merge)
    return FastModel(model, fused), fused
