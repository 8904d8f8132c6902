"""LiveRun: the engine in a background thread; stop, pause, failures, interrupts, files at the end."""

from __future__ import annotations

import time

import pytest
import torch

import kvscope
from kvscope import Engine, SamplingParams
from kvscope.runs.background.live import LiveRun, Outputs, RunStatus
from kvscope.runs.workload.items import WorkItem, synthetic_workload

torch.set_num_threads(1)  # a shared 2-core machine: no spinning intra-op threads
pytestmark = pytest.mark.timeout(120)


def _engine(**kwargs) -> Engine:
    return Engine("tiny", num_blocks=kwargs.pop("num_blocks", 64), **kwargs)


def _items(n: int = 6, out: tuple[int, int] = (8, 12)) -> list[WorkItem]:
    return synthetic_workload(n, (8, 24), out, vocab_size=512, exclude_ids=[0, 1, 2], seed=3)


def test_runs_in_the_background_and_finishes(tmp_path):
    files = Outputs(trace=tmp_path / "run.json", metrics=tmp_path / "run.jsonl", html=tmp_path / "run.html")
    run = LiveRun(_engine(), _items(), outputs=files, step_delay=0.01, dashboard=False)
    run.start()
    assert not run.done  # start() does not wait for the run (6 requests at 10 ms per step)
    assert run.wait(timeout=60) is run
    assert run.status is RunStatus.FINISHED and run.error is None
    outputs = run.outputs
    assert [o.request_id for o in outputs] == [f"{r.request_id}" for r in run._submitter.requests]
    assert all(o.finish_reason == "length" and len(o.token_ids) >= 8 for o in outputs)
    assert len(run.requests) == 6 and len(run.steps) == run.step > 0
    assert set(run.files.written) == {"trace", "metrics", "html"} and not run.files.errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.html", "run.json", "run.jsonl"]  # no temp files left
    back = kvscope.load(tmp_path / "run.json")
    assert len(back.records) == len(run.records) and back.meta["texts"].keys() == {o.request_id for o in outputs}


def test_step_and_request_frames_grow_while_running():
    run = LiveRun(_engine(), _items(4, (30, 30)), step_delay=0.02, dashboard=False).start()
    seen = []
    while not run.done and len(seen) < 50:
        seen.append(len(run.steps))
        time.sleep(0.05)
    run.wait(timeout=60)
    assert len(set(seen)) > 3, seen  # the DataFrame was rebuilt as records arrived
    assert len(run.steps) == run.step


def test_stop_aborts_everything_and_still_writes_files(tmp_path):
    files = Outputs(metrics=tmp_path / "m.jsonl")
    run = LiveRun(_engine(), _items(4, (500, 500)), outputs=files, step_delay=0.01, dashboard=False).start()
    while run.step < 5:
        time.sleep(0.01)
    run.stop()
    run.wait(timeout=30)
    assert run.status is RunStatus.STOPPED
    assert {o.finish_reason for o in run.outputs} == {"abort"}
    assert all(len(o.token_ids) < 500 for o in run.outputs)
    finished = [e for e in run.events if e.kind == "finished"]
    assert len(finished) == 4
    assert (tmp_path / "m.jsonl").exists()


def test_pause_holds_the_engine_between_steps():
    run = LiveRun(_engine(), _items(3, (200, 200)), step_delay=0.005, dashboard=False).start()
    while run.step < 3:
        time.sleep(0.01)
    run.pause()
    time.sleep(0.2)
    held = run.step
    time.sleep(0.3)
    assert run.step == held and run.paused and run.status is RunStatus.PAUSED
    run.resume()
    time.sleep(0.2)
    assert run.step > held
    run.stop()
    run.wait(timeout=30)


def test_a_bad_request_fails_alone_with_the_reason():
    items = [*_items(2), WorkItem([600, 601], SamplingParams(max_tokens=2))]  # outside the 512-token vocabulary
    run = LiveRun(_engine(), items, dashboard=False).start().wait(timeout=30)
    assert run.status is RunStatus.FINISHED
    bad = run.outputs[2]
    assert bad.finish_reason == "error" and bad.error.startswith("request 3 of 3: ")
    assert "outside the vocabulary" in bad.error
    assert [o.finish_reason for o in run.outputs[:2]] == ["length", "length"]


