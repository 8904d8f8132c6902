"""Tiny random models of any registered causal-LM type (kvscope.models.zoo, used by the model sweep)."""

from __future__ import annotations

import pytest
import torch

from kvscope.models.zoo import BuildError, causal_lm_types, tiny_config, tiny_model


def test_every_causal_lm_type_of_transformers_is_listed():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = causal_lm_types()
    assert types == sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) and {"llama", "gemma2", "gpt_oss"} <= set(types)


def test_sizes_shrink_and_one_layer_of_each_kind_is_kept():
    text = tiny_config("gemma3_text")
    assert (text.hidden_size, text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (64, 4, 2, 16)
    assert text.vocab_size == 512 and text.sliding_window == 16
    assert text.layer_types == ["sliding_attention"] * 5 + ["full_attention"]  # Gemma 3's 5:1 pattern
    mla = tiny_config("deepseek_v3")
    assert mla.num_key_value_heads == mla.num_attention_heads  # MLA: K/V per query head
    assert tiny_config("mistral").sliding_window == 16 and tiny_config("qwen2").sliding_window is None
    assert tiny_config("bert").is_decoder  # BERT-style models are causal LMs as decoders


def test_models_are_seeded_and_small():
    a, b = tiny_model("gpt_oss", seed=3), tiny_model("gpt_oss", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), tiny_model("gpt_oss", seed=4).parameters()))
    assert sum(p.numel() for p in a.parameters()) < 2_000_000 and a.dtype == torch.float32 and not a.training


def test_types_that_cannot_be_built_say_why():
    with pytest.raises(BuildError, match="parameters after shrinking"):
        tiny_model("blt")  # counted on the meta device first: never allocated
    with pytest.raises(BuildError, match="no default config"):
        tiny_model("no-such-type")
