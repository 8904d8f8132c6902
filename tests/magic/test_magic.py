"""The %kvscope / %%kvscope magic through IPython's own test shell."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import kvscope
from kvscope.runs.background.live import LiveRun

torch.set_num_threads(1)  # a shared 2-core machine: no spinning intra-op threads
pytestmark = pytest.mark.timeout(120)

SMALL = "--num-blocks 64 --prompt-len 8-24 --output-len 6-10"



def test_help_lists_every_option(ip, capsys):
    ip.run_cell("%kvscope?")
    text = capsys.readouterr().out
    for flag in ("--model", "--requests", "--prompts", "--prompt-len", "--output-len", "--max-new-tokens",
                 "--shared-prefix", "--temperature", "--top-k", "--top-p", "--seed", "--block-size", "--num-blocks",
                 "--kv-memory", "--max-num-batched-tokens", "--max-num-seqs", "--prefix-caching", "--profile",
                 "--trace", "--metrics", "--html", "--wait", "-q", "-o", "--step-delay", "--refresh"):
        assert flag in text, flag
    assert "Run a model on the kvscope engine in the background" in text
    assert "%%kvscope" in text


def test_help_option_prints_the_options_and_runs_nothing(ip, capsys):
    assert ip.run_line_magic("kvscope", "--help") is None
    text = capsys.readouterr().out
    assert text.startswith("usage: %kvscope") and "--no-prefix-caching" in text and "--refresh HZ" in text


def test_line_is_split_the_posix_way_and_no_prefix_caching_is_taken(ip, tmp_path):
    """Quotes hold a path with a space (shlex); --no-prefix-caching, as in `kvscope run`."""
    prompts = tmp_path / "my prompts.txt"
    prompts.write_text("one prompt\n", encoding="utf-8")
    run = ip.run_line_magic("kvscope", f'--prompts "{prompts}" --output-len 2 --num-blocks 32 '
                                       "--no-prefix-caching --wait -q -o")
    assert [o.prompt for o in run.outputs] == ["one prompt"]
    assert run.meta["config"]["enable_prefix_caching"] is False
    assert run.workload[0].source == "line 1 of my prompts.txt"
    with pytest.raises(UsageError, match="cannot split the options: No closing quotation"):
        ip.run_line_magic("kvscope", '--prompts "my prompts.txt')


def test_line_magic_returns_at_once_and_the_run_finishes(ip):
    run = ip.run_line_magic("kvscope", f"--requests 5 {SMALL} --step-delay 0.02 -q -o")
    assert isinstance(run, LiveRun) and isinstance(run.run, kvscope.Run)  # a LiveRun has a Run
    assert not run.done  # returned while the run goes on (its 5 requests take many 20 ms steps)
    run.wait(timeout=60)
    assert run.status == "finished" and len(run.outputs) == 5
    assert len(run.requests) == 5 and len(run.steps) == run.step
    assert run.meta["config"]["num_blocks"] == 64 and run.meta["config"]["enable_prefix_caching"] is True


def test_without_o_nothing_is_returned_and_the_dashboard_is_displayed(ip):
    with capture_output() as captured:
        result = ip.run_line_magic("kvscope", f"--requests 2 {SMALL} --wait")
    assert result is None
    bundles = [o.data for o in captured.outputs]
    assert any("application/vnd.jupyter.widget-view+json" in b for b in bundles)
    assert "finished: 2 requests" in captured.stdout


def test_arguments_reach_the_engine_and_sampling(ip):
    run = ip.run_line_magic(
        "kvscope", "--requests 3 --prompt-len 20 --output-len 4 --block-size 8 --num-blocks 40 "
                   "--max-num-batched-tokens 32 --max-num-seqs 2 --prefix-caching off --temperature 0.7 "
                   "--top-k 5 --top-p 0.9 --seed 11 --wait -q -o")
    cfg = run.meta["config"]
    assert (cfg["block_size"], cfg["num_blocks"], cfg["max_num_batched_tokens"], cfg["max_num_seqs"]) == (8, 40, 32, 2)
    assert cfg["enable_prefix_caching"] is False
    params = [item.params for item in run.workload]
    assert all((p.temperature, p.top_k, p.top_p, p.max_tokens) == (0.7, 5, 0.9, 4) for p in params)
    assert [p.seed for p in params] == [11, 12, 13]
    assert all(len(item.prompt) == 20 for item in run.workload)
    assert max(run.steps["num_running"]) <= 2
    assert max(run.steps["num_prefill_tokens"] + run.steps["num_decode_tokens"]) <= 32


def test_cell_magic_lines_are_prompts(ip):
    run = ip.run_cell_magic("kvscope", "--output-len 3 --ignore-eos --num-blocks 32 --wait -q -o",
                            "Hello world\n\nWhat is a KV cache?\n")
    assert [o.prompt for o in run.outputs] == ["Hello world", "What is a KV cache?"]
    assert all(len(o.token_ids) == 3 for o in run.outputs)


def test_prompts_file_and_output_files(ip, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one prompt\nanother prompt\n", encoding="utf-8")
    trace, metrics, html = tmp_path / "t.json", tmp_path / "m.jsonl", tmp_path / "r.html"
    run = ip.run_line_magic("kvscope", f"--prompts {prompts} --output-len 4 --num-blocks 32 --trace {trace} "
                                       f"--metrics {metrics} --html {html} --wait -q -o")
    assert [o.prompt for o in run.outputs] == ["one prompt", "another prompt"]
    assert trace.exists() and metrics.exists() and html.exists()
    assert len(kvscope.load(metrics).requests) == 2


def test_profile_steps(ip):
    run = ip.run_line_magic("kvscope", f"--requests 2 {SMALL} --profile 2 --wait -q -o")
    profiled = [r for r in run.records if r.profile is not None]
    assert len(profiled) == 2 and all(p.profile["total"] > 0 for p in profiled)


@pytest.mark.parametrize("line, why", [
    ("--bogus 1", "unrecognized arguments"),
    ("--requests 0", "must be at least 1"),
    ("--requests two", "not a whole number"),
    ("--output-len 64-16", "below the lower end"),
    ("--num-blocks 8 --kv-memory 1MiB", "--num-blocks or --kv-memory, not both"),
    ("--kv-memory lots", "cannot read 'lots' as a size"),
    ("--requests 2 --prompts p.txt", "--prompts and --requests"),
    ("--prompts /no/such/file.txt", "does not exist"),
    ("--block-size 3", "power of two"),
    ("--temperature -1", "temperature"),
    ("--top-p 0", "top_p"),
    ("--prefix-caching maybe", "invalid choice"),
    ("--trace /no/such/dir/t.json", "folder of '/no/such/dir/t.json' does not exist"),
    ("--refresh 50", "--refresh"),
    ("--step-delay -1", "--step-delay"),
])
def test_bad_arguments_raise_usage_error(ip, line, why):
    with pytest.raises(UsageError, match=why):
        ip.run_line_magic("kvscope", line)


def test_bad_cell_usage(ip):
    with pytest.raises(UsageError, match="not cell prompts and --requests"):
        ip.run_cell_magic("kvscope", "--requests 2", "a prompt\n")
    with pytest.raises(UsageError, match="cell is empty"):
        ip.run_cell_magic("kvscope", "", "\n  \n")


def test_a_run_that_fails_in_wait_mode_raises(ip):
    with pytest.raises(UsageError, match="unknown model"):  # refused before the run starts
        ip.run_line_magic("kvscope", "--model no-such-model-anywhere --requests 1 --wait -q")
    with pytest.raises(UsageError, match="max_model_len=100000 exceeds"):  # refused by the engine
        ip.run_line_magic("kvscope", "--max-model-len 100000 --requests 1 --wait -q")


def test_interrupt_in_wait_mode_stops_the_run(ip, monkeypatch, capsys):
    def interrupted(self, timeout=None):
        self.stop()
        self._done.wait()
        raise KeyboardInterrupt

    monkeypatch.setattr(LiveRun, "wait", interrupted)
    result = ip.run_line_magic("kvscope", f"--requests 2 {SMALL} --output-len 400 --wait -q -o")
    assert "interrupted: the run was stopped" in capsys.readouterr().out
    assert result.status == "stopped"
