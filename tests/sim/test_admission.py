"""``kvscope.sim.admission``: the delay before a request's first schedule at an idle engine, measured on a run's
requests, saved with the step model, and added by a simulation before each request's first step."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvscope.engine.config import EngineConfig
from kvscope.runs.background.live import LiveRun
from kvscope.runs.workload.items import synthetic_workload, with_arrivals
from kvscope.sim.admission import MIN_IDLE_ARRIVALS, idle_arrivals, measure
from kvscope.sim.build import simulated_engine
from kvscope.sim.shape import resolve_shape
from kvscope.sim.step_model import LinearStepModel, PhaseFit, load_step_model


def test_an_arrival_is_idle_only_when_every_earlier_request_had_finished():
    queued = np.array([0.0, 1.0, 1.5, 3.0, 3.0, 10.0])
    finished = np.array([0.5, 2.0, 2.5, 4.0, 3.5, np.nan])  # the last never finished
    # 1.5 arrives while 1.0 runs; the second 3.0 arrives with the first; 10.0 after all had finished
    assert idle_arrivals(queued, finished).tolist() == [True, True, False, True, False, True]
    # an unfinished request keeps every later arrival busy
    assert idle_arrivals(np.array([0.0, 1.0]), np.array([np.nan, 2.0])).tolist() == [True, False]


def frame(delays, gap=1.0):
    n = len(delays)
    queued = np.arange(n) * gap
    return pd.DataFrame({"queued_s": queued, "scheduled_s": queued + np.asarray(delays),
                         "finished_s": queued + 0.1})


def test_the_median_delay_of_idle_arrivals_only():
    requests = frame([0.004, 0.003, 0.005, 0.004, 0.006, 0.004])
    # a burst of arrivals at t=100 queued behind each other: not counted
    burst = pd.DataFrame({"queued_s": [100.0] * 4, "scheduled_s": [100.004, 100.2, 100.4, 100.6],
                          "finished_s": [100.3, 100.5, 100.7, 100.9]})
    delay = measure(pd.concat([requests, burst]))
    assert delay is not None and delay.seconds == pytest.approx(0.004)
    assert (delay.idle_arrivals, delay.requests) == (7, 10)  # the burst's first found the engine idle


def test_too_few_idle_arrivals_or_no_times_measure_nothing():
    assert measure(frame([0.004] * (MIN_IDLE_ARRIVALS - 1))) is None
    assert measure(pd.DataFrame({"queued_s": [0.0]})) is None  # a run without the columns


def test_the_delay_is_saved_with_the_step_model_and_an_older_file_reads_as_zero(tmp_path):
    model = LinearStepModel({"prefill": PhaseFit(1e-3, {}), "decode": PhaseFit(1e-3, {})}, admission_s=0.004)
    assert load_step_model(model.save(tmp_path / "step.json")).admission_s == 0.004
    old = json.loads((tmp_path / "step.json").read_text())
    del old["admission_s"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert load_step_model(tmp_path / "old.json").admission_s == 0.0
    old["admission_s"] = "4ms"
    (tmp_path / "bad.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="admission_s"):
        load_step_model(tmp_path / "bad.json")


@pytest.mark.parametrize("spaced", [False, True])
def test_a_simulation_adds_the_delay_before_each_first_step_and_keeps_the_arrival(spaced):
    """Alone on an idle engine (arrivals far apart, or one request), a request's TTFT is the delay plus its
    prefill step; its arrival time is the workload's, not the delayed submission."""
    runs = {}
    for admission in (0.0, 0.004):
        model = LinearStepModel({"prefill": PhaseFit(0.010, {}), "decode": PhaseFit(0.002, {})})
        items = synthetic_workload(4 if spaced else 1, (8, 8), (4, 4), vocab_size=256, seed=0)
        if spaced:
            items = with_arrivals(items, 0.05, "poisson", 0)  # ~20 s apart: every arrival finds the engine idle
        engine = simulated_engine(resolve_shape("tiny"), EngineConfig(block_size=16, num_blocks=64), model)
        live = LiveRun(engine, items, dashboard=False, admission_s=admission).start()
        live.wait()
        assert live.error is None
        runs[admission] = live.run.requests.sort_values("queued_s").reset_index(drop=True)
    plain, late = runs[0.0], runs[0.004]
    assert np.allclose(plain["queued_s"], late["queued_s"])  # the same arrival times
    assert np.allclose(plain["ttft_s"], 0.010) and np.allclose(late["ttft_s"], 0.014)
    assert np.allclose(late["queue_s"], 0.004)
