"""Interrupting a background run: the dashboard's Stop button, ``run.stop()`` (with a profiling
window open), and an exception raised inside the model's forward pass.

Each time: the engine ends consistent (every block back in the pool, every request ended as
aborted or errored in the recorded events), the last record shows what the interrupt freed (not
the state before it), the trace, metrics and report written at the end are whole and load back,
no thread is left, and a new run on the same engine gives the right outputs.
"""

from __future__ import annotations

import threading

import pytest
from reliability_util import (
    FIGURES,
    assert_engine_clean,
    assert_every_request_ended,
    assert_files_valid,
    assert_final_record_shows_all_freed,
    assert_new_run_works,
    failing_forward,
    threads_left,
    tiny_engine,
    wait_for_steps,
    workload,
)

from kvscope.runs.background.live import LiveRun, Outputs, RunStatus

pytestmark = pytest.mark.timeout(120)


def _outputs(tmp_path) -> Outputs:
    return Outputs(trace=tmp_path / "run.trace.json", metrics=tmp_path / "run.metrics.jsonl",
                   html=tmp_path / "run.html")


def _check_files(run: LiveRun, files: Outputs) -> None:
    assert set(run.files.written) == {"trace", "metrics", "html"} and not run.files.errors, run.files.errors
    assert_files_valid(run, files.trace, files.metrics, files.html)


def test_stop_button_on_the_dashboard(tmp_path, after_items, after_reference):
    before = set(threading.enumerate())
    engine = tiny_engine()
    files = _outputs(tmp_path)
    run = LiveRun(engine, workload(6, out=300), outputs=files, step_delay=0.005,
                  dashboard_options={"refresh_hz": 10.0})
    dash = run.dashboard
    assert dash.widget is not None  # the widgets, as a notebook shows them: the Stop button exists
    stop_button = dash.view.buttons[0]
    assert stop_button.description == "Stop" and not stop_button.disabled
    run.start()
    wait_for_steps(run, 20)
    stop_button.click()  # what a click in the browser runs on the kernel
    FIGURES["runs stopped (Stop button, run.stop())"] += 1
    run.wait(timeout=60)

    assert run.status is RunStatus.STOPPED and run.error is None
    assert all(button.disabled for button in dash.view.buttons)
    assert_engine_clean(engine)
    assert assert_every_request_ended(run, {"abort"})["abort"] == 6
    assert all(len(o.token_ids) < 300 for o in run.outputs)
    assert_final_record_shows_all_freed(run)
    # the dashboard ends on the recorded state too (no patching of the numbers at the end)
    kpi = dash.panel["kpi"].values
    assert (kpi["running"], kpi["waiting"], kpi["kv_usage"]) == (0, 0, 0.0), kpi
    shown = dash.panel["page_map"].source.data["state"]
    assert "used" not in shown and "shared" not in shown
    assert dash.finished and dash.error is None
    _check_files(run, files)
    assert threads_left(before) == []
    assert_new_run_works(engine, after_items, after_reference)


def test_run_stop_during_a_profiling_window(tmp_path, after_items, after_reference):
    engine = tiny_engine()
    files = _outputs(tmp_path)
    run = LiveRun(engine, workload(5, out=300), outputs=files, step_delay=0.005, profile_steps=200,
                  dashboard=False).start()
    wait_for_steps(run, 8)
    run.stop()
    FIGURES["runs stopped (Stop button, run.stop())"] += 1
    run.wait(timeout=60)

    assert run.status is RunStatus.STOPPED
    assert_engine_clean(engine)
    assert assert_every_request_ended(run, {"abort"})["abort"] == 5
    assert_final_record_shows_all_freed(run)
    assert any(r.profile is not None for r in run.records), "the steps profiled before the stop are kept"
    assert engine.recorder.subscribers == [], "the profiler or the run still listens to the recorder"
    assert engine.phase_marks.__class__.__name__ == "NullMarks" and engine.runner.backend.name in ("torch", "cpu")
    _check_files(run, files)
    assert_new_run_works(engine, after_items, after_reference)


@pytest.mark.parametrize("after_calls", [0, 7])  # the very first forward pass; one mid-run
def test_exception_inside_the_forward_pass(tmp_path, after_items, after_reference, after_calls):
    before = set(threading.enumerate())
    engine = tiny_engine(max_num_seqs=2)  # 5 requests: 2 in the failing batch, 3 still waiting
    hook = failing_forward(engine, RuntimeError("CUDA error: an illegal memory access"), after_calls)
    files = _outputs(tmp_path)
    run = LiveRun(engine, workload(5, out=40), outputs=files, dashboard_options={"refresh_hz": 10.0},
                  dashboard=True).start()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run.wait(timeout=60)

    assert run.status is RunStatus.FAILED
    assert run.status_text == "failed: RuntimeError: CUDA error: an illegal memory access"
    assert_engine_clean(engine)
    reasons = assert_every_request_ended(run, {"error", "abort"})
    assert reasons == {"error": 2, "abort": 3}, reasons
    errors = [o.error for o in run.outputs if o.finish_reason == "error"]
    assert errors == ["the forward pass failed: RuntimeError: CUDA error: an illegal memory access"] * 2
    assert_final_record_shows_all_freed(run)
    assert run.dashboard.finished and run.dashboard.panel["kpi"].values["running"] == 0
    _check_files(run, files)
    assert threads_left(before) == []
    hook.remove()
    assert_new_run_works(engine, after_items, after_reference)


def test_a_failure_while_winding_down_still_ends_the_run(monkeypatch, after_items, after_reference):
    """Whatever goes wrong after the loop (here: writing the files), wait() must not hang."""
    engine = tiny_engine()
    run = LiveRun(engine, workload(2, out=3), dashboard=False)

    def finish(*args) -> None:
        FIGURES["failures while winding down"] += 1
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(run, "_finish", finish)
    run.start()
    with pytest.raises(RuntimeError, match="disk on fire"):
        run.wait(timeout=30)
    assert run.done and run.status_text == "failed: RuntimeError: disk on fire"
    assert_engine_clean(engine)
    assert_new_run_works(engine, after_items, after_reference)  # the engine was let go
