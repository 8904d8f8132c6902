"""KV-cache capacity planning: how many requests fit on a GPU, with static reservation and with paging.

The arithmetic of the course chapter, for any model shape:

- KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element;
- KV budget = GPU memory - weights - activation reserve;
- static reservation: every request holds ``max_len`` token slots from admission to the end, so
  concurrency = floor(budget / (max_len x bytes per token));
- paged allocation: a request holds only the blocks its tokens fill, ``ceil(avg_len / block_size)`` of
  them, so concurrency = floor(budget / (blocks x block_size x bytes per token)).

Sliding-window layers (Mistral, Gemma 2/3, gpt-oss: ``sliding_window`` tokens, in ``num_sliding_layers``
of the layers) read only the last ``W`` keys. A static cache gives them ``min(max_len, W)`` slots (as
transformers' static cache does); a paged engine that frees the blocks leaving the window (kvscope,
vLLM) holds at most ``ceil(W / block_size) + 1`` blocks of them per request (a window rarely starts on
a block boundary). The per-request figures then add the full and the sliding layers' parts.

Sizes use binary units throughout (``GB`` == ``GiB``), as ``kvscope.utils.units.parse_bytes`` reads them.

Defaults, one rule for ``kvscope plan`` and ``kvscope simulate --gpu`` / ``--static``
(``kvscope.runs.setup.simulated``), the course chapter's (a 7B Llama in fp16 on a 40 GB GPU: 14 GB of weights,
4 GB reserved, 2048 tokens at most):

- weights (``weights_bytes``): billions of parameters x bytes per parameter, as GiB (the binary units above),
  counting a known model by the size class it is named by (``shapes.SIZE_CLASS_B``: llama-7b is 7B, so 14 GiB in
  fp16; its exact 6.74B would be 12.6 GiB, the rest is headroom for the runtime's own buffers);
- reserve (``DEFAULT_RESERVE``): 4 GiB for activations and the CUDA context;
- the longest sequence (``default_max_len``): 2048 tokens, or the model's maximum if below; a static reservation
  holds that many slots per request.

The model's shape is a ``ModelShape`` (``kvscope.planning.shapes``: the known shapes, a folder's config.json),
its bytes per token ``kvscope.models.hf_config.kv_bytes_per_token``, the formula the engine's ``ModelSpec`` uses.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from kvscope.models.hf_config import kv_bytes_per_token
from kvscope.planning.shapes import KNOWN_MODELS, ModelShape, known_shape, shape_from_config, size_class
from kvscope.utils.units import GiB, fmt_bytes

# The shapes' names, kept importable from here for kvscope plan and the notebooks (their home: planning.shapes)
__all__ = ["DEFAULT_MAX_LEN", "DEFAULT_RESERVE", "DTYPE_BYTES", "KNOWN_MODELS", "ModelShape", "Plan",
           "default_max_len", "fmt_bytes", "known_shape", "make_plan", "render", "shape_from_config", "weights_bytes"]

DEFAULT_RESERVE = 4 * GiB  # activations and the CUDA context: the course's 40 GB - 14 GB of weights - 4 GB
DEFAULT_MAX_LEN = 2048  # the course's longest sequence: what a static reservation holds per request


def default_max_len(model_max: int = 0) -> int:
    """The longest sequence when none is given: ``DEFAULT_MAX_LEN``, or the model's maximum if below it."""
    return min(DEFAULT_MAX_LEN, model_max) if model_max > 0 else DEFAULT_MAX_LEN


def weights_bytes(name: str, num_params: int, nbytes: int) -> tuple[int, str] | None:
    """The weights' memory by the module doc's rule, and how it was counted; ``None`` when the parameter count
    is unknown."""
    size = size_class(name)
    if size:
        exact = f"; exactly {num_params / 1e9:.2f}B" if num_params else ""
        return round(size * nbytes * GiB), f"{size:g}B params x {nbytes} B, its size class{exact}"
    if num_params:
        return round(num_params / 1e9 * nbytes * GiB), f"{num_params / 1e9:.2f}B params x {nbytes} B"
    return None

DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2,
               "fp8": 1, "float8": 1, "int8": 1}


@dataclass(slots=True)
class Plan:
    """Every number of a capacity plan (bytes unless named otherwise). ``None`` where no GPU memory
    size was given, so only the per-token sizes are known."""

    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int
    kv_bytes_per_token: int
    block_size: int
    kv_bytes_per_block: int
    max_len: int
    avg_len: int
    static_bytes_per_request: int
    blocks_per_request: int
    paged_bytes_per_request: int
    static_waste: float  # share of a static reservation an average request leaves unused
    paged_waste: float  # share of a request's last-block slack in its pages
    sliding_window: int = 0  # 0: every layer keeps every token
    num_sliding_layers: int = 0
    sliding_blocks_per_request: int = 0  # what a sliding layer holds of blocks_per_request
    gpu_mem: int | None = None
    weights: int | None = None
    weights_source: str = ""
    reserve: int | None = None
    kv_budget: int | None = None
    kv_budget_blocks: int | None = None
    kv_budget_tokens: int | None = None
    static_max_requests: int | None = None
    paged_max_requests: int | None = None
    ratio: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def make_plan(shape: ModelShape, *, dtype: str = "fp16", gpu_mem: int | None = None,
              weights: int | None = None, reserve: int = DEFAULT_RESERVE, max_len: int | None = None,
              avg_len: int = 512, block_size: int = 16) -> Plan:
    """The capacity plan. ``weights=None`` counts them by ``weights_bytes``; ``max_len=None`` is
    ``default_max_len`` of the model. Raises ``ValueError`` for inconsistent inputs (the message says which and
    how to fix it)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of fp32, fp16, bf16, fp8")
    if max_len is None:
        max_len = default_max_len(shape.max_position_embeddings)
    if avg_len > max_len:
        raise ValueError(f"--avg-len {avg_len} is above --max-len {max_len}; the average cannot exceed the maximum")
    if shape.num_sliding_layers > shape.num_layers:
        raise ValueError(f"{shape.num_sliding_layers} sliding-window layers is more than the model's "
                         f"{shape.num_layers} layers; give --sliding-layers at most --layers")
    nbytes = DTYPE_BYTES[dtype]
    per_layer = kv_bytes_per_token(1, shape.num_kv_heads, shape.head_dim, nbytes)  # one token in one layer
    per_token = kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, nbytes)
    blocks = -(-avg_len // block_size)  # ceil: the last block may be partly filled
    window, sliding = (shape.sliding_window, shape.num_sliding_layers) if shape.sliding_window else (0, 0)
    full = shape.num_layers - sliding
    sliding_blocks = min(blocks, -(-window // block_size) + 1) if sliding else 0
    static_tokens = full * max_len + sliding * min(max_len, window)  # token slots x layers
    paged_pages = full * blocks + sliding * sliding_blocks  # one layer's pages
    plan = Plan(
        model=shape.name, num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim, dtype=dtype, dtype_bytes=nbytes, kv_bytes_per_token=per_token,
        block_size=block_size, kv_bytes_per_block=per_token * block_size, max_len=max_len, avg_len=avg_len,
        static_bytes_per_request=static_tokens * per_layer, blocks_per_request=blocks,
        paged_bytes_per_request=paged_pages * block_size * per_layer,
        static_waste=1 - (full * min(avg_len, max_len) + sliding * min(avg_len, window)) / static_tokens,
        paged_waste=1 - (full * avg_len + sliding * min(avg_len, window)) / (paged_pages * block_size),
        sliding_window=window, num_sliding_layers=sliding, sliding_blocks_per_request=sliding_blocks,
    )
    if gpu_mem is None:
        return plan
    if weights is None:
        counted = weights_bytes(shape.name, shape.num_params, nbytes)
        if counted is None:
            raise ValueError(f"the weights of {shape.name!r} are unknown: give their size with --weights "
                             "(e.g. --weights 14GiB, or 0 to ignore them)")
        weights, plan.weights_source = counted
    else:
        plan.weights_source = "given"
    budget = gpu_mem - weights - reserve
    if budget < plan.kv_bytes_per_block:
        raise ValueError(
            f"nothing is left for the KV cache: {fmt_bytes(gpu_mem)} of GPU memory minus {fmt_bytes(weights)} of "
            f"weights and {fmt_bytes(reserve)} of reserve is {fmt_bytes(budget)}, less than one block "
            f"({fmt_bytes(plan.kv_bytes_per_block)}); use a larger --gpu-mem or smaller --weights / --reserve")
    plan.gpu_mem, plan.weights, plan.reserve, plan.kv_budget = gpu_mem, weights, reserve, budget
    plan.kv_budget_blocks = budget // plan.kv_bytes_per_block
    plan.kv_budget_tokens = plan.kv_budget_blocks * block_size
    plan.static_max_requests = budget // plan.static_bytes_per_request
    # floor(floor(budget / block) / blocks) == floor(budget / (blocks x block)): whole blocks per request
    plan.paged_max_requests = budget // plan.paged_bytes_per_request
    if plan.static_max_requests:
        plan.ratio = plan.paged_max_requests / plan.static_max_requests
    return plan


def render(plan: Plan, note: str = "") -> str:
    """The plan as a short, readable table for a terminal."""
    p = plan
    lines = [f"kvscope plan · {p.model}" + (f"  ({note})" if note else ""), ""]
    lines.append(f"KV per token     2 x {p.num_layers} layers x {p.num_kv_heads} KV heads x {p.head_dim} head dim "
                 f"x {p.dtype_bytes} B ({p.dtype}) = {p.kv_bytes_per_token:,} B = {fmt_bytes(p.kv_bytes_per_token)}")
    lines.append(f"KV per block     {p.block_size} tokens = {fmt_bytes(p.kv_bytes_per_block)}")
    if p.num_sliding_layers:
        lines.append(f"sliding window   {p.num_sliding_layers} of {p.num_layers} layers read only the last "
                     f"{p.sliding_window} tokens: static keeps min(max-len, {p.sliding_window}) slots there, "
                     f"paged at most {p.sliding_blocks_per_request} blocks (the rest go back to the pool)")
    lines.append(f"static request   max-len {p.max_len} tokens reserved = {fmt_bytes(p.static_bytes_per_request)}"
                 f"  ({p.static_waste:.0%} unused at avg {p.avg_len})")
    blocks = f"{p.blocks_per_request} blocks" + (
        f" ({p.sliding_blocks_per_request} in the sliding layers)" if p.num_sliding_layers else "")
    lines.append(f"paged request    avg {p.avg_len} tokens -> {blocks} x {p.block_size} = "
                 f"{fmt_bytes(p.paged_bytes_per_request)}  ({p.paged_waste:.1%} last-block slack)")
    if p.kv_budget is None or p.gpu_mem is None or p.weights is None or p.reserve is None:  # set together
        lines += ["", "add --gpu-mem (e.g. --gpu-mem 40GiB --weights 14GiB --reserve 4GiB) for concurrency"]
        return "\n".join(lines)
    lines += [
        "",
        f"GPU memory       {fmt_bytes(p.gpu_mem)}",
        f" - weights       {fmt_bytes(p.weights)}  ({p.weights_source})",
        f" - reserve       {fmt_bytes(p.reserve)}  (activations, CUDA context)",
        f" = KV budget     {fmt_bytes(p.kv_budget)} = {p.kv_budget_blocks:,} blocks = {p.kv_budget_tokens:,} tokens",
        "",
        f"static  max concurrent requests = {fmt_bytes(p.kv_budget)} / {fmt_bytes(p.static_bytes_per_request)}"
        f" = {p.static_max_requests}",
        f"paged   max concurrent requests = {fmt_bytes(p.kv_budget)} / {fmt_bytes(p.paged_bytes_per_request)}"
        f" = {p.paged_max_requests}",
    ]
    if p.ratio is not None:
        lines.append(f"paged / static   {p.ratio:.1f}x more requests at the same memory")
    else:
        lines.append("static           not even one max-len request fits: lower --max-len or free memory")
    return "\n".join(lines)
