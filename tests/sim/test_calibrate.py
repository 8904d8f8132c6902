"""``fit_step_model``: a known linear step time is recovered, held-out steps are judged, the model saves and
loads back, and a watched vLLM's steps (counts and durations only) can be fitted too."""

from __future__ import annotations

import json

import pytest

from kvscope.sim.calibrate import fit_step_model, nnls
from kvscope.sim.step_model import load_step_model
from kvscope.telemetry.records import KVState, ScheduledItem, StepRecord
from kvscope.telemetry.step_features import StepFeatures

KV = KVState(64, 16, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0, 0, 0, 0)


def record(step: int, t0: int, dur: int, items: list[ScheduledItem], counts=(0, 0, 0, 0), waiting=0) -> StepRecord:
    return StepRecord(step, t0, t0 + dur, 0, 0, dur, 0, 0, *counts, len(items), waiting, 0, 0, len(items), items, KV)


def true_time(f: StepFeatures) -> float:  # seconds
    return (2e-3 + 5e-6 * f.prefill_tokens + 1e-9 * f.prefill_attention if f.prefill_tokens
            else 1e-3 + 2e-5 * f.num_seqs + 1e-8 * f.decode_context)


def synthetic_run(n: int = 200, time_of=true_time) -> list[StepRecord]:
    records, t = [], 0
    for i in range(n):
        if i % 4 == 0:
            items = [ScheduledItem(f"p{i}", "prefill", 16 + i, 16 + i + 8 * (i % 3), True)]
        else:
            items = [ScheduledItem(f"d{j}", "decode", 1, 40 + 13 * j + i, True) for j in range(1 + i % 7)]
        f = StepFeatures.of_record(record(i, 0, 1, items), 16)
        dur = round(time_of(f) * 1e9)
        records.append(record(i, t, dur, items))
        t += dur
    return records


def test_a_known_linear_step_time_is_recovered():
    model = fit_step_model(synthetic_run(), 16, "synthetic")
    assert model.fit["held_out_median_abs_error"] < 1e-6
    assert model.phases["decode"].intercept_s == pytest.approx(1e-3, rel=1e-6)
    assert model.phases["prefill"].coef["prefill_tokens"] == pytest.approx(5e-6, rel=1e-4)
    assert model.phases["prefill"].intercept_s == pytest.approx(2e-3, rel=1e-4)
    assert model.phases["decode"].ratio_quantiles[0] == pytest.approx(1.0, abs=1e-9)


def test_a_prefill_steps_fixed_cost_is_at_least_a_decode_steps():
    """Steps whose prefill line would start below the decode steps' fixed cost (here by construction; in a real
    run when the mixed steps' decode tokens stand in for it) get the decode steps' fixed cost, and the rest of
    the line is fitted above it."""
    def cheap_prefill(f: StepFeatures) -> float:
        return 0.4e-3 + 5e-6 * f.prefill_tokens if f.prefill_tokens else true_time(f)

    model = fit_step_model(synthetic_run(time_of=cheap_prefill), 16)
    decode, prefill = model.phases["decode"], model.phases["prefill"]
    assert decode.intercept_s == pytest.approx(1e-3, rel=1e-6)
    assert prefill.intercept_s == pytest.approx(decode.intercept_s)  # not 0.4 ms
    assert all(c >= 0 for c in prefill.coef.values())


def test_nnls_keeps_costs_non_negative():
    import numpy as np

    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    x = nnls(a, np.array([3.0, 2.0, 1.0]))  # the unconstrained slope is -1
    assert (x >= 0).all() and x[1] == 0


def test_the_model_saves_and_loads_back_and_bad_files_are_refused(tmp_path):
    model = fit_step_model(synthetic_run(), 16)
    path = model.save(tmp_path / "step.json")
    again = load_step_model(path)
    f = StepFeatures(prefill_tokens=100, num_seqs=1, context_tokens=100, prefill_attention=5000, blocks=7)
    assert again.expected(f) == pytest.approx(model.expected(f))
    data = json.loads(path.read_text())
    data["phases"]["decode"]["coef"]["decode_tokens"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="decode_tokens=-1 must be a finite number from 0 to 60"):
        load_step_model(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="kvscope calibrate"):
        load_step_model(tmp_path / "missing.json")


def test_a_watched_vllms_iteration_details_can_be_fitted():
    """vLLM's plugin lines with iteration details give each step's counts and elapsed time, no items."""
    records, t = [], 0
    for i in range(60):
        prefill = (1, 64 + i, 2, 2) if i % 3 == 0 else (0, 0, 3 + i % 5, 3 + i % 5)
        f = StepFeatures(prefill_tokens=prefill[1], decode_tokens=prefill[3], num_seqs=prefill[0] + prefill[2])
        dur = round(true_time(f) * 1e9)
        records.append(record(-1, t, dur, [], prefill))
        t += dur + 5_000_000  # idle between vLLM steps: not part of the step
    model = fit_step_model(records, 16, "watch")
    assert model.fit["held_out_median_abs_error"] < 1e-6
    assert "context_tokens" in model.fit["features_not_varied"]["decode"]
    with pytest.raises(ValueError, match="enable-logging-iteration-details"):
        fit_step_model([record(-1, 0, 0, [], (0, 0, 3, 3))] * 20, 16)
