"""Run options -> engine config: speculative decoding from `kvscope run` and `%kvscope` alike."""

from __future__ import annotations

import pytest
import torch

from kvscope.cli.main import build_parser as build_cli_parser
from kvscope.engine.spec_decode.config import SpeculativeConfig
from kvscope.options.run import OptionError
from kvscope.runs.setup.prepare import prepare
from kvscope.runs.setup.spec import RunSpec

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(120)


def parse(line: str) -> RunSpec:
    return RunSpec.from_args(build_cli_parser().commands["run"].parse_args(line.split()))


def test_speculative_option_becomes_the_engine_config():
    config = prepare(parse("--speculative ngram:4:2-5")).config.speculative_config
    assert config == SpeculativeConfig("ngram", 4, 2, 5)
    assert prepare(parse("--speculative ngram:3")).config.speculative_config.prompt_lookup_min == 5  # vLLM's default
    draft = prepare(parse("--speculative draft:tiny-qwen2:2")).config.speculative_config
    assert (draft.method, draft.model, draft.num_speculative_tokens) == ("draft_model", "tiny-qwen2", 2)
    assert prepare(parse("--speculative off")).config.speculative_config is None
    assert prepare(parse("")).config.speculative_config is None


@pytest.mark.parametrize(("value", "words"), [
    ("draft:no-such-model:3", "unknown model 'no-such-model'"),  # checked before anything loads
    ("ngram:100", "num_speculative_tokens=100"),
    ("ngram:4:3-2", "prompt_lookup_min=3 must be <= prompt_lookup_max=2"),
])
def test_bad_speculative_options_are_refused_before_loading(value, words):
    with pytest.raises(OptionError, match=words):
        prepare(parse(f"--speculative {value}"))


def test_the_magic_runs_with_speculation(ip):
    run = ip.run_line_magic("kvscope", "--requests 3 --num-blocks 64 --prompt-len 8-16 --output-len 12 "
                                       "--speculative ngram:3:1-2 --wait -q -o")
    assert run.status == "finished" and run.meta["speculative"]["method"] == "ngram"
    assert run.meta["config"]["speculative_config"]["num_speculative_tokens"] == 3
    assert any(r.spec_decode is not None for r in run.run.records)
