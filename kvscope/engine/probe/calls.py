"""The recording side of the probe (``kvscope.engine.probe.probe``): a probe attention and a probe mask function,
registered in transformers' interfaces under their own names, that record what every attention call of a
forward pass receives and attend as the probe's pass needs.

- "inspect" (the first, one-token pass): check each call's shapes, scaling, dropout and keyword arguments,
  and read the mask transformers built for it (``masks.read_pattern`` on the mask function); each call
  becomes a ``LayerSpec``, or the model is refused naming the call and the feature;
- "separate": every token is its own one-token sequence (it sees itself, and the sink);
- "dense": one sequence, attended exactly as the inspected ``LayerSpec`` of each call says.

``forward`` calls the model as the engine does (``runner.call_model``) with a ``ProbePass`` active on this
thread.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from kvscope.engine.config import LayerSpec
from kvscope.engine.probe.masks import MaskPattern, read_pattern
from kvscope.engine.worker.attention import UnsupportedModelError, sink_logits

PROBE_NAME = "kvscope_probe"  # attention only (the engine's steps build no masks either)
PROBE_MASK_NAME = "kvscope_probe_masks"  # attention and masks: the first pass
# keyword arguments a layer may pass that do not change what attention computes
IGNORED_KWARGS = frozenset({
    "position_ids", "cache_position", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
    "output_attentions", "use_cache", "past_key_values", "cache", "position_embeddings", "return_dict",
    "layer_idx", "logits_to_keep", "token_type_ids", "output_hidden_states",
})  # fmt: skip
HANDLED_KWARGS = frozenset({"sliding_window", "s_aux", "sinks", "softcap", "is_causal"})


@dataclass(slots=True)
class ProbeCall:
    module: torch.nn.Module
    query: torch.Tensor  # [1, Hq, T, D]
    key: torch.Tensor  # [1, Hkv, T, D]
    spec: LayerSpec


@dataclass(slots=True)
class ProbePass:
    """What the probe attention sees in one forward pass."""

    model_type: str
    max_len: int
    mode: str  # "inspect" (the first pass: read masks and keyword arguments), "separate" or "dense"
    layers: tuple[LayerSpec, ...] = ()  # the inspected specs, for "dense"
    calls: list[ProbeCall] = field(default_factory=list)
    patterns: dict[int, MaskPattern | UnsupportedModelError] = field(default_factory=dict)  # mask storage ->

    def refuse(self, reason: str, fix: str | None = None) -> UnsupportedModelError:
        return UnsupportedModelError(self.model_type, reason, fix)


_local = threading.local()  # .active: the probes of the forward passes running now on this thread


def _current() -> ProbePass:
    return _local.active[-1]


def _probe_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                mask_function=None, attention_mask=None, **kwargs) -> torch.Tensor:  # fmt: skip
    """The mask interface during the first pass: read the pattern, return a stand-in mask whose
    storage identifies it when a layer passes it on."""
    probe = _current()
    pattern: MaskPattern | UnsupportedModelError
    try:  # a mask no layer uses (a cross-attention one, say) must not refuse the model: keep the reason
        if attention_mask is not None and not bool(torch.as_tensor(attention_mask).all()):
            raise probe.refuse("its attention mask hides tokens of a one-token probe (a padding or custom mask)")
        pattern = read_pattern(mask_function, probe.max_len, probe.refuse)
    except UnsupportedModelError as exc:
        pattern = exc
    mask = torch.ones(batch_size, 1, q_length, kv_length, dtype=torch.bool, device=kwargs.get("device", "cpu"))
    probe.patterns[mask.untyped_storage().data_ptr()] = pattern
    return mask


def _probe_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Record the call; attend as if every token were its own one-token sequence (each sees itself)."""
    probe = _current()
    n = len(probe.calls)
    where = f"attention call {n} ({type(module).__name__}, layer_idx={getattr(module, 'layer_idx', None)})"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or query.shape[0] != 1:
        raise probe.refuse(f"{where} got query/key/value of shapes {tuple(query.shape)}, {tuple(key.shape)}, "
                           f"{tuple(value.shape)}; kvscope needs [1, heads, tokens, head_dim]")  # fmt: skip
    _, num_heads, num_tokens, head_dim = query.shape
    num_kv_heads, head_dim_v = key.shape[1], value.shape[3]
    if key.shape[2:] != (num_tokens, head_dim) or value.shape[1:3] != (num_kv_heads, num_tokens) \
            or num_heads % num_kv_heads:  # fmt: skip
        raise probe.refuse(f"{where} got mismatched shapes: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                           f"value {tuple(value.shape)}")  # fmt: skip
    if scaling is not None and (not isinstance(scaling, (int, float)) or not math.isfinite(scaling) or scaling <= 0):
        raise probe.refuse(f"{where} passes scaling={scaling!r}; kvscope takes one positive number per layer")
    if dropout:
        raise probe.refuse(f"{where} asks for attention dropout p={dropout} at inference", "call model.eval()")
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = kwargs.get("sinks")
    sink_rows = None if sinks is None else sink_logits(sinks, num_tokens, num_heads)
    if sinks is not None and sink_rows is None:
        raise probe.refuse(f"{where} passes attention sinks of shape {tuple(sinks.shape)}, which kvscope does "
                           f"not read (it takes [{num_heads}] or [1, {num_heads}, tokens, 1])")  # fmt: skip
    softcap = kwargs.get("softcap") or None
    if probe.mode == "inspect":
        spec = _layer_spec(probe, where, module, attention_mask, kwargs, num_heads, num_kv_heads, head_dim,
                           head_dim_v, softcap, sinks is not None)  # fmt: skip
    else:
        spec = LayerSpec(num_heads, num_kv_heads, head_dim, head_dim_v)
    probe.calls.append(ProbeCall(module, query, key, spec))

    scale = head_dim**-0.5 if scaling is None else scaling
    group = num_heads // num_kv_heads
    q = query[0].float()  # [Hq, T, D]
    k = key[0].float().repeat_interleave(group, 0)
    v = value[0].float().repeat_interleave(group, 0)  # [Hq, T, Dv]
    if probe.mode == "dense" and n < len(probe.layers):
        out = _dense_attention(q, k, v, probe.layers[n], scale, softcap, sink_rows)
    else:  # every token is its own one-token sequence: it sees itself (and the sink)
        s = (q * k).sum(-1) * scale  # [Hq, T]
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        weight = torch.ones_like(s) if sink_rows is None else torch.sigmoid(s - sink_rows.t())  # e^s/(e^s+e^sink)
        out = weight[..., None] * v
    return out.to(query.dtype).transpose(0, 1).unsqueeze(0).contiguous(), None  # [1, T, Hq, Dv]


def _dense_attention(q, k, v, spec: LayerSpec, scale: float, softcap, sink_rows) -> torch.Tensor:
    """One sequence, attended as ``spec`` says: q ``[Hq, T, D]``, k ``[Hq, T, D]``, v ``[Hq, T, Dv]``."""
    pos = torch.arange(q.shape[1], device=q.device)
    scores = q @ k.transpose(1, 2) * scale  # [Hq, T, T]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    lo = MaskPattern(spec.sliding_window, spec.attention_chunk).first_visible(pos)
    seen = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= lo[:, None])  # [T, T]
    scores = scores.masked_fill(~seen, float("-inf"))
    if sink_rows is not None:  # [T, Hq]: one more logit per (head, query) that attends to nothing
        scores = torch.cat([scores, sink_rows.t()[:, :, None]], dim=-1)
    return torch.softmax(scores, dim=-1)[..., : q.shape[1]] @ v  # [Hq, T, Dv]


