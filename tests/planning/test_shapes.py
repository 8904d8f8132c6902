"""Model shapes (kvscope/planning/shapes.py): a model folder's config.json read into a ``ModelShape``, and the
known shapes, the one list that the planner plans and the simulator simulates."""

from __future__ import annotations

import json

import pytest

from kvscope.planning.planner import make_plan
from kvscope.planning.shapes import KNOWN_MODELS, ModelShape, known_shape, shape_from_config, shape_of_config


def test_shape_from_config_folder(tmp_path):
    cfg = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
           "max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # a safetensors file whose header declares two tensors: 10x20 and 5 elements
    header = json.dumps({"a": {"dtype": "F16", "shape": [10, 20], "data_offsets": [0, 400]},
                         "b": {"dtype": "F16", "shape": [5], "data_offsets": [400, 410]},
                         "__metadata__": {"format": "pt"}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 410)
    shape = shape_from_config(tmp_path)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (28, 4, 128)
    assert shape.num_params == 205
    assert make_plan(shape).kv_bytes_per_token == make_plan(known_shape("qwen2.5-7b")).kv_bytes_per_token
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        shape_from_config(tmp_path)
    with pytest.raises(ValueError, match=r"no config\.json"):
        shape_from_config(tmp_path / "missing")


def test_sliding_layers_from_config(tmp_path):
    base = {"num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}
    cases = [
        ({"sliding_window": 512, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}, (512, 5)),
        ({"sliding_window": 512, "sliding_window_pattern": 3}, (512, 4)),  # layers 2 and 5 are full
        ({"sliding_window": 4096}, (4096, 6)),  # Mistral: every layer
        ({"sliding_window": 4096, "use_sliding_window": False}, (0, 0)),  # Qwen 2: a window it does not use
        ({"sliding_window": 4096, "max_position_embeddings": 4096}, (0, 0)),  # never bites: full attention
        ({"sliding_window": 4096, "max_position_embeddings": 32768}, (4096, 6)),
        ({"sliding_window": None}, (0, 0)),
    ]
    for extra, expected in cases:
        (tmp_path / "config.json").write_text(json.dumps({**base, **extra}))
        shape = shape_from_config(tmp_path)
        assert (shape.sliding_window, shape.num_sliding_layers) == expected, extra
    with pytest.raises(ValueError, match="--sliding-layers at most --layers"):
        make_plan(ModelShape("x", 4, 2, 8, sliding_window=16, num_sliding_layers=5))


def test_known_shapes_give_their_query_heads():
    """Each known shape's query heads, as its note states them (what the roofline's attention FLOPs count)."""
    heads = {name: shape.num_heads for name, shape in KNOWN_MODELS.items()}
    assert heads == {"llama-7b": 32, "llama-13b": 40, "llama-70b": 64, "llama-3-8b": 32, "llama-3-70b": 64,
                     "mistral-7b": 32, "gemma-2-9b": 16, "gpt-oss-20b": 64, "qwen2.5-0.5b": 14, "qwen2.5-7b": 28,
                     "qwen2.5-14b": 40, "gpt2": 12, "smollm2": 9, "tiny": 4}
    for shape in KNOWN_MODELS.values():
        assert shape.num_heads % shape.num_kv_heads == 0, shape.name
    assert known_shape("Llama-2-70B") is KNOWN_MODELS["llama-70b"]


def test_shape_of_config_reads_the_query_heads_and_refuses_a_non_decoder():
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 256}
    shape = shape_of_config(cfg, "m", num_params=7, note="given")
    assert shape == ModelShape("m", 4, 2, 32, 8, 7, 0, "given")
    assert shape_of_config({"hidden_size": 256}, "m") is None
