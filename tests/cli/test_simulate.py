"""``kvscope calibrate`` and ``kvscope simulate`` as a user runs them: a real run, a fit, a replay and a
roofline, each writing files that load back and say they are simulated."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvscope.runs.result.run import load


def kvscope(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvscope", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sim")
    done = kvscope("run", "-n", "24", "--num-blocks", "40", "--max-num-seqs", "10", "--shared-prefix", "32",
                   "--prompt-len", "16-96", "--output-len", "8-32", "--out", "real", "-q", cwd=folder)
    assert done.returncode == 0, done.stderr
    fit = kvscope("calibrate", "real.metrics.jsonl", "-o", "step.json", cwd=folder)
    assert fit.returncode == 0, fit.stderr
    assert "held-out steps" in fit.stdout and "verdict: " in fit.stdout and "\nnext: " in fit.stdout
    assert "ms per step" in fit.stdout  # each coefficient with its unit
    return folder


def test_calibrate_then_replay_reproduces_the_schedule(recorded):
    assert json.loads((recorded / "step.json").read_text())["kind"] == "linear"
    sim = kvscope("simulate", "--step-model", "step.json", "--replay", "real.metrics.jsonl", "--num-blocks", "40",
                  "--max-num-seqs", "10", "--out", "sim", cwd=recorded)
    assert sim.returncode == 0, sim.stderr
    assert "(simulated; fitted: step.json)" in sim.stdout
    real, simulated = load(recorded / "real.metrics.jsonl"), load(recorded / "sim.trace.json")
    assert simulated.meta["simulated"]["replay_of"] == "real.metrics.jsonl"
    for key in ("steps", "preemptions", "prefix_cache_hits", "output_tokens", "requests"):
        assert simulated.summary()[key] == real.summary()[key], key


def test_a_replay_starts_from_the_runs_settings_and_says_what_a_what_if_changed(recorded):
    """--num-blocks 80 on a run of 40 blocks and at most 10 running: that alone changes, the rest is the run's, and
    the output says so (issue 37 item 3; tests/runs/setup/test_replay.py: a replay without options is the run)."""
    from kvscope.runs.result.comparison import compare

    what_if = kvscope("simulate", "--step-model", "step.json", "--replay", "real.metrics.jsonl", "--num-blocks",
                      "80", "--out", "x2", cwd=recorded)
    assert what_if.returncode == 0, what_if.stderr
    assert "what-if, changed from the run: num_blocks 40 -> 80 (--num-blocks)" in what_if.stderr
    assert "max_num_seqs 10" in what_if.stderr  # kept from the run
    simulated = load(recorded / "x2.metrics.jsonl")
    assert simulated.meta["num_blocks"] == 80 and simulated.meta["config"]["max_num_seqs"] == 10
    cmp = compare(recorded / "real.metrics.jsonl", simulated)
    assert cmp.warnings == [] and "what-if: num_blocks 40 -> 80" in cmp.notes[0]


def test_roofline_static_vs_paged(recorded):
    """The course's example: a 7B model on a 40 GB A100 runs far more requests at once paged than with a
    static reservation of max_model_len slots each."""
    common = ["--gpu", "a100-40gb", "--model", "llama-7b", "--max-model-len", "2048", "-n", "300",
              "--prompt-len", "200-400", "--output-len", "100-300", "--max-num-seqs", "256",
              "--max-num-batched-tokens", "8192", "-q"]
    paged = kvscope("simulate", *common, "--out", "paged", cwd=recorded)
    static = kvscope("simulate", *common, "--static", "--out", "static", cwd=recorded)
    assert paged.returncode == 0 and static.returncode == 0, paged.stderr + static.stderr
    p, s = load(recorded / "paged.metrics.jsonl").summary(), load(recorded / "static.metrics.jsonl").summary()
    assert s["peak_running"] <= 22 < p["peak_running"]  # 22: (40 GiB - 13 - 4) / 1 GiB per 2048-token request
    assert p["duration_s"] < s["duration_s"]


@pytest.mark.parametrize(("args", "message"), [
    (["simulate", "-n", "4"], "needs a step-time model"),
    (["simulate", "--gpu", "b300", "-n", "4"], "unknown GPU 'b300'"),
    (["simulate", "--gpu", "h100", "--model", "mistral-7b", "-n", "4"], "sliding-window"),
    (["simulate", "--step-model", "missing.json", "-n", "4"], "kvscope calibrate"),
    (["calibrate", "real.metrics.jsonl", "-o", "real.metrics.jsonl"], "would destroy that run"),
    (["simulate", "--gpu", "h100", "--speculative", "ngram:4", "-n", "4"], "--acceptance-rate"),
    (["simulate", "--gpu", "h100", "--acceptance-rate", "1.5", "-n", "4"], "probability between 0 and 1"),
    (["simulate", "--replay", "real.metrics.jsonl", "-n", "4"], "leave out --requests"),
    (["run", "-n", "4", "--arrival", "gamma:2"], "needs --rate"),
    (["run", "-n", "4", "--rate", "0"], "positive number of requests per second"),
])
def test_refusals_name_the_fix(recorded, args, message):
    done = kvscope(*args, cwd=recorded)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr


def test_sweep_simulate_sweeps_a_setting_without_the_model(recorded):
    done = kvscope("sweep", "--simulate", "--step-model", "step.json", "--block-size", "8,32", "-n", "60",
                   "--rate", "20", "--num-blocks", "64", "--repeat", "2", "-o", "sw.html", "-q", cwd=recorded)
    assert done.returncode == 0, done.stderr
    rows = (recorded / "sw.csv").read_text().splitlines()
    assert len(rows) == 3  # a header and one row per block size: the median of its 2 runs (as --csv's help says)
    helped = " ".join(kvscope("sweep", "--help", cwd=recorded).stdout.split())
    assert "one row per value (with --repeat N: the median of its N runs" in helped


def test_simulate_pd_writes_transfers_that_load_back(tmp_path):
    """``kvscope simulate --pd 1P1D --kv-bandwidth``: the files of a P/D run, marked simulated."""
    done = kvscope("simulate", "--gpu", "h100", "--model", "llama-7b", "--pd", "1P1D", "--kv-bandwidth", "10",
                   "--kv-latency", "0.001", "-n", "6", "--prompt-len", "64-200", "--output-len", "8-16",
                   "--rate", "10", "--out", "pd", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1P1D, KV at 10 GB/s + 0.001 s" in done.stdout
    for name in ("pd.metrics.jsonl", "pd.trace.json"):
        run = load(tmp_path / name)
        s = run.summary()
        assert run.meta["simulated"]["pd"]["kv_bandwidth_gb_per_s"] == 10
        assert s["kv_transfers"] == 6 and s["kv_transfer_bytes"] > 0
        assert s["decode-0_itl_p50_s"] > 0 and s["prefill-0_ttft_p50_s"] > 0
        for t in run.meta["pd"]["transfers"]:
            assert (t["end_ns"] - t["start_ns"]) / 1e9 == pytest.approx(t["num_bytes"] / 10e9 + 0.001, abs=1e-8)


@pytest.mark.parametrize(("args", "message"), [
    (["--kv-bandwidth", "10"], "--kv-bandwidth is the KV transfer between P/D instances: add --pd"),
    (["--pd", "1P1D", "--kv-bandwidth", "0"], "must be above 0"),
    (["--pd", "1P1D", "--kv-latency", "-1"], "between 0 and 10 seconds"),
    (["--pd", "1P1D", "--kv-bandwidth", "fast"], "not a number of GB/s"),
    (["--pd", "3X"], "write <n>P<m>D"),
])
def test_simulate_pd_refusals_name_the_fix(tmp_path, args, message):
    done = kvscope("simulate", "--gpu", "h100", "--model", "llama-7b", "-n", "2", *args, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr


def test_the_progress_bar_ends_on_the_summarys_virtual_clock(capsys):
    """The bar's last postfix is the summary's duration (17.1 s), not the clock at its last poll (12.5 s)."""
    from kvscope.cli.simulate import _watch_requests
    from kvscope.runs.background.status import RunStatus

    class Finished:
        status, workload, num_finished, elapsed_s, records = RunStatus.RUNNING, [1, 2], 2, 12.5, [object()]
        polls = 0

        @property
        def done(self) -> bool:
            self.polls += 1
            return self.polls > 2

        def summary(self) -> dict:
            return {"duration_s": 17.1}

    _watch_requests(Finished(), quiet=False, total=2)
    err = capsys.readouterr().err
    assert err.rstrip().endswith("virtual clock 17.1 s]"), err[-200:]
