"""A step model is read strictly and within bounds (issue 38 items 7-9): a size cap, JSON types as written (no
number as a string or a boolean), every value bounded, errors naming the file and the field; and what a simulation
timed by it writes always loads back (the virtual clock is bounded)."""

from __future__ import annotations

import json

import pytest

from kvscope.cli.main import main
from kvscope.runs.result.run import load
from kvscope.sim.step_model import load_step_model
from kvscope.utils.clock import MAX_VIRTUAL_NS, VirtualClock, VirtualTimeOverflow


def phase(**changes):
    return {"intercept_s": 0.01, "coef": {"decode_tokens": 0.001, "prefill_tokens": 0.001},
            "ratio_quantiles": [0.9, 1.0, 1.1], **changes}


def model(**decode_changes):
    return {"kind": "linear", "phases": {"prefill": phase(), "decode": phase(**decode_changes)}, "fit": {},
            "source": "run", "seed": 0}


def write(tmp_path, doc, name="step.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_a_valid_model_loads(tmp_path):
    m = load_step_model(write(tmp_path, model()))
    assert m.phases["decode"].ratio_quantiles == [0.9, 1.0, 1.1]


@pytest.mark.parametrize("changes, message", [
    (dict(intercept_s=True), r"phases.decode.intercept_s is 'True' \(bool\): it must be a number"),
    (dict(intercept_s="0.001"), r"phases.decode.intercept_s is '0.001' \(str\): it must be a number"),
    (dict(ratio_quantiles="123"), r"phases.decode.ratio_quantiles is a str: it must be a list of numbers"),
    (dict(coef={"decode_tokens": 1e6}), r"phases.decode.coef.decode_tokens=1000000.0 must be a finite number from 0"),
    (dict(intercept_s=1e5), r"phases.decode.intercept_s=100000.0 must be a finite number from 0 to 3600"),
    (dict(ratio_quantiles=[]), r"phases.decode.ratio_quantiles has 0 values"),
    (dict(intercept_s=0, coef={}), r"phases.decode times a step of one sequence and one token at 0 s"),
    (dict(extra=1), r"phases.decode has \['coef', 'extra', 'intercept_s', 'ratio_quantiles'\]"),
])
def test_loose_types_and_values_are_refused_naming_file_and_field(tmp_path, changes, message):
    path = write(tmp_path, model(**changes))
    with pytest.raises(ValueError, match=f"step model '{path}': {message}"):
        load_step_model(path)


def test_an_all_zero_model_is_refused(tmp_path):
    zero = {"intercept_s": 0.0, "coef": {}, "ratio_quantiles": [1.0]}
    path = write(tmp_path, {"kind": "linear", "phases": {"prefill": zero, "decode": zero}})
    with pytest.raises(ValueError, match="clock would never move"):
        load_step_model(path)


def test_hostile_files_are_refused_quickly_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match="step model '/dev/zero' is larger than 256 KiB"):
        load_step_model("/dev/zero")
    big = write(tmp_path, json.dumps(model()) + " " * (300 << 10), "big.json")
    with pytest.raises(ValueError, match="larger than 256 KiB"):
        load_step_model(big)
    deep = write(tmp_path, "[" * 100_000 + "]" * 100_000, "deep.json")
    with pytest.raises(ValueError, match=f"cannot read step model '{deep}': RecursionError"):
        load_step_model(deep)
    digits = write(tmp_path, '{"kind": "linear", "seed": ' + "9" * 5000 + "}", "digits.json")
    with pytest.raises(ValueError, match=f"cannot read step model '{digits}': ValueError"):
        load_step_model(digits)


def test_the_virtual_clock_never_passes_64_bits():
    clock = VirtualClock(0)
    clock.advance(MAX_VIRTUAL_NS)
    with pytest.raises(VirtualTimeOverflow, match="past 2\\*\\*62 ns"):
        clock.advance(1)
    with pytest.raises(VirtualTimeOverflow, match="waiting for the next arrival"):
        VirtualClock(0).sleep_until_ns(2**63 - 1)


def test_a_simulation_that_would_overflow_fails_and_its_files_load_back(tmp_path, capsys):
    path = write(tmp_path, model())
    out = tmp_path / "s"
    assert main(["simulate", "--step-model", str(path), "-n", "16", "--rate", "1e-9", "--out", str(out), "-q"]) == 1
    assert "VirtualTimeOverflow" in capsys.readouterr().err
    run = load(tmp_path / "s.metrics.jsonl")
    assert run.records and all(r.t_end_ns <= MAX_VIRTUAL_NS for r in run.records)
    load(tmp_path / "s.trace.json")
