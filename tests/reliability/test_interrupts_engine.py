"""Interrupts at the engine level: Ctrl-C inside the forward pass of ``generate``, aborts between
steps (``Engine.record_state``: the zero-token record of a state change made outside a step), a
stream closed early, a profiling window stopped early, and a subscriber that leaves while called."""

from __future__ import annotations

import pytest
from reliability_util import (
    assert_engine_clean,
    assert_every_request_ended,
    assert_final_record_shows_all_freed,
    failing_forward,
    params,
    tiny_engine,
)

from kvscope.runs.result.run import Run
from kvscope.telemetry.records import StepRecord

PROMPTS = [[5 + i, 40 + i, 80 + i, 120 + i] * (3 + i) for i in range(5)]


def test_keyboard_interrupt_inside_the_forward_pass_of_generate(tmp_path):
    engine = tiny_engine(max_num_seqs=2)
    hook = failing_forward(engine, KeyboardInterrupt(), after_calls=5)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(PROMPTS, params(30))
    run = Run.from_engine(engine)
    assert_engine_clean(engine)
    assert assert_every_request_ended(run, {"abort"})["abort"] == 5  # Ctrl-C aborts; it is no error
    assert_final_record_shows_all_freed(run)
    # 5 steps; the failed batch's blocks freed (recorded by step); the waiting ones aborted (by generate)
    assert engine.step_index == len(run.records) == 7
    assert [r.num_waiting for r in run.records[-2:]] == [3, 0]
    hook.remove()
    outs = engine.generate(PROMPTS[:2], params(4))
    assert all(o.finish_reason == "length" and len(o.token_ids) == 4 for o in outs)
    assert_engine_clean(engine)


def test_aborts_between_steps_are_recorded_once():
    engine = tiny_engine()
    for prompt in PROMPTS:
        engine.add_request(prompt, params(20))
    for _ in range(4):
        engine.step()
    assert engine.record_state() is None  # a step just recorded everything: nothing new
    n = engine.step_index
    running = next(iter(engine.requests))
    engine.abort(running)
    record = engine.record_state()
    assert isinstance(record, StepRecord) and record.step == n and engine.step_index == n + 1
    assert record.scheduled == [] and record.num_output_tokens == 0 and record.duration_ns == 0
    assert record.num_running == len(engine.scheduler.running) and record.page_map  # its blocks, freed
    assert all(e.state in ("free", "cached") for e in record.page_map.values())
    assert engine.record_state() is None  # recorded once

    waiting = engine.add_request([7, 8, 9], params(3))  # never scheduled: no block changes hands
    engine.abort(waiting)
    assert engine.record_state() is None  # queues as at the last record: nothing to show
    queue = len(engine.scheduler.waiting)
    engine.add_request([7, 8, 9], params(3))
    assert engine.record_state().num_waiting == queue + 1  # a queue that grew outside a step is shown

    engine.abort_all()  # records the end without being asked
    run = Run.from_engine(engine)
    assert_final_record_shows_all_freed(run)
    assert engine.step_index == len(run.records) == engine.recorder.num_steps_recorded
    assert engine.abort_all() is None and engine.step_index == len(run.records)  # nothing more


def test_a_fresh_or_finished_engine_records_nothing_extra():
    engine = tiny_engine()
    assert engine.record_state() is None and engine.step_index == 0
    engine.generate(PROMPTS[:3], params(5))
    n = engine.step_index
    engine.abort_all()
    assert engine.record_state() is None and engine.step_index == n == len(engine.recorder.steps)


def test_a_change_of_the_page_map_alone_is_recorded():
    engine = tiny_engine()
    engine.generate(PROMPTS[:3], params(5))  # their full blocks stay cached after they finish
    cached = {b for b, e in enumerate(engine.recorder.pages.entries) if e.state == "cached"}
    assert cached and engine.record_state() is None
    engine.pool.reset_prefix_cache()  # queues unchanged; the cached blocks become free
    record = engine.record_state()
    assert record is not None and set(record.page_map) == cached
    assert all(e.state == "free" for e in record.page_map.values())


def test_a_stream_closed_early_records_its_aborts():
    engine = tiny_engine()
    stream = engine.stream(PROMPTS[:3], params(50))
    for _ in range(6):
        next(stream)
    stream.close()  # the caller stopped reading (a closed notebook cell, a client gone)
    run = Run.from_engine(engine)
    assert_engine_clean(engine)
    assert assert_every_request_ended(run, {"abort"})["abort"] == 3
    assert_final_record_shows_all_freed(run)


def test_profiler_stopped_early_stops_listening():
    engine = tiny_engine()
    prof = engine.profile(num_steps=50)
    engine.generate(PROMPTS[:2], params(3))  # 3 steps of a 51-step window
    prof.stop()
    assert engine.recorder.subscribers == []
    engine.generate(PROMPTS[:2], params(3))
    assert all(r.profile is None for r in list(engine.recorder.steps)[-3:])


def test_profiler_window_that_closes_itself_attaches_its_last_step_then_leaves():
    engine = tiny_engine()
    with engine.profile(num_steps=2) as prof:  # one warm-up step, then steps 1 and 2
        engine.generate(PROMPTS[:2], params(6))
        assert engine.recorder.subscribers == [], "the window closed at step 2 but still listens"
    assert sorted(prof.summaries) == [1, 2]
    assert [r.profile is not None for r in engine.recorder.steps][:4] == [False, True, True, False]


def test_a_subscriber_leaving_while_called_does_not_hide_the_item_from_the_next():
    engine = tiny_engine()
    seen: list = []

    def once(item):
        unsubscribe()

    unsubscribe = engine.recorder.subscribe(once)
    engine.recorder.subscribe(seen.append)
    engine.generate(PROMPTS[:1], params(3))
    recorder = engine.recorder
    assert len(seen) == len(recorder.steps) + len(recorder.events) == 3 + 4, seen  # the first item too
    assert recorder.subscribers == [seen.append]