def _layer_spec(probe, where, module, attention_mask, kwargs, num_heads, num_kv_heads, head_dim, head_dim_v,
                softcap, has_sinks) -> LayerSpec:  # fmt: skip
    """The layer's kind from its mask and keyword arguments; refuse what the kernels do not implement."""
    unknown = sorted(k for k, v in kwargs.items() if k not in IGNORED_KWARGS | HANDLED_KWARGS
                     and v is not None and v is not False)  # fmt: skip
    if unknown:
        raise probe.refuse(f"{where} passes {', '.join(unknown)} to its attention, which kvscope does not implement")
    if attention_mask is None:
        pattern = MaskPattern()
        causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
        if causal is False:
            raise probe.refuse(f"{where} attends bidirectionally (is_causal=False)",
                               "kvscope generates with causal decoders only")  # fmt: skip
    else:
        storage = attention_mask.untyped_storage().data_ptr() if isinstance(attention_mask, torch.Tensor) else None
        pattern = probe.patterns.get(storage)
        if isinstance(pattern, UnsupportedModelError):
            raise probe.refuse(f"{where}: {pattern.reason}")
        if pattern is None:
            raise probe.refuse(f"{where} gets an attention mask the model built or changed itself "
                               f"({type(attention_mask).__name__}), not one of transformers' mask functions")
    window = kwargs.get("sliding_window")
    if window is not None and pattern.window is None and window >= probe.max_len:
        window = None  # as long as every sequence (mistral's 4096 of 4096 positions): it never bites, full attention
    if window is not None and window != pattern.window and not (attention_mask is None and pattern.window is None):
        raise probe.refuse(f"{where} passes sliding_window={window} but its mask has a window of {pattern.window}")
    if attention_mask is None and window:  # the layer asks for a window but builds no mask: take the window
        pattern = MaskPattern(window=int(window))
    return LayerSpec(num_heads, num_kv_heads, head_dim, head_dim_v if head_dim_v != head_dim else 0,
                     pattern.window, pattern.chunk, float(softcap) if softcap else None, has_sinks)  # fmt: skip


def register() -> None:
    AttentionInterface.register(PROBE_NAME, _probe_attention)
    AttentionInterface.register(PROBE_MASK_NAME, _probe_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(PROBE_MASK_NAME, _probe_mask)


def forward(model, probe: ProbePass, token_ids: list[int], positions: list[int]) -> torch.Tensor:
    """One probe pass, called as the engine calls the model; returns the logits ``[T, vocab]``."""
    from kvscope.engine.worker.model_runner import call_model

    device = next(model.parameters()).device
    stack = _local.__dict__.setdefault("active", [])
    stack.append(probe)
    try:
        ids = torch.tensor([token_ids], device=device)
        logits = call_model(model, ids, torch.tensor([positions], device=device), None)
    except UnsupportedModelError:
        raise
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise probe.refuse(f"its forward pass fails under kvscope's probe ({type(exc).__name__}: "
                           f"{first_line})") from exc
    finally:
        stack.pop()
    return logits.float()


