"""The probe: what a model's attention layers do, measured before ``Engine()`` accepts the model.

``probe_model(model)`` runs a few forward passes of one or two tokens with a probe attention (and, for
the first, a probe mask function) registered in transformers' interfaces:

1. **One token.** Every attention call is recorded: its module, the shapes of query, key and value
   (heads and head sizes, per layer), its keyword arguments (``sliding_window``, ``s_aux``/``sinks``,
   ``softcap``, ``is_causal``, ``dropout``, ``scaling``, anything else) and the mask the model built for
   it. The probe mask function receives transformers' own ``mask_function`` for each mask the model
   asks for (causal, sliding window, chunked, bidirectional, ...) and reads the pattern off it
   (``masks.read_pattern``). That gives one ``LayerSpec`` per call; anything the kernels do not
   implement is refused, naming the layer and the feature.
2. **Two one-token sequences packed as the engine packs a step**, ``[A, B]`` at positions ``[0, 0]``,
   then ``[C, B]``, then ``B`` alone: B's logits may depend neither on A (tokens mixed outside the
   attention: recurrent or convolution layers, attention the model computes itself) nor on B's index in
   the batch (positions counted rather than read from ``position_ids``).
3. **One sequence of ``DENSE_LEN`` tokens**, attended by the probe exactly as the measured layer specs
   say (causal, windows, chunks, softcaps, sinks; each key counted), against the model's own attention
   implementation on the same tokens: in float32 the logits must agree (``DENSE_TOL``), so a layer whose
   semantics the probe misread is refused rather than run wrong.

Transformers' own cache is checked too: a layer whose cache would keep fewer tokens than its mask reads
(a ``sliding_window`` in the config with a full mask, as Moshi has) generates differently from its
own forward pass, and kvscope cannot match both.

A refusal is an ``UnsupportedModelError`` (a ``ValueError``); the model's attention implementation
and training mode are then restored. On success the model is left set to the "kvscope" attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from . import attention
from .attention import UnsupportedModelError, sink_logits
from .config import LayerSpec, max_positions
from .masks import MaskPattern, read_pattern

DENSE_LEN = 64
DENSE_TOL = 1e-3  # |logits - own logits| <= DENSE_TOL * (1 + max |own logits|), float32 models
PROBE_NAME = "kvscope_probe"  # attention only (the engine's steps build no masks either)
PROBE_MASK_NAME = "kvscope_probe_masks"  # attention and masks: the first pass
MAX_PATTERN_LEN = 1 << 20  # positions over which mask patterns are read
# keyword arguments a layer may pass that do not change what attention computes
IGNORED_KWARGS = frozenset({
    "position_ids", "cache_position", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
    "output_attentions", "use_cache", "past_key_values", "cache", "position_embeddings", "return_dict",
    "layer_idx", "logits_to_keep", "token_type_ids", "output_hidden_states",
})  # fmt: skip
HANDLED_KWARGS = frozenset({"sliding_window", "s_aux", "sinks", "softcap", "is_causal"})


@dataclass(slots=True)
class _Call:
    module: torch.nn.Module
    query: torch.Tensor  # [1, Hq, T, D]
    key: torch.Tensor  # [1, Hkv, T, D]
    spec: LayerSpec


@dataclass(slots=True)
class _Probe:
    """What the probe attention sees in one forward pass."""

    model_type: str
    max_len: int
    mode: str  # "inspect" (the first pass: read masks and keyword arguments), "separate" or "dense"
    layers: tuple[LayerSpec, ...] = ()  # the inspected specs, for "dense"
    calls: list[_Call] = field(default_factory=list)
    patterns: dict[int, MaskPattern | UnsupportedModelError] = field(default_factory=dict)  # mask storage ->

    def refuse(self, reason: str, fix: str | None = None) -> UnsupportedModelError:
        return UnsupportedModelError(self.model_type, reason, fix)


_active: list[_Probe] = []  # the probe of the forward pass running now (the engine probes on one thread)


def _probe_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                mask_function=None, attention_mask=None, **kwargs) -> torch.Tensor:  # fmt: skip
    """The mask interface during the first pass: read the pattern, return a stand-in mask whose
    storage identifies it when a layer passes it on."""
    probe = _active[-1]
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
    probe = _active[-1]
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
    probe.calls.append(_Call(module, query, key, spec))

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
                               f"({type(attention_mask).__name__}), not one of transformers' mask functions")  # fmt: skip
    window = kwargs.get("sliding_window")
    if window is not None and window != pattern.window and not (attention_mask is None and pattern.window is None):
        raise probe.refuse(f"{where} passes sliding_window={window} but its mask has a window of {pattern.window}")
    if attention_mask is None and window:  # the layer asks for a window but builds no mask: take the window
        pattern = MaskPattern(window=int(window))
    return LayerSpec(num_heads, num_kv_heads, head_dim, head_dim_v if head_dim_v != head_dim else 0,
                     pattern.window, pattern.chunk, float(softcap) if softcap else None, has_sinks)  # fmt: skip


def _register() -> None:
    AttentionInterface.register(PROBE_NAME, _probe_attention)
    AttentionInterface.register(PROBE_MASK_NAME, _probe_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(PROBE_MASK_NAME, _probe_mask)


def _forward(model, probe: _Probe, token_ids: list[int], positions: list[int]) -> torch.Tensor:
    """One probe pass, called as the engine calls the model; returns the logits ``[T, vocab]``."""
    from .runner import call_model

    device = next(model.parameters()).device
    _active.append(probe)
    try:
        ids = torch.tensor([token_ids], device=device)
        logits = call_model(model, ids, torch.tensor([positions], device=device), None)
    except UnsupportedModelError:
        raise
    except Exception as exc:
        raise probe.refuse(f"its forward pass fails under kvscope's probe ({type(exc).__name__}: "
                           f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''})") from exc  # fmt: skip
    finally:
        _active.pop()
    return logits.float()


def probe_model(model: torch.nn.Module, max_len: int | None = None) -> tuple[LayerSpec, ...]:
    """Measure ``model``'s attention layers (see the module doc); returns one ``LayerSpec`` per call.
    Raises ``UnsupportedModelError`` (model untouched) or leaves the model on the "kvscope" attention."""
    config = model.config
    model_type = getattr(config, "model_type", None) or type(model).__name__
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    max_len = min(max_len or max_positions(text), MAX_PATTERN_LEN)
    saved_impl, saved_training = getattr(config, "_attn_implementation", None), model.training
    _register()
    attention.register()
    vocab = getattr(text, "vocab_size", None) or 8
    a, b, c = vocab // 2, vocab // 2 + 1, vocab // 3  # ordinary tokens (special ones sit at the ends)
    try:
        model.eval()
        try:
            model.set_attn_implementation(PROBE_MASK_NAME)
        except Exception as exc:
            raise UnsupportedModelError(model_type, f"it does not take a custom attention implementation ({exc})") from None
        first = _Probe(model_type, max_len, "inspect")
        with torch.inference_mode():
            _forward(model, first, [a], [0])
            if not first.calls:
                raise first.refuse(
                    "its layers never call transformers' AttentionInterface (they compute attention "
                    "themselves, as Bloom, Falcon, GPT-Neo or MPT do), so kvscope cannot page their KV cache",
                    "use a model whose attention goes through transformers' AttentionInterface (docs/models.md)")  # fmt: skip
            layers = tuple(call.spec for call in first.calls)
            _check_repeats(first)
            _check_cache(model, first, layers)
            model.set_attn_implementation(PROBE_NAME)
            passes = [_Probe(model_type, max_len, "separate") for _ in range(3)]
            ab = _forward(model, passes[0], [a, b], [0, 0])
            cb = _forward(model, passes[1], [c, b], [0, 0])
            alone = _forward(model, passes[2], [b], [0])
            _check_dense(model, first, layers, saved_impl, vocab)
        shapes = [_shape(x.spec) for x in first.calls]
        for p in passes:
            if [_shape(x.spec) for x in p.calls] != shapes:
                raise first.refuse(f"it calls the attention {len(p.calls)} times in one pass and {len(shapes)} "
                                   "in another, or with other shapes: its layers depend on the input")  # fmt: skip
        tol = 1e-4 if next(model.parameters()).dtype == torch.float32 else 3e-2
        if _differs(ab[1], cb[1], tol):
            raise first.refuse("a token's output depends on the token packed before it in another sequence: "
                               "the model mixes tokens outside its attention (recurrent, convolution or "
                               "state-space layers)", "run it with transformers itself")  # fmt: skip
        if _differs(ab[1], alone[0], tol) or _rows_differ(passes[0], 1, passes[2], 0, tol):
            raise first.refuse("a token's output depends on its index in the batch, not on its position_ids "
                               "(the model counts positions itself)", "run it with transformers itself")  # fmt: skip
        model.set_attn_implementation(attention.ATTN_NAME)
    except BaseException:
        _restore(model, saved_impl, saved_training)
        raise
    return layers


def _check_dense(model, first: _Probe, layers: tuple[LayerSpec, ...], own_impl, vocab: int) -> None:
    """Pass 3 (module doc): a DENSE_LEN-token sequence through the probe's reading of the layers, and, for
    float32 models, through the model's own attention implementation; the logits must agree."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, max(4, vocab - 1), (DENSE_LEN,), generator=gen).tolist()
    dense = _Probe(first.model_type, first.max_len, "dense", layers)
    ours = _forward(model, dense, tokens, list(range(DENSE_LEN)))
    if [_shape(x.spec) for x in dense.calls] != [_shape(x) for x in layers]:
        raise first.refuse(f"it calls the attention {len(dense.calls)} times for {DENSE_LEN} tokens but "
                           f"{len(layers)} times for 1, or with other shapes (keys added or dropped)")  # fmt: skip
    if next(model.parameters()).dtype != torch.float32:
        return
    model.set_attn_implementation(own_impl or "eager")
    try:
        own = _forward(model, _Probe(first.model_type, first.max_len, "own"), tokens, list(range(DENSE_LEN)))
    except UnsupportedModelError:
        return  # its own implementation does not run this way: nothing to compare with
    finally:
        model.set_attn_implementation(PROBE_NAME)
    gap = float((ours - own).abs().max())
    if gap > DENSE_TOL * (1.0 + float(own.abs().max())):
        raise first.refuse(f"over {DENSE_LEN} tokens its logits under the attention kvscope measured differ "
                           f"from its own attention's by {gap:.3g}: some layer does more than the probe sees")  # fmt: skip


