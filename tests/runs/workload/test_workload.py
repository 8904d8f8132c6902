"""Workloads: synthetic seeded requests, prompt files (lines end at \\n only; pipes and FIFOs), length ranges."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from kvscope.engine.request import SamplingParams
from kvscope.runs.workload import items as workload
from kvscope.runs.workload.items import (
    numbered_prompts,
    parse_range,
    prompts_from_text,
    prompts_workload,
    read_prompt_lines,
    read_prompts,
    synthetic_workload,
)


@pytest.mark.parametrize("text, expected", [("32", (32, 32)), ("16-64", (16, 64)), ("16:64", (16, 64)),
                                            (8, (8, 8)), ((3, 5), (3, 5)), (" 4-4 ", (4, 4))])
def test_parse_range(text, expected):
    assert parse_range(text) == expected


@pytest.mark.parametrize("text, why", [("64-16", "below the lower end"), ("0-4", "at least 1"),
                                       ("a-b", "a number or LO-HI"), ("1-2-3", "a number or LO-HI"), ("", "LO-HI")])
def test_parse_range_errors(text, why):
    with pytest.raises(ValueError, match=why):
        parse_range(text, "prompt length")


def test_synthetic_workload_lengths_seed_prefix_and_exclusions():
    params = SamplingParams(temperature=0.8, seed=7)
    items = synthetic_workload(50, (10, 20), (3, 9), vocab_size=40, shared_prefix_len=6, seed=1, params=params,
                               exclude_ids=[0, 1, 2])
    assert len(items) == 50
    prefix = items[0].prompt[:6]
    for i, item in enumerate(items):
        assert item.prompt[:6] == prefix
        assert 16 <= len(item.prompt) <= 26 and item.num_prompt_tokens == len(item.prompt)
        assert not {0, 1, 2} & set(item.prompt) and all(0 <= t < 40 for t in item.prompt)
        assert 3 <= item.params.max_tokens <= 9 and item.params.ignore_eos
        assert item.params.temperature == 0.8 and item.params.seed == 7 + i  # own seed, reproducible
    again = synthetic_workload(50, (10, 20), (3, 9), vocab_size=40, shared_prefix_len=6, seed=1, params=params,
                               exclude_ids=[0, 1, 2])
    assert [i.prompt for i in again] == [i.prompt for i in items]
    other = synthetic_workload(50, (10, 20), (3, 9), vocab_size=40, seed=2)
    assert [i.prompt for i in other] != [i.prompt for i in items]
    assert len({len(i.prompt) for i in items}) > 3  # lengths really vary


def test_synthetic_workload_errors():
    with pytest.raises(ValueError, match="at least 1"):
        synthetic_workload(0, vocab_size=10)
    with pytest.raises(ValueError, match="no token ids left"):
        synthetic_workload(2, vocab_size=2, exclude_ids=[0, 1])
    with pytest.raises(ValueError, match="shared_prefix_len"):
        synthetic_workload(2, vocab_size=10, shared_prefix_len=-1)


def test_read_prompts_one_per_line(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("\ufeffHello there\r\n\r\n  indented stays  \nlast".encode())
    assert read_prompts(path) == ["Hello there", "  indented stays  ", "last"]
    assert prompts_from_text("a\n\n b\n") == ["a", " b"]


@pytest.mark.parametrize("content, why", [(None, "does not exist"), ("dir", "is a folder"),
                                          (b"\n  \n", "has no prompts"), (b"caf\xe9\n", "not UTF-8")])
def test_read_prompts_errors(tmp_path, content, why):
    path = tmp_path / "prompts.txt"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=why):
        read_prompts(path)


def test_prompts_workload_draws_output_lengths():
    items = prompts_workload(["a", "b", "c"], (5, 7), seed=3, ignore_eos=False)
    assert [i.prompt for i in items] == ["a", "b", "c"]
    assert all(5 <= i.params.max_tokens <= 7 and not i.params.ignore_eos for i in items)
    assert items[0].num_prompt_tokens is None
    with pytest.raises(ValueError, match="no prompts"):
        prompts_workload([], (4, 4))


# Characters str.splitlines() breaks at besides \n (and \r\n): inside a prompt they are text.
OTHER_LINE_BOUNDARIES = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("sep", OTHER_LINE_BOUNDARIES, ids=[f"U+{ord(c):04X}" for c in OTHER_LINE_BOUNDARIES])
def test_a_line_ends_at_newline_only(tmp_path, sep):
    text = f"first{sep}still the first\r\nsecond\n\n{sep}fourth{sep}{sep}end\n"
    assert numbered_prompts(text) == [(1, f"first{sep}still the first"), (2, "second"),
                                      (4, f"{sep}fourth{sep}{sep}end")]
    path = tmp_path / "p.txt"
    path.write_bytes(text.encode())
    assert read_prompt_lines(path) == numbered_prompts(text)  # the file as it is: no newline translation


def test_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"fine\nalso fine\ncaf\xe9\n")
    with pytest.raises(ValueError, match=r"not UTF-8 text \(byte 18 cannot be decoded\) on line 3"):
        read_prompts(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_prompts_from_a_fifo_and_from_stdin(tmp_path):
    fifo = tmp_path / "prompts.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("from a pipe\n\nsecond\n"))
    writer.start()
    assert read_prompt_lines(fifo) == [(1, "from a pipe"), (3, "second")]
    writer.join(10)
    code = "from kvscope.runs.workload.items import read_prompt_lines; print(read_prompt_lines('/dev/stdin'))"
    proc = subprocess.run([sys.executable, "-c", code], input="one\ntwo\n", capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[(1, 'one'), (2, 'two')]", proc.stderr


def test_a_huge_prompts_file_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(workload, "MAX_PROMPTS_FILE_BYTES", 100)
    path = tmp_path / "p.txt"
    path.write_text("a prompt\n" * 20)
    with pytest.raises(ValueError, match=r"prompts file '.*p.txt' is larger than"):
        read_prompts(path)


def test_per_request_seeds_stay_within_64_bits():
    items = prompts_workload(["a", "b", "c"], seed=1, params=SamplingParams(seed=2**64 - 2))
    assert [i.params.seed for i in items] == [2**64 - 2, 2**64 - 1, 0]


def test_arrivals_have_the_rate_and_burstiness_asked_for():
    import itertools
    import statistics

    from kvscope.runs.workload.items import arrival_times

    for cv in (1.0, 3.0):
        times = arrival_times(20_000, rate=50.0, cv=cv, seed=1)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert times[0] == 0.0 and all(g >= 0 for g in gaps)
        assert statistics.fmean(gaps) == pytest.approx(1 / 50, rel=0.05)
        assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)
    assert arrival_times(5, 2.0, seed=3) == arrival_times(5, 2.0, seed=3) != arrival_times(5, 2.0, seed=4)


def test_with_arrivals_keeps_lists_lists_and_iterators_lazy():
    from kvscope.runs.workload.items import iter_synthetic_workload, synthetic_workload, with_arrivals

    items = synthetic_workload(4, vocab_size=64)
    assert with_arrivals(items, None) is items
    timed = with_arrivals(items, 10.0)
    assert isinstance(timed, list) and [i.prompt for i in timed] == [i.prompt for i in items]
    lazy = with_arrivals(iter_synthetic_workload(10**9, vocab_size=64), 10.0)
    first = next(iter(lazy))
    assert first.arrival_s == 0.0


def test_per_request_copies_are_replace_with_every_field():
    """``_per_request_params`` and ``_arrived`` write the fields out (for speed): they must stay
    ``dataclasses.replace``, so a field added to either class must be added there too."""
    import dataclasses

    assert [f.name for f in dataclasses.fields(SamplingParams)] == [
        "max_tokens", "temperature", "top_k", "top_p", "seed", "stop_token_ids", "ignore_eos"]
    assert [f.name for f in dataclasses.fields(workload.WorkItem)] == [
        "prompt", "params", "source", "arrival_s", "chat", "shown"]
    base = SamplingParams(max_tokens=9, temperature=0.7, top_k=5, top_p=0.9, seed=11, stop_token_ids=[4, 3])
    base.temperature, base.top_k = 2, True  # changed after construction: normalised or refused, as replace does
    with pytest.raises(TypeError, match="top_k=True"):
        workload._per_request_params(base, 3, 2, True)
    base.top_k = 5
    for ignore_eos in (False, True):
        copy = workload._per_request_params(base, 3, 2, ignore_eos)
        assert copy == dataclasses.replace(base, max_tokens=3, seed=13, ignore_eos=ignore_eos)
        assert type(copy.temperature) is float and copy.stop_token_ids is not base.stop_token_ids

    @dataclasses.dataclass
    class Tagged(SamplingParams):
        tag: str = "x"

    assert workload._per_request_params(Tagged(tag="y"), 3, 0, True).tag == "y"  # a subclass keeps its fields
    item = workload.WorkItem([1, 2], base, source="line 2", arrival_s=1.0, chat=True, shown="hi")
    assert workload._arrived(item, 2.5) == dataclasses.replace(item, arrival_s=2.5)
