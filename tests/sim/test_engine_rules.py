"""``--engine vllm`` (issue 35 item 1): a simulation under vLLM 0.32's scheduling rules, with vLLM's CPU defaults
for the settings not given; kvscope's own rules and defaults stay as they were."""

from __future__ import annotations

import pytest

from kvscope.cli.main import main
from kvscope.engine.config import EngineConfig
from kvscope.engine.core.rules import KVSCOPE_RULES, VLLM_CPU_DEFAULTS, VLLM_RULES
from kvscope.runs.result.run import load
from kvscope.sim.build import with_engine_rules


def test_vllm_rules_bring_vllm_cpu_defaults_where_not_given():
    config = with_engine_rules(EngineConfig(num_blocks=64), "vllm")
    assert config.scheduler_rules is VLLM_RULES
    assert (config.max_num_batched_tokens, config.max_num_seqs, config.block_size) == (2048, 128, 128)
    assert VLLM_CPU_DEFAULTS == {"max_num_batched_tokens": 2048, "max_num_seqs": 128, "block_size": 128}
    given = with_engine_rules(EngineConfig(block_size=32, max_num_seqs=8), "vllm", given={"block_size", "max_num_seqs"})
    assert (given.max_num_batched_tokens, given.max_num_seqs, given.block_size) == (2048, 8, 32)
    own = with_engine_rules(EngineConfig(), "kvscope")
    assert own == EngineConfig() and own.scheduler_rules is KVSCOPE_RULES


def test_vllm_rules_refuse_what_vllm_refuses():
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(64\) >= max_num_seqs \(128\)"):
        with_engine_rules(EngineConfig(max_num_batched_tokens=64), "vllm", given={"max_num_batched_tokens"})
    with pytest.raises(ValueError, match="'sglang' is not an engine whose rules kvscope knows"):
        with_engine_rules(EngineConfig(), "sglang")


def test_simulate_engine_vllm_runs_under_vllm_rules_and_records_them(tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["simulate", "--gpu", "h100", "--model", "llama-7b", "-n", "8", "--engine", "vllm",
                 "--max-num-seqs", "4", "--out", str(out), "-q"]) == 0
    meta = load(f"{out}.metrics.jsonl").meta
    assert meta["simulated"]["scheduler_rules"] == "vllm"
    config = meta["config"]
    assert (config["block_size"], config["max_num_batched_tokens"], config["max_num_seqs"]) == (128, 2048, 4)
    assert EngineConfig(**config).scheduler_rules == VLLM_RULES  # the file loads back into the same config
    assert main(["simulate", "--gpu", "h100", "--model", "llama-7b", "-n", "8", "--engine", "vllm",
                 "--max-num-batched-tokens", "64", "--out", str(tmp_path / "x"), "-q"]) == 2
    assert "raise --max-num-batched-tokens or lower --max-num-seqs" in capsys.readouterr().err
