"""Threads: the engine thread and the dashboard's update thread end with the run, however it ends
(finished, stopped, failed); two runs at once in one process either both run right (their own
engines) or the second is refused with a clear message (one engine) - directly and via the magic."""

from __future__ import annotations

import threading

import pytest
from IPython.utils.capture import capture_output
from reliability_util import (
    assert_engine_clean,
    failing_forward,
    kvscope_threads,
    reference_tokens,
    threads_left,
    tiny_engine,
    wait_for_steps,
    workload,
)

from kvscope.runs.background.live import LiveRun, RunStatus

pytestmark = pytest.mark.timeout(120)
SMALL = "--requests 3 --prompt-len 8-24 --output-len 30 --num-blocks 64 --step-delay 0.01"


def _overlap(a: LiveRun, b: LiveRun) -> bool:
    """Whether the two runs' steps interleaved in time (else the test proved nothing)."""
    return a.records[0].t_start_ns < b.records[-1].t_end_ns and b.records[0].t_start_ns < a.records[-1].t_end_ns


@pytest.mark.parametrize("dashboard", ["widgets", "headless"])
@pytest.mark.parametrize("ending", ["finish", "stop", "error"])
def test_no_thread_outlives_its_run(ending, dashboard):
    before = set(threading.enumerate())
    engine = tiny_engine()
    if ending == "error":
        failing_forward(engine, RuntimeError("boom"), after_calls=10)
    run = LiveRun(engine, workload(3, out=60), step_delay=0.005,
                  dashboard_options={"refresh_hz": 10.0, "headless": dashboard == "headless"})
    if dashboard == "widgets":
        assert run.dashboard.widget is not None  # built, as a notebook shows it
    run.start()
    wait_for_steps(run, 5)
    assert kvscope_threads() == ["kvscope-dashboard", "kvscope-run"]  # both were really running
    if ending == "stop":
        run.stop()
    if ending == "error":
        with pytest.raises(RuntimeError, match="boom"):
            run.wait(timeout=60)
    else:
        run.wait(timeout=60)
    assert run.status_text == {"finish": "finished", "stop": "stopped", "error": "failed: RuntimeError: boom"}[ending]
    assert run.dashboard.finished and run.dashboard.error is None
    assert threads_left(before) == []
    assert_engine_clean(engine)


def test_two_runs_with_their_own_engines_run_at_once():
    items_a, items_b = workload(3, out=40, seed=1), workload(3, out=40, seed=2)
    a = LiveRun(tiny_engine(), items_a, step_delay=0.005, dashboard=False).start()
    b = LiveRun(tiny_engine(), items_b, step_delay=0.005, dashboard=False).start()
    a.wait(timeout=60)
    b.wait(timeout=60)
    assert a.status is b.status is RunStatus.FINISHED and _overlap(a, b)
    assert [o.token_ids for o in a.outputs] == reference_tokens(items_a)
    assert [o.token_ids for o in b.outputs] == reference_tokens(items_b)


def test_models_loaded_at_once_get_the_same_weights():
    """The tiny model's random init draws from torch's global generator: two runs loading at once
    must not interleave their draws (they did: 20 of 30 loads differed before the lock)."""
    from kvscope.models.loader import build_tiny_model

    def checksum() -> float:
        return sum(float(p.detach().double().sum()) for p in build_tiny_model().parameters())

    expected, sums = checksum(), []

    def load_many() -> None:
        sums.extend(checksum() for _ in range(10))

    threads = [threading.Thread(target=load_many) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sums == [expected] * 20


def test_a_second_run_on_a_busy_engine_is_refused(after_items, after_reference):
    engine = tiny_engine()
    first = LiveRun(engine, workload(3, out=200), step_delay=0.005, dashboard=False).start()
    wait_for_steps(first, 3)
    before = set(threading.enumerate())
    second = LiveRun(engine, after_items, dashboard=False)
    with pytest.raises(RuntimeError, match=r"this engine is already running <LiveRun .*stop it \(run.stop\(\)\)"):
        second.start()
    assert threads_left(before, timeout=0) == []  # the refused run started nothing
    via_factory = LiveRun(lambda: engine, after_items, dashboard=False).start()  # the same engine, later
    with pytest.raises(RuntimeError, match="this engine is already running"):
        via_factory.wait(timeout=30)
    assert first.status is RunStatus.RUNNING and not first.done  # the first run never noticed
    first.stop()
    first.wait(timeout=60)
    assert first.status is RunStatus.STOPPED and {o.finish_reason for o in first.outputs} == {"abort"}
    again = LiveRun(engine, after_items, dashboard=False).start().wait(timeout=60)  # free again
    assert [o.token_ids for o in again.outputs] == after_reference



def test_two_magic_runs_at_once_in_one_kernel(ip):
    before = set(threading.enumerate())
    with capture_output():  # both dashboards are displayed (and their threads run)
        # long enough (60 steps, 50 ms apart) to outlast building a's dashboard before b starts
        a = ip.run_line_magic("kvscope", f"{SMALL} --output-len 60 --step-delay 0.05 -o")
        b = ip.run_line_magic("kvscope", f"{SMALL} --output-len 60 --step-delay 0.05 -o")
        assert a.dashboard is not None and b.dashboard is not None
        a.wait(timeout=60)
        b.wait(timeout=60)
    assert a.status is b.status is RunStatus.FINISHED and _overlap(a, b)
    # the same arguments, loaded and run at the same time, give the same outputs as one run alone
    expected = reference_tokens(a.workload)
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs] == expected
    assert threads_left(before) == []


def test_the_magic_after_an_interrupted_wait_leaves_no_thread(ip, monkeypatch):
    before = set(threading.enumerate())
    run = ip.run_line_magic("kvscope", f"{SMALL} --output-len 400 -q -o")
    wait_for_steps(run, 3)
    real_wait = run._done.wait

    def interrupted(timeout=None):  # Ctrl-C lands while wait() is blocked
        monkeypatch.setattr(run._done, "wait", real_wait)
        raise KeyboardInterrupt

    monkeypatch.setattr(run._done, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run.wait()
    assert run.done and run.status is RunStatus.STOPPED
    assert threads_left(before) == []
