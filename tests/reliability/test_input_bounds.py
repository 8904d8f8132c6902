"""Inputs that were unbounded or silently ignored (issue 38 items 7 and 9): a 10**6-request simulation is accepted
as the docs say, --capture-slow is bounded in profiled steps, a simulation's options on a real sweep are refused,
and a prompts line too long for explain's tokenizer is refused before the tokenizer sees it."""

from __future__ import annotations

import pytest

from kvscope.cli.main import main
from kvscope.options.parser import OptionError
from kvscope.options.run import MAX_CAPTURE_TOTAL, capture_slow
from kvscope.options.values import num_requests


def test_a_million_requests_are_accepted_as_the_docs_advertise():
    assert num_requests("1000000") == 10**6
    with pytest.raises(OptionError, match="at most 1,000,000"):
        num_requests("1000001")


def test_capture_slow_is_bounded_in_profiled_steps():
    assert capture_slow("5") == (5, 4)
    assert capture_slow("1000") == (1000, 1)  # the default windows shrink to stay within the bound
    assert capture_slow("250:4") == (250, 4)
    with pytest.raises(OptionError, match="1000 steps x 64 windows is 64,000 profiled steps; at most 1,000"):
        capture_slow("1000:64")
    assert MAX_CAPTURE_TOTAL == 1000


@pytest.mark.parametrize("flag", [["--step-model", "step.json"], ["--gpu", "h100"], ["--static"]])
def test_sweep_refuses_simulation_options_without_simulate(tmp_path, capsys, flag):
    rc = main(["sweep", *flag, "--num-blocks", "32,64", "-n", "2", "-o", str(tmp_path / "s.html")])
    assert rc == 2
    assert f"{flag[0]} is an option of simulated runs: add --simulate" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_explain_refuses_a_prompt_line_too_long_for_its_tokenizer(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("short prompt\n" + "x" * (1 << 20) + "\n")
    assert main(["explain", "--prompts", str(prompts), "--tokenizer", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "prompt 2 has 1,048,576 characters, more than the 524,288 kvscope explain tokenizes" in err