def test_an_engine_error_mid_run_aborts_the_rest(monkeypatch):
    engine = _engine()
    real_step, calls = engine.step, []

    def flaky_step():
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("device fell off the bus")
        return real_step()

    monkeypatch.setattr(engine, "step", flaky_step)
    run = LiveRun(engine, _items(3, (50, 50)), dashboard=False).start()
    with pytest.raises(RuntimeError, match="fell off the bus"):
        run.wait(timeout=30)
    assert not engine.has_unfinished_requests()
    assert {o.finish_reason for o in run.outputs} == {"abort"}


def test_keyboard_interrupt_while_waiting_stops_the_run():
    run = LiveRun(_engine(), _items(3, (500, 500)), step_delay=0.01, dashboard=False).start()
    real_wait, calls = run._done.wait, []

    def interrupted(timeout=None):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_wait(timeout)

    run._done.wait = interrupted
    with pytest.raises(KeyboardInterrupt):
        run.wait()
    assert run.done and run.status is RunStatus.STOPPED


def test_wait_timeout_and_file_errors(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    files = Outputs(html=blocker / "run.html")
    run = LiveRun(_engine(), _items(2, (200, 200)), outputs=files, step_delay=0.01, dashboard=False).start()
    with pytest.raises(TimeoutError, match="still going"):
        run.wait(timeout=0.05)
    run.stop()
    run.wait(timeout=30)
    assert "html" in run.files.errors and run.status_text == "stopped · could not write html"


def test_engine_factory_runs_on_the_run_thread():
    threads = []

    def make():
        import threading

        threads.append(threading.current_thread().name)
        return _engine()

    run = LiveRun(make, lambda engine: _items(2), dashboard=False).start().wait(timeout=60)
    assert threads == ["kvscope-run"] and len(run.workload) == 2 and run.status is RunStatus.FINISHED


def test_a_live_run_has_a_run_whose_lists_never_change_under_it():
    run = LiveRun(_engine(), _items(3, (40, 40)), step_delay=0.01, dashboard=False)
    assert not isinstance(run, kvscope.Run)  # composition: it has a Run
    run.start()
    while run.step < 3:
        time.sleep(0.01)
    early = run.run
    frozen = (list(early.records), list(early.events), len(early.steps))
    while run.step < 10 and not run.done:
        time.sleep(0.01)
    assert run.run is not early and len(run.run.records) > len(frozen[0])  # a new Run as records arrive
    assert (early.records, early.events, len(early.steps)) == frozen  # the old one was left as it was
    run.wait(timeout=60)
    final = run.run
    assert final is run.run and isinstance(final, kvscope.Run)  # over: one whole run
    assert final.meta["texts"] and final.records == run.records and len(run.steps) == run.step
    assert run.summary() == final.summary() and run.page_map_at(2) == final.page_map_at(2)


def test_the_run_buffer_is_bounded_and_hands_out_the_same_run_until_more_arrives():
    from kvscope.runs.result.buffer import RunBuffer

    done = LiveRun(_engine(), _items(2, (10, 10)), dashboard=False).start().wait(timeout=60)
    buffer = RunBuffer({"model": "tiny"}, capacity=4)
    for record in done.records:
        buffer.add(record)
    first = buffer.run()
    assert buffer.run() is first and [r.step for r in first.records] == [r.step for r in done.records[-4:]]
    buffer.add(done.events[0])
    assert buffer.run() is not first and buffer.run().events == [done.events[0]]
    assert buffer.num_steps == done.records[-1].step + 1 and first.meta == {"model": "tiny"}


def test_status_is_an_enum_with_its_details_beside_it():
    run = LiveRun(_engine(), _items(2), dashboard=False)
    assert run.status is RunStatus.STARTING and run.status == "starting" and f"{run.status}" == "starting"
    run.status = RunStatus.LOADING
    assert run.status_text == "loading model"
    run.status, run.error = RunStatus.FAILED, RuntimeError("boom")
    run.writing_files, run.files.errors["trace"] = True, "OSError: disk full"
    assert run.status_text == "failed: RuntimeError: boom · writing files · could not write trace"


def test_the_engine_is_not_tagged_and_is_free_again_after_a_run():
    engine = _engine()
    before = set(vars(engine))
    first = LiveRun(engine, _items(2, (200, 200)), step_delay=0.01, dashboard=False).start()
    with pytest.raises(RuntimeError, match="this engine is already running"):
        LiveRun(engine, _items(2), dashboard=False).start()
    assert set(vars(engine)) == before  # nothing written on the engine: the table is in live_state
    first.stop()
    first.wait(timeout=60)
    again = LiveRun(engine, _items(2), dashboard=False).start().wait(timeout=60)
    assert again.status is RunStatus.FINISHED
