"""The prompts sent matched to the server's requests (kvscope/watched/prompt_match.py): order of arrival, checked
by prompt length, a bounded look-ahead for requests that overtook each other, and nothing shifted by a request
that never came."""

from __future__ import annotations

from kvscope.telemetry.records import RequestEvent
from kvscope.watched.prompt_match import match_prompts


def queued(*lengths: int, times: list[int] | None = None) -> list[RequestEvent]:
    times = times or list(range(len(lengths)))
    return [RequestEvent(t, 0, f"r{i}", "queued", n) for i, (t, n) in enumerate(zip(times, lengths))]


def prompts(*lengths: int) -> list[list[int]]:
    return [[i + 3] * n for i, n in enumerate(lengths)]


def ids(events: list[RequestEvent]) -> list[int | None]:
    """Which prompt each request got (its first token id less 3), None for none."""
    return [None if e.prompt_token_ids is None else e.prompt_token_ids[0] - 3 for e in events]


def test_in_order_each_request_gets_the_prompt_sent_in_its_place():
    events = queued(5, 7, 5, 9, times=[40, 10, 20, 30])  # the events' order is not their arrival order
    got = match_prompts([*events, RequestEvent(50, 0, "r0", "finished", 5)], prompts(7, 5, 9, 5))
    assert ids(events) == [3, 0, 1, 2]
    assert (got.matched, got.reordered, got.unmatched, got.prompts_unused) == (4, 0, 0, 0)


def test_requests_that_overtook_each_other_are_matched_by_length_within_the_window():
    events = queued(9, 5, 7)  # sent 5, 7, 9; the 9 arrived first
    got = match_prompts(events, prompts(5, 7, 9))
    assert ids(events) == [2, 0, 1] and got.reordered == 2  # the 9 ahead of its place, the 5 behind
    far = queued(9, 5)
    got = match_prompts(far, prompts(5, 6, 7, 9), window=2)  # the 9 is beyond the window: the nearest 9 anywhere
    assert ids(far) == [3, 0] and (got.far, got.unmatched) == (2, 0)  # the 5 then too: the cursor passed it


def test_requests_sent_all_at_once_that_arrive_in_any_order_are_all_matched():
    """64 prompts sent at once reach the server shuffled (vllm bench serve at an infinite rate): every request
    gets a prompt of its own length, each prompt given once."""
    import random

    lengths = [32 + i % 7 for i in range(64)]
    order = list(range(64))
    random.Random(0).shuffle(order)
    events = queued(*(lengths[i] for i in order))
    got = match_prompts(events, prompts(*lengths))
    assert (got.matched, got.unmatched, got.prompts_unused) == (64, 0, 0) and got.far > 0
    given = ids(events)
    assert sorted(given) == list(range(64)) and all(lengths[g] == lengths[i] for g, i in zip(given, order))


def test_a_request_that_never_came_does_not_shift_the_rest():
    lengths = [4 + i % 3 for i in range(40)]
    sent = prompts(*lengths)
    events = queued(*(lengths[:5] + lengths[6:]))  # the sixth prompt's request failed before it reached vLLM
    got = match_prompts(events, sent, window=4)
    assert ids(events) == list(range(5)) + list(range(6, 40))
    assert (got.matched, got.unmatched, got.prompts_unused) == (39, 0, 1)


def test_lengths_that_never_fit_leave_the_requests_without_ids():
    events = queued(10, 11)
    events[0].prompt_token_ids = [1]  # a match made before is replaced
    got = match_prompts(events, prompts(8, 9))  # a wrong tokenizer: every length off
    assert ids(events) == [None, None] and (got.matched, got.unmatched, got.prompts_unused) == (0, 2, 2)
    assert got.as_json()["rule"] == "arrival order, prompt lengths checked"
