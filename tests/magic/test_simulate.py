"""``%kvscope simulate``: a simulation live in a notebook cell, refused like the command line refuses it."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError


def test_simulate_runs_on_the_virtual_clock_and_says_so(ip):
    run = ip.run_line_magic("kvscope", "simulate --gpu h100 --model llama-7b --max-model-len 2048 -n 300 --rate 5 "
                                       "--max-num-seqs 128 --wait -q -o")
    s = run.summary()
    assert s["finished"] == 300
    assert s["duration_s"] > 299 / 5 * 0.5  # virtual seconds of arrivals, simulated in far less wall time
    assert run.meta["simulated"]["step_model_from"] == "roofline: h100"
    assert run.dashboard is None


def test_the_dashboard_marks_a_simulation(ip):
    run = ip.run_line_magic("kvscope", "simulate --gpu h100 --model llama-7b --max-model-len 2048 -n 20 --wait -o")
    assert run.dashboard.status_parts()[0].startswith("SIMULATED (roofline: h100")


@pytest.mark.parametrize(("line", "why"), [
    ("simulate -n 4", "needs a step-time model"),
    ("simulate --gpu h100 --profile 2 -n 4", "no kernels to profile"),
    ("simulate --gpu h100 --model no-such-model -n 4", "unknown model"),
])
def test_bad_simulations_raise_usage_error(ip, line, why):
    with pytest.raises(UsageError, match=why):
        ip.run_line_magic("kvscope", line)


def test_simulate_takes_vllms_scheduling_rules_as_the_command_does(ip):
    """``--engine vllm`` is a simulation option of the magic too (kvscope/options/simulate.py), with vLLM's CPU
    defaults for the settings not given and the rules in the run's config."""
    run = ip.run_line_magic("kvscope", "simulate --gpu h100 --model llama-7b --max-model-len 2048 -n 20 --engine vllm "
                                       "--max-num-seqs 16 --wait -q -o")
    config = run.meta["config"]
    assert config["scheduler_rules"] == {"name": "vllm", "reserve_full_isl": True, "finish_in_schedule_order": True,
                                         "hash_index": True, "preempted_hits_apart": True}
    assert config["max_num_seqs"] == 16 and config["max_num_batched_tokens"] == 2048  # given, then vLLM's default
    assert config["block_size"] == 128
    assert run.summary()["finished"] == 20
