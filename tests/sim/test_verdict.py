"""``kvscope calibrate``'s verdict (issue 37 item 6): good enough to simulate with or not, why (too few steps,
steps too short, a busy machine), what to do and the next command, each coefficient with its unit; and steps of no
length never make a step model that does not load back (issue 38 item 8)."""

from __future__ import annotations

import json
import random

import pytest

from kvscope.sim.calibrate import describe_fit, fit_step_model
from kvscope.sim.step_model import load_step_model
from kvscope.sim.verdict import coefficient_units, judge_fit
from kvscope.telemetry.records import ScheduledItem
from kvscope.telemetry.step_features import StepFeatures

from .test_calibrate import record, synthetic_run, true_time


def _strict(text: str):
    def refuse(name: str):
        raise AssertionError(f"{name} in a step model: not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_clean_fit_is_good_and_the_next_command_simulates_with_it():
    model = fit_step_model(synthetic_run(), 16, "real.metrics.jsonl")
    verdict = judge_fit(model.fit)
    assert verdict.level == "good" and verdict.reasons == []
    text = describe_fit(model, "real.metrics.jsonl", "step.json")
    assert "verdict: good enough to simulate with" in text
    assert "next: kvscope simulate --step-model step.json --replay real.metrics.jsonl" in text
    assert "5 us per prefill token" in text and "2.000 ms per step" in text and "10 us per request in the batch" in text


def _steady_run(n: int, noise: float, seed: int = 0) -> list:
    """Decode steps in stretches of 8 with the same batch (its context growing by one token each), a prefill
    between them; each step's time ``true_time`` times a random factor within 1 +- ``noise``."""
    rng, records, t = random.Random(seed), [], 0
    for i in range(n):
        if i % 8 == 0:
            items = [ScheduledItem(f"p{i}", "prefill", 32 + i % 50, 32 + i % 50, True)]
        else:
            items = [ScheduledItem(f"d{j}", "decode", 1, 40 + 9 * j + i, True) for j in range(1 + (i // 8) % 6)]
        dur = round(true_time(StepFeatures.of_record(record(i, 0, 1, items), 16)) * rng.uniform(1 - noise, 1 + noise)
                    * 1e9)
        records.append(record(i, t, dur, items))
        t += dur
    return records


def test_a_quiet_machine_has_little_jitter_and_a_busy_one_is_named_with_its_noise():
    assert fit_step_model(_steady_run(400, 0.02), 16).fit["jitter"] < 0.05
    model = fit_step_model(_steady_run(400, 0.7), 16)
    assert model.fit["jitter"] > 0.15
    verdict = judge_fit(model.fit)
    assert verdict.level != "good"
    assert any(r.startswith("a busy machine: consecutive like steps differ by") for r in verdict.reasons)
    assert any("idle machine" in a for a in verdict.advice)


def test_too_few_steps_and_too_short_steps_are_not_good_enough():
    few = judge_fit(fit_step_model(synthetic_run(30), 16).fit)
    assert few.level == "not good enough" and any(r.startswith("too few steps") for r in few.reasons)
    short = judge_fit(fit_step_model(synthetic_run(200, lambda f: true_time(f) / 20), 16).fit)
    assert any(r.startswith("steps too short") for r in short.reasons)
    text = describe_fit(fit_step_model(synthetic_run(30), 16), "r.jsonl", "s.json")
    assert "not good enough" in text and "next: record again" in text


def test_coefficients_say_what_they_are_a_cost_of():
    assert coefficient_units({"prefill_tokens": 9.02e-3, "decode_context": 2e-9, "num_seqs": 0.0}) == [
        "9.02e+03 us per prefill token", "2 ns per context token of a decoding request"]


def test_steps_of_no_length_are_refused_or_left_out_and_the_file_loads_back(tmp_path):
    with pytest.raises(ValueError, match="steps have no length"):
        fit_step_model(synthetic_run(time_of=lambda f: 0.0), 16)
    records = synthetic_run()
    for r in records[::3]:  # a third of the steps of no length: left out, said so
        r.t_end_ns = r.t_start_ns
    for r in records:  # no step's period from the next one's start either
        r.num_running = r.num_waiting = 0
    model = fit_step_model(records, 16)
    assert model.fit["untimed_steps"] == len(records[::3])
    data = _strict(model.save(tmp_path / "step.json").read_text())
    assert data["fit"]["untimed_steps"] == len(records[::3])
    load_step_model(tmp_path / "step.json")
    assert "left out: 67 steps of no length" in describe_fit(model)
