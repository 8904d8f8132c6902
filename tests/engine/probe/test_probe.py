"""The probe at Engine(): it measures each attention layer (heads, head sizes, windows, chunks, sinks,
softcaps) on the model itself, and refuses, with the reason and before anything is built, a model that
kvscope would run wrong; the refused model is left as it was."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_greedy
from transformers import AutoModelForCausalLM

from kvscope import Engine, SamplingParams
from kvscope.engine.config import LayerSpec, ModelSpec
from kvscope.engine.probe import calls as probe_calls
from kvscope.engine.probe import probe as probe_module
from kvscope.engine.probe.probe import probe_model
from kvscope.engine.worker.attention import UnsupportedModelError
from kvscope.models.loader import build_tiny_model
from kvscope.models.zoo import tiny_config, tiny_model


def refusal(model) -> UnsupportedModelError:
    impl, training = model.config._attn_implementation, model.training
    with pytest.raises(UnsupportedModelError) as info:
        Engine(model, num_blocks=16)
    assert model.config._attn_implementation == impl and model.training == training  # left as it was
    assert isinstance(info.value, ValueError) and "Fix:" in str(info.value)
    return info.value


def test_measures_heads_and_head_sizes_per_layer():
    assert probe_model(build_tiny_model("llama")) == (LayerSpec(4, 2, 16), LayerSpec(4, 2, 16))
    mqa = probe_model(tiny_model("gpt_bigcode"))  # multi-query: one KV head, no num_key_value_heads attribute
    assert {(x.num_heads, x.num_kv_heads) for x in mqa} == {(4, 1)}
    mla = probe_model(tiny_model("deepseek_v3"))  # keys of nope + rope dims, values of their own size
    assert {(x.head_dim, x.value_dim) for x in mla} == {(32, 16)}
    gemma4 = probe_model(tiny_model("gemma4_text"))  # its global layers have heads twice as wide
    assert [x.head_dim for x in gemma4] == [16, 16, 16, 16, 16, 32]


def test_reads_windows_chunks_softcaps_and_sinks():
    gemma2 = probe_model(tiny_model("gemma2"))
    assert [(x.sliding_window, x.softcap) for x in gemma2] == [(16, 50.0), (None, 50.0)]
    assert [x.sinks for x in probe_model(tiny_model("gpt_oss"))] == [True, True]
    assert [x.attention_chunk for x in probe_model(tiny_model("llama4_text"), 512)] == [16, 16, 16, None]
    assert len(probe_model(tiny_model("diffllama"))) == 4  # two attention calls per layer, two KV layers each


def test_kv_bytes_are_summed_over_measured_layers():
    engine = Engine(tiny_model("gemma4_text"), num_blocks=8)
    per_token = sum(2 * x.num_kv_heads * x.head_dim for x in engine.spec.layers) * 4
    assert engine.spec.kv_bytes_per_token == per_token
    assert engine.runner.kv_cache_bytes == 8 * 16 * per_token
    assert [k.shape[-1] for k, _ in engine.runner.kv_caches] == [16] * 5 + [32]
    spec = ModelSpec.from_layers((LayerSpec(4, 2, 32, 16, sliding_window=8), LayerSpec(4, 2, 32)),
                                 build_tiny_model().config, torch.float16)  # fmt: skip
    assert spec.kv_bytes_per_token == 2 * (32 + 16) * 2 + 2 * 64 * 2
    assert spec.kv_bytes_for_tokens(100) == (8 * 2 * 48 + 100 * 2 * 64) * 2  # the window keeps 8 tokens


def test_a_model_outside_the_attention_interface_is_refused():
    error = refusal(tiny_model("bloom"))
    assert error.model_type == "bloom" and "never call transformers' AttentionInterface" in str(error)


def test_token_mixing_and_counted_positions_are_refused():
    """A layer that mixes tokens (here: adds the previous token's hidden state, like a convolution) or a
    model that counts positions instead of reading position_ids would run wrong on packed batches."""
    mixing = build_tiny_model("llama")
    mlp = mixing.model.layers[0].mlp
    forward = mlp.forward
    mlp.forward = lambda x: forward(x) + torch.nn.functional.pad(x, (0, 0, 1, 0))[:, :-1]
    assert "mixes tokens outside its attention" in str(refusal(mixing))

    counting = build_tiny_model("llama")
    inner = counting.model.forward
    counting.model.forward = lambda *a, position_ids=None, **k: inner(*a, **k)  # drops position_ids
    assert "depends on its index in the batch" in str(refusal(counting))


def test_unknown_keyword_arguments_bidirectional_masks_and_loops_are_refused():
    model = build_tiny_model("llama")
    attn = model.model.layers[1].self_attn
    attn.register_forward_pre_hook(lambda m, a, k: (a, {**k, "position_bias": torch.ones(1)}), with_kwargs=True)
    error = refusal(model)
    assert "attention call 1" in str(error) and "passes position_bias" in str(error)

    bidirectional = build_tiny_model("llama")
    bidirectional.config.is_causal = False
    assert "lets queries see later tokens" in str(refusal(bidirectional))

    looped = build_tiny_model("llama")
    looped.model.layers.append(looped.model.layers[0])  # the same layer again, on new keys
    looped.config.num_hidden_layers = 3
    assert "runs several times per forward pass with new keys" in str(refusal(looped))


def test_a_cache_that_keeps_less_than_the_mask_reads_is_refused():
    """Moshi's config has a sliding window that its cache applies but its mask does not: transformers'
    own generate then differs from its forward pass."""
    assert "transformers' cache for it keeps only the last 16" in str(refusal(tiny_model("moshi")))


def test_kv_sharing_layers_are_refused():
    """Gemma 3n's last layers read earlier layers' K/V from transformers' cache (a forward pass without
    one computes their own): generate and forward differ, so kvscope refuses rather than pick one."""
    config = tiny_config("gemma3_text")
    config.num_kv_shared_layers = 2
    model = AutoModelForCausalLM.from_config(config).eval()
    assert "reuse earlier layers' keys and values" in str(refusal(model))


def test_a_misread_layer_is_caught_by_the_dense_pass(monkeypatch):
    """Should the probe misread a layer (here: forced to miss Gemma 3's windows), the 64-token pass
    against the model's own attention refuses the model rather than run it wrong."""
    real = probe_calls._layer_spec

    def without_window(*args, **kwargs):
        spec = real(*args, **kwargs)
        return LayerSpec(spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.head_dim_v)

    monkeypatch.setattr(probe_calls, "_layer_spec", without_window)
    monkeypatch.setattr(probe_module, "_check_cache", lambda *args: None)  # which would notice first
    assert "differ from its own attention's" in str(refusal(tiny_model("gemma3_text")))


def test_accepted_model_runs_without_kwargs_reaching_its_layers():
    """Nemotron's decoder layers do not hand keyword arguments down to the attention; the step's
    metadata reaches it anyway (a thread-local), and the tokens equal transformers'."""
    model = tiny_model("nemotron")
    prompt = list(range(5, 40))
    ref = hf_greedy(model, prompt, 6)
    engine = Engine(model, num_blocks=32, block_size=4)
    assert engine.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids == ref


def test_positions_counted_outside_position_ids_limit_the_length():
    """Llama 4's temperature tuning of its NoPE layers counts positions in the batch: exact below
    floor_scale - 1 tokens only, so a longer max_model_len (or token budget) is refused, saying so."""
    model = tiny_model("llama4_text")
    error = refusal(model)  # max_model_len defaults to its 131072 positions
    assert "temperature tuning" in str(error) and "max_model_len <= 8191" in str(error)
    with pytest.raises(UnsupportedModelError, match="max_num_batched_tokens <= 8191"):
        Engine(model, num_blocks=16, max_model_len=4096, max_num_batched_tokens=10_000)
    assert Engine(model, num_blocks=16, max_model_len=8191).max_model_len == 8191


def test_a_window_as_long_as_the_positions_is_full_attention():
    """Mistral's 4096-token window over 4096 positions (here 48 over 48) can never bite: the probe reads a
    full mask over every position, takes the layer as full attention and runs it token-identical to
    transformers' generate. A window shorter than the sequences, given to a layer whose mask has none,
    is still refused."""
    config = tiny_config("mistral")
    config.sliding_window = config.max_position_embeddings = 48
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    prompt = list(range(5, 25))
    ref = hf_greedy(model, prompt, 24)  # to position 43 of 48
    engine = Engine(model, num_blocks=32, block_size=4)
    assert {x.sliding_window for x in engine.spec.layers} == {None}
    assert engine.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True))[0].token_ids == ref

    config.sliding_window = 47  # one short of the positions: the mask has the window, and it is kept
    windowed = AutoModelForCausalLM.from_config(config).eval()
    assert {x.sliding_window for x in probe_model(windowed)} == {47}
    assert {x.sliding_window for x in probe_model(windowed, max_len=40)} == {None}  # no sequence reaches it
    llama = build_tiny_model("llama")  # its mask is full; a layer that asks for a window of 8 is refused
    attn = llama.model.layers[0].self_attn
    attn.register_forward_pre_hook(lambda m, a, k: (a, {**k, "sliding_window": 8}), with_kwargs=True)
    assert "passes sliding_window=8 but its mask has a window of None" in str(refusal(llama))


def test_a_model_that_appends_compressed_keys_is_refused_at_engine():
    """DeepSeek V4's compressed attention appends one key per 128 tokens (heavily compressed) or per 4:
    with only 128-token layers the 64-token dense pass sees nothing, and the first step of a long prompt
    failed with "193 keys for 192 queries". The config shows it: refused at Engine(), naming why."""
    pytest.importorskip("transformers.models.deepseek_v4")
    config = tiny_config("deepseek_v4")
    config.layer_types = ["heavily_compressed_attention"] * config.num_hidden_layers
    model = AutoModelForCausalLM.from_config(config).eval()
    error = refusal(model)
    assert error.model_type == "deepseek_v4" and "appends compressed keys" in str(error)
    assert "one per 128 tokens" in str(error)
    assert "one per 4 tokens" in str(refusal(tiny_model("deepseek_v4")))  # its default layers: both kinds
