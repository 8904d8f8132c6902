"""kvscope.load: the round trip through both files, and one clear error for every bad file."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from telemetry_util import PROMPT_A, greedy, make_engine

import kvscope
from kvscope import Run


@pytest.fixture(scope="module")
def run():
    engine = make_engine(num_blocks=8, max_num_batched_tokens=8)
    shared = [40, 41, 42, 43, 44, 45, 46, 47]
    engine.generate([[*shared, 1], [*shared, 2], PROMPT_A, [9] * 13], [greedy(n) for n in (5, 9, 3, 7)])
    with engine.profile(num_steps=2, warmup=0):
        engine.generate([PROMPT_A], greedy(3))
    return Run.from_engine(engine)


@pytest.mark.parametrize("name", ["run.json", "run.jsonl"])
def test_round_trip_gives_the_same_run(run, tmp_path, name):
    path = tmp_path / name
    (run.save_trace if name.endswith(".json") else run.save_metrics)(path)
    back = kvscope.load(path)
    pd.testing.assert_frame_equal(back.steps, run.steps)
    pd.testing.assert_frame_equal(back.requests, run.requests)
    assert back.records == run.records and back.events == run.events
    assert back.summary() == pytest.approx(run.summary(), nan_ok=True)
    assert {k: v for k, v in back.meta.items() if k != "source"} == run.meta
    assert run.steps["prof_total_ns"].notna().sum() == 2  # the profiled steps survive too
    if name.endswith(".json"):
        assert len(back.profiler_events) == len(run.profiler_events) > 0
        # saved again, the trace is the same (profiler events included)
        again = tmp_path / "again.json"
        back.save_trace(again)
        assert json.loads(again.read_text())["traceEvents"] == json.loads(path.read_text())["traceEvents"]


def test_metrics_file_layout(run, tmp_path):
    lines = run.save_metrics(tmp_path / "m.jsonl").read_text().splitlines()
    head, end = json.loads(lines[0]), json.loads(lines[-1])
    assert head["type"] == "header" and head["format"] == "kvscope-metrics"
    for key in ("model", "config", "spec", "kv_bytes_per_token", "max_model_len", "kvscope_version"):
        assert key in head["meta"]
    assert end == {"type": "end", "num_steps": len(run.records), "num_events": len(run.events)}
    body = [json.loads(x) for x in lines[1:-1]]
    times = [x["t_end_ns"] if x["type"] == "step" else x["t_ns"] for x in body]
    assert times == sorted(times)


def bad_files(run, tmp_path):
    trace = run.save_trace(tmp_path / "good.json").read_text()
    metrics = run.save_metrics(tmp_path / "good.jsonl").read_text()
    lines = metrics.splitlines(keepends=True)
    return {
        "empty": ("", "empty"),
        "blank": ("\n  \n", "empty"),
        "truncated trace": (trace[: len(trace) // 2], "truncated"),
        "truncated metrics line": (metrics[: len(metrics) - len(lines[-1]) - 5], "truncated"),
        "metrics without end": ("".join(lines[:-1]), "truncated"),
        "metrics with a lost line": ("".join(lines[:3] + lines[4:]), "damaged"),
        "not json": ("hello, world\n", "not valid JSON"),
        "foreign chrome trace": (
            json.dumps({"traceEvents": [{"ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]}),
            "another tool",
        ),
        "foreign json": (json.dumps([1, 2, 3]), "not a kvscope trace"),
        "newer format": (trace.replace('"version":1', '"version":99', 1), "newer"),
        "foreign jsonl": ('{"type": "header", "format": "other"}\n', "not written by kvscope"),
        "broken record": (
            lines[0] + '{"type": "step", "step": 1}\n' + '{"type": "end", "num_steps": 1, "num_events": 0}\n',
            "malformed",
        ),
    }


def test_bad_files_give_one_clear_value_error(run, tmp_path):
    for label, (content, words) in bad_files(run, tmp_path).items():
        path = tmp_path / f"{label.replace(' ', '_')}.json"
        path.write_text(content)
        with pytest.raises(ValueError) as info:
            kvscope.load(path)
        message = str(info.value)
        assert str(path) in message and words in message, (label, message)
    with pytest.raises(ValueError, match="no such file"):
        kvscope.load(tmp_path / "missing.json")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x80\x81\xfe\xff" * 10)
    with pytest.raises(ValueError, match="not a text file"):
        kvscope.load(binary)


def test_integers_that_cannot_pass_64_bits_skip_the_python_hook_and_the_others_are_still_refused(monkeypatch):
    """parse_json: a line with no run of 19 digits leaves its integers to json's C scanner (the load of a file of
    prompt token ids); 19 digits or more still go through ``_parse_int``, which refuses beyond 64 bits."""
    from kvscope.telemetry import load as loader

    calls = []
    checked = loader._parse_int
    monkeypatch.setattr(loader, "_parse_int", lambda text: calls.append(text) or checked(text))
    line = json.dumps({"ids": list(range(500)), "t_ns": 999_999_999_999_999_999, "x": 1.5, "id": "a"})
    assert loader.parse_json(line) == json.loads(line) and calls == []
    assert loader.parse_json('{"t": 9223372036854775807}') == {"t": 2**63 - 1} and calls == ["9223372036854775807"]
    for hostile in ('{"t": 9223372036854775808}', '{"t": -9223372036854775809}', "[" + "9" * 5000 + "]"):
        with pytest.raises(loader._Hostile):
            loader.parse_json(hostile)
    with pytest.raises(loader._Hostile):
        loader.parse_json('{"x": NaN}')


def test_a_run_of_19_digits_is_found_across_the_scans_chunks(monkeypatch):
    from kvscope.telemetry import load as loader

    monkeypatch.setattr(loader, "_SCAN_CHUNK", 8)
    for at in range(0, 30):
        text = "x" * at + "1234567890123456789" + ", 12345678901234567"
        assert loader.may_hold_long_integers(text), at
        assert not loader.may_hold_long_integers(text.replace("9,", ",")), at
    assert not loader.may_hold_long_integers("")
