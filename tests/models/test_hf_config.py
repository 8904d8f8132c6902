"""The one reader of config.json's settings (kvscope/models/hf_config.py): the position limit reads a dict and a
transformers config alike (the engine's loaded model is the latter)."""

from __future__ import annotations

from kvscope.models.hf_config import max_positions


def test_max_positions_reads_a_dict_and_a_transformers_config_alike():
    from kvscope.models.loader import tiny_config

    config = tiny_config()
    assert max_positions(config) == max_positions(config.to_dict()) == config.max_position_embeddings
    assert max_positions({"n_positions": 1024, "max_position_embeddings": True}) == 1024  # a bool is no limit
    assert max_positions({"seq_length": 1}, default=2048) == 2048 == max_positions(object(), default=2048)
