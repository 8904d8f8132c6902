"""SpeculativeConfig: vLLM's names and defaults, and every bad combination refused with the reason."""

from __future__ import annotations

import pytest

from kvscope.engine.spec_decode.config import SpeculativeConfig


def test_ngram_defaults_follow_vllm():
    c = SpeculativeConfig.coerce({"method": "ngram", "num_speculative_tokens": 4})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)  # neither given: 5 and 5
    assert SpeculativeConfig("ngram", 4, prompt_lookup_max=3).prompt_lookup_min == 3  # one given: both
    assert SpeculativeConfig("ngram", 4, prompt_lookup_min=2).prompt_lookup_max == 2
    assert SpeculativeConfig(model="ngram", num_speculative_tokens=2).method == "ngram"
    assert SpeculativeConfig(model="tiny", num_speculative_tokens=2).method == "draft_model"
    assert SpeculativeConfig("ngram", 3, 2, 4).label == "ngram k=3 (n 2-4)"
    assert SpeculativeConfig.coerce(None) is None


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ({"method": "ngram", "num_speculative_tokens": 0}, ValueError, "num_speculative_tokens=0"),
        ({"method": "ngram", "num_speculative_tokens": -2}, ValueError, "between 1 and"),
        ({"method": "ngram", "num_speculative_tokens": 2.5}, TypeError, "num_speculative_tokens"),
        ({"method": "ngram"}, ValueError, "needs num_speculative_tokens"),
        ({"method": "eagle", "num_speculative_tokens": 2}, ValueError, "not one of"),
        ({"num_speculative_tokens": 2}, ValueError, "needs a method"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
         ValueError, "prompt_lookup_min=4 must be <= prompt_lookup_max=2"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, ValueError, "prompt_lookup_min"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "tiny"}, ValueError, "takes no model"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, ValueError, "needs a model"),
        ({"method": "draft_model", "num_speculative_tokens": 2, "model": 3}, TypeError, "model name"),
        ({"method": "draft_model", "model": "tiny", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
         ValueError, "belong to method='ngram'"),
        ({"method": "ngram", "num_speculative_tokens": 2, "k": 3}, ValueError, "unknown keys ['k']"),
        ("ngram:4", TypeError, "must be a dict"),
    ],
)
def test_bad_configs_are_refused_with_the_reason(value, error, words):
    with pytest.raises(error) as info:
        SpeculativeConfig.coerce(value)
    assert words in str(info.value)


def test_describe_is_json_and_names_a_module_by_class():
    import json

    import torch

    c = SpeculativeConfig(model=torch.nn.Linear(2, 2), num_speculative_tokens=3)
    assert json.loads(json.dumps(c.describe()))["model"] == "Linear"
