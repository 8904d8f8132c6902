"""``kvscope.runs.background.sweep``: one run per value, the same workload in each, listed options, failures, the
``kvscope sweep`` command (``cli/compare.py``) and ``%kvscope sweep`` (``magic/sweep.py``); the
notebook view is tested in ``tests/widgets/test_sweep_view.py``."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from IPython.core.error import UsageError

from kvscope.cli.parser import CLIError, Parser
from kvscope.cli.sweep import COMMAND, cmd_sweep
from kvscope.magic.sweep import magic_sweep
from kvscope.options.run import CLI, OptionError, OptionParser
from kvscope.options.sweep import add_sweep_options
from kvscope.runs.background.sweep import Sweep, plan_from_args, sweep

torch.set_num_threads(1)

SMALL = {"requests": 4, "prompt_len": "12-40", "output_len": "3-8", "shared_prefix": 16, "max_num_seqs": 4,
         "max_num_batched_tokens": 64}
SMALL_ARGS = "--requests 4 --prompt-len 12-40 --output-len 3-8 --shared-prefix 16 --max-num-seqs 4 " \
             "--max-num-batched-tokens 64"


@pytest.fixture(scope="module")
def block_sizes() -> Sweep:
    return sweep("block_size", [8, 16, 32], num_blocks=24, **SMALL)


def _args(line: str):
    parser = OptionParser(prog="kvscope sweep")
    add_sweep_options(parser, CLI)
    return parser.parse_args(line.split())


def test_one_run_per_value(block_sizes):
    s = block_sizes
    assert s.done and s.errors == {}
    assert s.labels == ["block-size=8", "block-size=16", "block-size=32"]
    assert [r.meta["block_size"] for r in s.runs] == [8, 16, 32]
    assert [r.meta["num_blocks"] for r in s.runs] == [24, 24, 24]  # everything else the same
    assert list(s.per_run["block_size"]) == [8, 16, 32]
    assert [sm["requests"] for sm in s.summaries] == [4, 4, 4]
    assert s.table.at["output_tokens", "block-size=32"] == s.runs[2].summary()["output_tokens"]
    assert s.differences == {"block_size": [8, 16, 32]}
    assert s.warnings == []


def test_the_same_workload_in_every_run(block_sizes):
    first, *others = block_sizes.workloads
    assert len(first) == 4
    for items in others:
        assert [i.prompt for i in items] == [i.prompt for i in first]  # the same token ids
        assert [(i.params.seed, i.params.max_tokens) for i in items] == [(i.params.seed, i.params.max_tokens)
                                                                         for i in first]
    outputs = [r.summary()["output_tokens"] for r in block_sizes.runs]
    assert len(set(outputs)) == 1  # lengths are exact (synthetic requests ignore EOS)
    assert first[0].prompt[:16] == first[1].prompt[:16]  # the shared prefix


def test_csv_and_html(block_sizes, tmp_path):
    frame = pd.read_csv(block_sizes.save_csv(tmp_path / "s.csv"))
    assert list(frame["block_size"]) == [8, 16, 32]
    assert frame["prefix_cache_hits"].tolist() == [r.summary()["prefix_cache_hits"] for r in block_sizes.runs]
    assert "block-size=16" in block_sizes.save_html(tmp_path / "s.html").read_text(encoding="utf-8")


def test_listed_options_parse_with_their_own_parsers():
    args = _args("--kv-memory 1MiB,2MiB --block-size 16 --prefix-caching on")
    assert args.kv_memory == [1 << 20, 2 << 20] and args.kv_memory.texts == ["1MiB", "2MiB"]
    assert args.block_size == [16]
    with pytest.raises(OptionError, match="power of two"):
        _args("--block-size 8,12")
    with pytest.raises(OptionError, match="'maybe' is not one of on, off"):
        _args("--prefix-caching on,maybe")
    with pytest.raises(OptionError, match="an empty value"):
        _args("--max-num-seqs 4,,8")


def test_exactly_one_option_is_swept():
    with pytest.raises(OptionError, match="give one option a list"):
        plan_from_args(_args("--block-size 16"))
    with pytest.raises(OptionError, match="one option at a time, not --block-size and --max-num-seqs"):
        plan_from_args(_args("--block-size 8,16 --max-num-seqs 2,4"))
    with pytest.raises(OptionError, match="--kv-memory 1MiB: give --num-blocks or --kv-memory"):
        plan_from_args(_args("--kv-memory 1MiB,2MiB --num-blocks 8"))  # checked per run, before any starts
    plan = plan_from_args(_args("--prefix-caching on,off --requests 2"))
    assert plan.labels == ["prefix-caching=on", "prefix-caching=off"]
    assert [s.config.enable_prefix_caching for s in plan.setups] == [True, False]
    assert plan_from_args(_args("--seed 1,1")).labels == ["seed=1", "seed=1 (2)"]


def test_python_api_refuses_unknown_and_switch_options():
    with pytest.raises(OptionError, match="unknown run option 'blocksize'"):
        sweep("blocksize", [8, 16])
    with pytest.raises(OptionError, match="is a switch"):
        sweep("ignore_eos", [True, False])


def test_a_failing_run_is_reported_and_the_others_run():
    s = sweep("max_model_len", [64, 10**6], num_blocks=24, **SMALL)
    assert s.labels == ["max-model-len=64"]
    assert list(s.errors) == ["max-model-len=1000000"]
    assert "exceeds what the model supports" in str(s.errors["max-model-len=1000000"])
    assert any("max-model-len=1000000 failed" in w for w in s.warnings)


# ---- kvscope sweep ----------------------------------------------------------------------------------
def _cli(argv: list[str]) -> int:
    parser = Parser(prog="kvscope")
    COMMAND.add_parser(parser.add_subparsers(dest="command", parser_class=Parser))
    return cmd_sweep(parser.parse_args(["sweep", *argv]))


def test_cli_writes_the_comparison_and_csv(tmp_path, capsys):
    out = tmp_path / "bs.html"
    argv = ["--block-size", "8,16", "--num-blocks", "24", *SMALL_ARGS.split(), "-o", str(out)]
    assert _cli(argv) == 0
    text = capsys.readouterr().out
    assert "block-size=8" in text and "output tok/s" in text and "throughput (output tokens/s)" in text
    assert list(pd.read_csv(tmp_path / "bs.csv")["block_size"]) == [8, 16]
    assert "kvscope comparison" in out.read_text(encoding="utf-8")


def test_cli_usage_errors(tmp_path):
    with pytest.raises(CLIError, match="give one option a list") as err:
        _cli(["--block-size", "16", "-o", str(tmp_path / "x.html")])
    assert err.value.code == 2
    with pytest.raises(CLIError, match="must be a power of two"):
        _cli(["--block-size", "8,9"])
    with pytest.raises(CLIError, match="the same file"):
        _cli(["--block-size", "8,16", "-o", str(tmp_path / "a.csv"), "--csv", str(tmp_path / "a.csv")])
    with pytest.raises(CLIError, match="the folder of"):
        _cli(["--block-size", "8,16", "-o", str(tmp_path / "missing" / "x.html")])


# ---- %kvscope sweep --------------------------------------------------------------------------------
def test_magic_runs_and_returns_the_sweep(tmp_path, capsys):
    csv = tmp_path / "m.csv"
    s = magic_sweep(f"--max-num-seqs 1,4 --num-blocks 24 {SMALL_ARGS.replace('--max-num-seqs 4 ', '')} "
                    f"--csv {csv} -q --wait -o")
    assert isinstance(s, Sweep) and s.done
    assert s.labels == ["max-num-seqs=1", "max-num-seqs=4"]
    assert s.summaries[0]["peak_running"] == 1
    assert s.written["csv"] == csv and list(pd.read_csv(csv)["max_num_seqs"]) == [1, 4]
    assert capsys.readouterr().out == ""  # quiet


def test_cell_prompts_are_the_workload_of_every_run():
    s = magic_sweep("--prefix-caching on,off --output-len 3 --ignore-eos -q --wait -o",
                    "What is a KV cache? " * 3 + "\n" + "Why page it? " * 3)
    assert s.labels == ["prefix-caching=on", "prefix-caching=off"] and s.errors == {}
    assert [[i.prompt for i in items] for items in s.workloads] == [["What is a KV cache? " * 3,
                                                                     "Why page it? " * 3]] * 2
    with pytest.raises(UsageError, match="cell is empty"):
        magic_sweep("--block-size 8,16", "  \n")


def test_magic_usage_errors():
    with pytest.raises(UsageError, match="one option at a time"):
        magic_sweep("--block-size 8,16 --max-num-seqs 2,4")
    with pytest.raises(UsageError, match="closing quotation"):
        magic_sweep('--prompts "unclosed')
    assert magic_sweep("--help") is None


def test_repeats_give_a_median_a_range_and_a_noise_mark(monkeypatch):
    """--repeat 3: each value runs three times after one warm-up run; the table is their median, the range their
    min-max, and a difference whose ranges overlap is marked ≈ (neither green nor red)."""
    started = []
    original = Sweep._one_run

    def counting(self, setup, index):
        started.append(index)
        return original(self, setup, index)

    monkeypatch.setattr(Sweep, "_one_run", counting)
    s = sweep("block_size", [8, 32], num_blocks=24, repeat=3, **SMALL)
    assert started == [-1, 0, 0, 0, 1, 1, 1]  # the warm-up, then three of each
    assert len(s.spreads) == 2
    lo, hi = s.spreads[0]["duration_s"]
    assert lo <= s.summaries[0]["duration_s"] <= hi
    assert s.spreads[0]["output_tokens"] == (s.summaries[0]["output_tokens"],) * 2  # the same tokens each time
    s.spreads[1]["duration_s"] = (lo, hi)  # overlapping ranges: noise
    assert s.within_noise("duration_s", 1)
    s.spreads[1]["duration_s"] = (hi * 2, hi * 3)  # apart: a real difference
    assert not s.within_noise("duration_s", 1)
    from kvscope.widgets.compare_table import summary_html

    s.spreads[1]["duration_s"] = (lo, hi)
    assert "≈" in summary_html(s) and "the repeats' range" in summary_html(s)


def test_cli_takes_repeat_and_no_warmup():
    plan = plan_from_args(_args(f"--block-size 8,16 --repeat 2 --no-warmup {SMALL_ARGS}"))
    assert (plan.repeat, plan.warmup) == (2, False)
    assert plan_from_args(_args(f"--block-size 8,16 {SMALL_ARGS}")).warmup
