"""The probe: what a model's attention layers do, measured before ``Engine()`` accepts the model.

``probe_model(model)`` runs a few forward passes of one or two tokens with a probe attention (and, for
the first, a probe mask function) registered in transformers' interfaces:

1. **One token.** Every attention call is recorded: its module, the shapes of query, key and value
   (heads and head sizes, per layer), its keyword arguments (``sliding_window``, ``s_aux``/``sinks``,
   ``softcap``, ``is_causal``, ``dropout``, ``scaling``, anything else) and the mask the model built for
   it. The probe mask function receives transformers' own ``mask_function`` for each mask the model
   asks for (causal, sliding window, chunked, bidirectional, ...) and reads the pattern off it
   (``masks.read_pattern``; the recording side is ``calls.py``). That gives one ``LayerSpec`` per call;
   anything the kernels do not implement is refused, naming the layer and the feature.
2. **Two one-token sequences packed as the engine packs a step**, ``[A, B]`` at positions ``[0, 0]``,
   then ``[C, B]``, then ``B`` alone: B's logits may depend neither on A (tokens mixed outside the
   attention: recurrent or convolution layers, attention the model computes itself) nor on B's index in
   the batch (positions counted rather than read from ``position_ids``).
3. **One sequence of ``DENSE_LEN`` tokens**, attended by the probe exactly as the measured layer specs
   say (causal, windows, chunks, softcaps, sinks; each key counted), against the model's own attention
   implementation on the same tokens: in float32 the logits must agree (``DENSE_TOL``), so a layer whose
   semantics the probe misread is refused rather than run wrong.

A ``sliding_window`` at least as long as every sequence (the engine's ``max_len``; Mistral's 4096 of 4096
positions) never bites: the probe reads a full mask, and the layer runs as full attention. What the config
alone shows comes first (``_check_config``): positions counted in the batch, KV shared between layers, and
compressed keys appended to a layer's own (DeepSeek V4, one per 4 or 128 tokens: farther apart than the
64-token pass sees). Transformers' own cache is checked too: a layer whose cache would keep fewer tokens
than its mask reads (a ``sliding_window`` in the config with a full mask, as Moshi has) generates
differently from its own forward pass, and kvscope cannot match both.

A refusal is an ``UnsupportedModelError`` (a ``ValueError``); the model's attention implementation
and training mode are then restored. On success the model is left set to the "kvscope" attention.
"""

from __future__ import annotations

from typing import Any

import torch

from kvscope.engine.config import LayerSpec, max_positions
from kvscope.engine.probe.calls import PROBE_MASK_NAME, PROBE_NAME, ProbePass, forward, register
from kvscope.engine.worker import attention
from kvscope.engine.worker.attention import UnsupportedModelError

MAX_PATTERN_LEN = 1 << 20  # positions over which mask patterns are read
DENSE_LEN = 64
DENSE_TOL = 1e-3  # |logits - own logits| <= DENSE_TOL * (1 + max |own logits|), float32 models