def _check_cache(model, probe: _Probe, layers: tuple[LayerSpec, ...]) -> None:
    """transformers' cache for the model must keep every token a layer's mask reads (see the module doc)."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
        sliding, cache_layers = list(cache.is_sliding), list(cache.layers)
    except Exception:  # the model builds another kind of cache: nothing to compare with
        return
    for n, (call, spec) in enumerate(zip(probe.calls, layers)):
        idx = getattr(call.module, "layer_idx", None)
        if not isinstance(idx, int) or not 0 <= idx < len(sliding) or not sliding[idx]:
            continue
        kept = getattr(cache_layers[idx], "sliding_window", None)
        reads = spec.sliding_window or spec.attention_chunk
        if kept and (reads is None or reads > kept):
            raise probe.refuse(
                f"attention call {n} (layer {idx}) reads {'all earlier tokens' if reads is None else reads} "
                f"through its mask, but transformers' cache for it keeps only the last {kept}, so its own "
                "generate differs from its forward pass and kvscope cannot match both",
                "fix the config (sliding_window / layer_types) so that mask and cache agree")  # fmt: skip


def _check_repeats(probe: _Probe) -> None:
    """A module may call the attention twice in one pass only with the same keys (DiffLlama's two value
    halves); calling it again with new keys is a looped model whose cache transformers shares per layer."""
    seen: dict[int, torch.Tensor] = {}
    for call in probe.calls:
        earlier = seen.setdefault(id(call.module), call.key)
        if earlier is not call.key and not torch.equal(earlier, call.key):
            raise probe.refuse(f"{type(call.module).__name__} runs several times per forward pass with new keys "
                               "(a looped / recurrent-depth model), whose cache kvscope cannot lay out")  # fmt: skip


def _shape(spec: LayerSpec) -> tuple[int, int, int, int]:
    return spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.value_dim


def _rows_differ(first: _Probe, i: int, second: _Probe, j: int, tol: float) -> bool:
    """Whether token ``i`` of one pass and token ``j`` of another reach some attention call with other
    queries or keys (rotary embeddings leave a lone token's output alone: its queries and keys do not)."""
    for a, b in zip(first.calls, second.calls):
        for x, y in ((a.query, b.query), (a.key, b.key)):
            if _differs(x[0, :, i].float(), y[0, :, j].float(), tol):
                return True
    return False


def _differs(x: torch.Tensor, y: torch.Tensor, tol: float) -> bool:
    return bool((x - y).abs().max() > tol * (1.0 + y.abs().max()))


def _restore(model, impl, training: bool) -> None:
    try:
        model.set_attn_implementation(impl or "eager")
    except Exception:  # the model never took another one: leave the config as it was
        model.config._attn_implementation = impl
    model.train(training)
