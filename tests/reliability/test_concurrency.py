"""One engine, several threads: every public call holds the engine's lock, so calls from two threads
never interleave inside a step. ``generate`` and ``stream`` take the lock per step, so two threads'
calls share the steps and both finish with exactly the tokens each request makes alone."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from reliability_util import (
    FIGURES,
    assert_engine_clean,
    assert_every_request_ended,
    params,
    reference_tokens,
    tiny_engine,
    wait_for_steps,
    workload,
)

from kvscope.runs.background.live import LiveRun
from kvscope.runs.result.run import Run

pytestmark = pytest.mark.timeout(300)
ROUNDS = 4


def _in_threads(*targets) -> list[BaseException]:
    """Run each target in its own thread, released together; the exceptions they raised."""
    barrier = threading.Barrier(len(targets))
    errors: list[BaseException] = []

    def run(target) -> None:
        barrier.wait()
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,), name=f"caller-{i}") for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads), "a caller is stuck"
    return errors


def test_two_threads_calling_generate_on_one_engine_both_get_every_token():
    engine = tiny_engine(max_num_seqs=6, num_blocks=64)
    batches = [workload(3, out=12, seed=s) for s in (21, 22)]
    expected = [reference_tokens(items) for items in batches]
    got: list[list[list[list[int]]]] = [[], []]

    def caller(k: int):
        def run() -> None:
            items = batches[k]
            for _ in range(ROUNDS):
                outs = engine.generate([i.prompt for i in items], [i.params for i in items])
                assert all(o.finish_reason == "length" for o in outs), [o.finish_reason for o in outs]
                got[k].append([o.token_ids for o in outs])
        return run

    assert _in_threads(caller(0), caller(1)) == []
    FIGURES["generate calls from two threads on one engine"] += 2 * ROUNDS
    for k in (0, 1):
        assert got[k] == [expected[k]] * ROUNDS
    assert_engine_clean(engine)
    run = Run.from_engine(engine)
    assert assert_every_request_ended(run, {"length"})["length"] == 2 * 3 * ROUNDS
    shared = [r for r in run.records if len({i.request_id for i in r.scheduled}) > 3]
    assert shared, "the two threads' requests were never in one step (the test proved nothing)"
    steps = [r.step for r in run.records]
    assert steps == list(range(len(steps)))  # one step at a time, indices unique


def test_a_stream_sees_the_tokens_of_steps_another_thread_ran():
    engine = tiny_engine(max_num_seqs=6, num_blocks=64)
    streamed, generated = workload(2, out=16, seed=31), workload(2, out=16, seed=32)
    expected = reference_tokens(streamed)
    deltas: list = []

    def stream() -> None:
        deltas.extend(engine.stream([i.prompt for i in streamed], params(16)))

    def generate() -> None:
        for _ in range(ROUNDS):
            engine.generate([i.prompt for i in generated], params(16))

    assert _in_threads(stream, generate) == []
    for i, tokens in enumerate(expected):
        mine = [d for d in deltas if d.index == i]
        assert [d.token_id for d in mine if d.token_id is not None] == tokens
        assert [d.finished for d in mine] == [False] * (len(tokens) - 1) + [True]
        assert mine[-1].finish_reason == "length"
    assert_engine_clean(engine)


def test_generate_on_the_engine_a_live_run_drives_finishes_and_the_run_too():
    """The notebook calls ``engine.generate`` while a live run steps the same engine: both finish,
    and the run, when it ends, aborts only its own requests."""
    engine = tiny_engine(max_num_seqs=6, num_blocks=64)
    items, mine = workload(3, out=40, seed=41), workload(2, out=10, seed=42)
    expected_run, expected_mine = reference_tokens(items), reference_tokens(mine)
    run = LiveRun(engine, items, step_delay=0.002, dashboard=False).start()
    wait_for_steps(run, 3)
    outs = engine.generate([i.prompt for i in mine], [i.params for i in mine])
    run.wait(timeout=120)
    assert [o.token_ids for o in outs] == expected_mine and {o.finish_reason for o in outs} == {"length"}
    assert [o.token_ids for o in run.outputs] == expected_run
    assert_engine_clean(engine)
    counts = Counter(e.kind for e in run.events)
    assert counts["queued"] == counts["finished"] == 5  # the run's records show the other requests too


def test_a_stopped_live_run_leaves_another_threads_requests_running():
    engine = tiny_engine(max_num_seqs=6, num_blocks=64)
    other = workload(1, out=120, seed=51)
    expected = reference_tokens(other)
    request_id = engine.add_request(other[0].prompt, other[0].params)
    run = LiveRun(engine, workload(2, out=200, seed=52), step_delay=0.01, dashboard=False).start()
    wait_for_steps(run, 3)
    run.stop()
    run.wait(timeout=60)
    assert {o.finish_reason for o in run.outputs} == {"abort"}
    request = engine.requests[request_id]  # not aborted: it goes on where the run left it
    assert not request.is_finished and 0 < len(request.output_token_ids) < 120
    tokens = list(request.output_token_ids)
    while engine.has_unfinished_requests():
        engine.step()
    assert request.finish_reason == "length" and request.output_token_ids == expected[0]
    assert request.output_token_ids[: len(tokens)] == tokens
    assert_engine_clean(engine)
