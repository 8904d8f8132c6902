"""Identity: a request id reused after its request finished never merges two requests in the records
(the recorder records the later one as ``id#2``, ...), and nothing keeps per-request state after a
request ends: after hundreds of short requests (most finishing in the step that admitted them),
preemptions and aborts, every per-request structure of the engine and the recorder is empty, and the
recorder's memory of ids is bounded by its event ring."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from reliability_util import FIGURES, assert_engine_clean, params, reference_tokens, tiny_engine, workload

from kvscope.runs.result.run import Run

pytestmark = pytest.mark.timeout(120)


def _run_alone(engine, request_id: str, prompt: list[int], max_tokens: int) -> None:
    engine.add_request(prompt, params(max_tokens), request_id=request_id)
    while engine.has_unfinished_requests():
        engine.step()


def _recorded_ids_are_consistent(run: Run) -> Counter:
    """Each recorded id has one ``queued`` and one ``finished`` event, and every id a step record or the
    page map names is one of them; returns the count of queued ids."""
    queued = Counter(e.request_id for e in run.events if e.kind == "queued")
    finished = Counter(e.request_id for e in run.events if e.kind == "finished")
    assert max(queued.values()) == 1 and queued == finished, (queued, finished)
    named = {item.request_id for r in run.records for item in r.scheduled}
    named |= {e.owner for r in run.records for e in r.page_map.values() if e.owner}
    assert named <= set(queued), named - set(queued)
    return queued


def test_a_reused_id_is_recorded_as_a_new_request():
    engine = tiny_engine()
    items = workload(3, out=5, seed=61)
    for item in items:
        _run_alone(engine, "a", item.prompt, 5)
    _run_alone(engine, "a#2", items[0].prompt, 3)  # a source id that looks like a recorded one
    _run_alone(engine, "a", items[1].prompt, 2)
    run = Run.from_engine(engine)
    queued = _recorded_ids_are_consistent(run)
    assert list(queued) == ["a", "a#2", "a#3", "a#2#2", "a#4"]
    requests = run.requests.set_index("request_id")
    assert requests.loc["a", "num_output_tokens"] == 5 and requests.loc["a#4", "num_output_tokens"] == 2
    assert requests.loc["a", "num_prompt_tokens"] == len(items[0].prompt)
    assert requests.loc["a#3", "num_prompt_tokens"] == len(items[2].prompt)
    assert_engine_clean(engine)
    FIGURES["reused request ids kept apart"] += 4


def test_an_id_still_in_use_is_refused_and_reuse_within_one_batch_is_kept_apart():
    engine = tiny_engine()
    engine.add_request([5, 6, 7], params(4), request_id="x")
    with pytest.raises(ValueError, match="request id 'x' is already in use"):
        engine.add_request([5, 6, 7], params(4), request_id="x")
    engine.step()  # prefill + first token
    engine.step()
    engine.abort("x")
    engine.add_request([8, 9, 10], params(1), request_id="x")  # finishes in its first step
    engine.add_request([8, 9, 11], params(3), request_id="y")
    engine.step()
    engine.add_request([8, 9, 12], params(2), request_id="x")
    while engine.has_unfinished_requests():
        engine.step()
    run = Run.from_engine(engine)
    assert list(_recorded_ids_are_consistent(run)) == ["x", "x#2", "y", "x#3"]
    reasons = {e.request_id: e.reason for e in run.events if e.kind == "finished"}
    assert reasons == {"x": "abort", "x#2": "length", "y": "length", "x#3": "length"}


def test_per_request_state_is_dropped_when_requests_end():
    """Hundreds of requests, most ending in the step that admitted them, with preemptions, aborts, and
    ids reused: afterwards no per-request structure holds anything, and the recorder's memory of
    ids stays within its event ring."""
    rng = random.Random(7)
    engine = tiny_engine(num_blocks=20, max_num_seqs=8, max_num_batched_tokens=48)
    recorder = engine.recorder
    recorder.capacity = 25  # a small ring: events of at most 100 requests' worth
    recorder.clear()
    items = workload(300, out=1, seed=71, prompt_len=(2, 30))
    for i, item in enumerate(items):
        long = rng.random() < 0.2
        engine.add_request(item.prompt, params(rng.randint(8, 40) if long else 1), request_id=f"r{i % 37}"
                           if not engine.requests.get(f"r{i % 37}") else None)
        if rng.random() < 0.05 and engine.requests:
            engine.abort(rng.choice(sorted(engine.requests)))
        if rng.random() < 0.7:
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.num_preemptions > 0  # the pool was tight enough to preempt
    assert_engine_clean(engine)
    assert engine.kv._num_offered == {} and engine.kv.cached_this_step is not None
    assert recorder._seen_scheduled == set() and recorder._was_preempted == set()
    assert recorder._renamed == {} and recorder._pending == []
    assert recorder.pages.tables == {} and recorder.pages.holders == {}
    assert len(recorder._recorded) <= recorder.events.maxlen == 100
    events = list(recorder.events)
    queued = Counter(e.request_id for e in events if e.kind == "queued")
    assert all(n == 1 for n in queued.values())  # ids unique within what the ring holds
    FIGURES["short requests checked for per-request state left behind"] += len(items)


def test_reused_ids_in_a_generate_call_after_the_first_finished():
    engine = tiny_engine()
    items = workload(2, out=4, seed=81)
    expected = reference_tokens(items)
    outs = [engine.generate([item.prompt], item.params)[0] for item in items]
    assert [o.token_ids for o in outs] == expected
    _run_alone(engine, outs[0].request_id, items[1].prompt, 4)  # the id generate made, reused
    queued = _recorded_ids_are_consistent(Run.from_engine(engine))
    assert list(queued) == [outs[0].request_id, outs[1].request_id, f"{outs[0].request_id}#2"]