def probe_model(model: torch.nn.Module, max_len: int | None = None, max_batch_tokens: int | None = None
                ) -> tuple[LayerSpec, ...]:  # fmt: skip
    """Measure ``model``'s attention layers (see the module doc); returns one ``LayerSpec`` per call.
    ``max_len``: the engine's max_model_len (default: the model's positions); ``max_batch_tokens``: its
    max_num_batched_tokens. Raises ``UnsupportedModelError`` (model untouched) or leaves the model on the
    "kvscope" attention."""
    hf: Any = model  # a transformers PreTrainedModel; to the type checker an nn.Module, whose attributes are Tensors
    config = hf.config
    model_type = getattr(config, "model_type", None) or type(model).__name__
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    _check_config(text, model_type, max(max_len or max_positions(text), max_batch_tokens or 0))
    max_len = min(max_len or max_positions(text), MAX_PATTERN_LEN)
    saved_impl, saved_training = getattr(config, "_attn_implementation", None), model.training
    register()
    attention.register()
    vocab = getattr(text, "vocab_size", None) or 8
    a, b, c = vocab // 2, vocab // 2 + 1, vocab // 3  # ordinary tokens (special ones sit at the ends)
    try:
        model.eval()
        try:
            hf.set_attn_implementation(PROBE_MASK_NAME)
        except Exception as exc:
            raise UnsupportedModelError(model_type,
                                        f"it does not take a custom attention implementation ({exc})") from None
        first = ProbePass(model_type, max_len, "inspect")
        with torch.inference_mode():
            forward(model, first, [a], [0])
            if not first.calls:
                raise first.refuse(
                    "its layers never call transformers' AttentionInterface (they compute attention "
                    "themselves, as Bloom, Falcon, GPT-Neo or MPT do), so kvscope cannot page their KV cache",
                    "use a model whose attention goes through transformers' AttentionInterface (docs/models.md)")
            layers = tuple(call.spec for call in first.calls)
            _check_repeats(first)
            _check_cache(model, first, layers)
            hf.set_attn_implementation(PROBE_NAME)
            passes = [ProbePass(model_type, max_len, "separate") for _ in range(3)]
            ab = forward(model, passes[0], [a, b], [0, 0])
            cb = forward(model, passes[1], [c, b], [0, 0])
            alone = forward(model, passes[2], [b], [0])
            _check_dense(model, first, layers, saved_impl, vocab)
        tol = 1e-4 if next(model.parameters()).dtype == torch.float32 else 3e-2
        _check_separate(first, passes, (ab, cb, alone), tol)
        hf.set_attn_implementation(attention.ATTN_NAME)
    except BaseException:
        _restore(model, saved_impl, saved_training)
        raise
    return layers


def _check_config(text_config, model_type: str, longest: int) -> None:
    """What the config alone shows (a forward pass cannot): positions counted outside ``position_ids``
    beyond ``longest`` tokens, and layers that share KV through transformers' cache."""
    limit = counted_positions_limit(text_config)
    if limit is not None and longest > limit:
        raise UnsupportedModelError(
            model_type, "its attention temperature tuning scales queries by a position it counts in the batch, "
            f"not by position_ids, which matches transformers only below {limit} tokens",
            f"pass max_model_len <= {limit} and max_num_batched_tokens <= {limit}")  # fmt: skip
    rates = compressed_kv_rates(text_config)
    if rates:
        raise UnsupportedModelError(
            model_type, f"its attention appends compressed keys to the layer's own, one per {min(rates)} tokens "
            "of a prefill (DeepSeek V4's compressed / sparse attention), so a call gets more keys than queries; "
            "kvscope's paged cache holds one key per token")  # fmt: skip
    shared = getattr(text_config, "num_kv_shared_layers", 0)
    if isinstance(shared, int) and shared > 0:  # like the cache check, invisible to a forward pass
        raise UnsupportedModelError(
            model_type, f"its last {shared} layers reuse earlier layers' keys and values through transformers' "
            "cache (KV sharing), so its generate differs from its forward pass; kvscope does not share KV")  # fmt: skip


def _check_separate(first: ProbePass, passes: list[ProbePass], logits: tuple, tol: float) -> None:
    """Pass 2 (module doc): the same attention calls in every pass, and B's logits (``logits``: those of
    ``[A, B]``, ``[C, B]`` and ``B`` alone) independent of its neighbour and of its index in the batch."""
    ab, cb, alone = logits
    shapes = [_shape(x.spec) for x in first.calls]
    for p in passes:
        if [_shape(x.spec) for x in p.calls] != shapes:
            raise first.refuse(f"it calls the attention {len(p.calls)} times in one pass and {len(shapes)} "
                               "in another, or with other shapes: its layers depend on the input")  # fmt: skip
    if _differs(ab[1], cb[1], tol):
        raise first.refuse("a token's output depends on the token packed before it in another sequence: "
                           "the model mixes tokens outside its attention (recurrent, convolution or "
                           "state-space layers)", "run it with transformers itself")  # fmt: skip
    if _differs(ab[1], alone[0], tol) or _rows_differ(passes[0], 1, passes[2], 0, tol):
        raise first.refuse("a token's output depends on its index in the batch, not on its position_ids "
                           "(the model counts positions itself)", "run it with transformers itself")  # fmt: skip


def compressed_kv_rates(text_config) -> list[int]:
    """The compression rates of the layer types a model uses that append compressed keys (DeepSeek V4's
    ``compress_rates``: one key per 4 or 128 tokens, too far apart for the probe's 64-token pass to see
    every one), or []."""
    rates = getattr(text_config, "compress_rates", None)
    if not isinstance(rates, dict):
        return []
    used = set(getattr(text_config, "layer_types", None) or rates)
    return sorted(int(r) for kind, r in rates.items() if kind in used and isinstance(r, int) and r > 0)


def counted_positions_limit(text_config) -> int | None:
    """The longest run a model with positions counted outside ``position_ids`` is exact for, or None.

    Llama 4's attention temperature tuning multiplies the queries of its NoPE layers by
    ``log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1`` with ``pos`` counted from 0 over the packed
    batch (no cache): 1, as in transformers, while every position and batch index is below
    ``floor_scale - 1``. Too far out for the probe's short passes to see, so it is read from the config."""
    no_rope_layers = getattr(text_config, "no_rope_layers", None) or ()
    if getattr(text_config, "attn_temperature_tuning", False) and 0 in no_rope_layers:
        return int(getattr(text_config, "floor_scale", 8192)) - 1
    return None


def _check_dense(model, first: ProbePass, layers: tuple[LayerSpec, ...], own_impl, vocab: int) -> None:
    """Pass 3 (module doc): a DENSE_LEN-token sequence through the probe's reading of the layers, and, for
    float32 models, through the model's own attention implementation; the logits must agree."""
    n = min(DENSE_LEN, first.max_len)
    tokens = torch.randint(3, max(4, vocab - 1), (n,), generator=torch.Generator().manual_seed(0)).tolist()
    dense = ProbePass(first.model_type, first.max_len, "dense", layers)
    ours = forward(model, dense, tokens, list(range(n)))
    if [_shape(x.spec) for x in dense.calls] != [_shape(x) for x in layers]:
        raise first.refuse(f"it calls the attention {len(dense.calls)} times for {n} tokens but "
                           f"{len(layers)} times for 1, or with other shapes (keys added or dropped)")  # fmt: skip
    if next(model.parameters()).dtype != torch.float32:
        return
    model.set_attn_implementation(own_impl or "eager")
    try:
        own = forward(model, ProbePass(first.model_type, first.max_len, "own"), tokens, list(range(n)))
    except UnsupportedModelError:
        return  # its own implementation does not run this way: nothing to compare with
    finally:
        model.set_attn_implementation(PROBE_NAME)
    gap = float((ours - own).abs().max())
    if gap > DENSE_TOL * (1.0 + float(own.abs().max())):
        raise first.refuse(f"over {n} tokens its logits under the attention kvscope measured differ "
                           f"from its own attention's by {gap:.3g}: some layer does more than the probe sees")


def _check_cache(model, probe: ProbePass, layers: tuple[LayerSpec, ...]) -> None:
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
        if kept and kept >= probe.max_len:  # it keeps every token a sequence can have: nothing is dropped
            continue
        if kept and (reads is None or reads > kept):
            raise probe.refuse(
                f"attention call {n} (layer {idx}) reads {'all earlier tokens' if reads is None else reads} "
                f"through its mask, but transformers' cache for it keeps only the last {kept}, so its own "
                "generate differs from its forward pass and kvscope cannot match both",
                "fix the config (sliding_window / layer_types) so that mask and cache agree")  # fmt: skip


def _check_repeats(probe: ProbePass) -> None:
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


def _rows_differ(first: ProbePass, i: int, second: ProbePass, j: int, tol: float) -> bool:
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
