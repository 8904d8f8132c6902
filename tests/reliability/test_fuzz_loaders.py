"""Fuzzing the two file readers users feed by hand: ``kvscope.load`` (traces, metrics) and the prompts
file reader. Any input must either load or raise the documented ``ValueError`` - never another
exception (hostile JSON included: nesting deep enough to exhaust the recursion limit, integers of thousands
of digits, NaN, Infinity, 1e999, a file larger than the memory), never a silently partial run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvscope
from kvscope import Engine, SamplingParams
from kvscope.runs.result.run import Run
from kvscope.runs.workload.items import read_prompts
from kvscope.telemetry import load as loader
from kvscope.utils.host import AvailableMemory

COUNTS = {"trace": 0, "hostile JSON": 0, "prompts": 0}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


class RunFiles(dict):
    def __repr__(self) -> str:  # keep hypothesis' failure reports readable
        return "<trace and metrics of a small run>"


@pytest.fixture(scope="module")
def run_files(tmp_path_factory) -> dict[str, bytes]:
    engine = Engine("tiny", block_size=4, num_blocks=32)
    engine.generate(["KV cache", "paged attention"], SamplingParams(max_tokens=5, ignore_eos=True))
    run = Run.from_engine(engine)
    folder = tmp_path_factory.mktemp("run")
    run.save_trace(folder / "run.trace.json")
    run.save_metrics(folder / "run.metrics.jsonl")
    return RunFiles({name: (folder / name).read_bytes() for name in ("run.trace.json", "run.metrics.jsonl")})


def _load(tmp_path: Path, name: str, data: bytes) -> Run | None:
    COUNTS["trace"] += 1
    path = tmp_path / name
    path.write_bytes(data)
    try:
        run = kvscope.load(path)
    except ValueError as exc:
        assert str(path) in str(exc)  # names the file
        return None
    run.steps, run.requests, run.summary()  # what loaded must also be usable
    return run


@pytest.mark.parametrize("name", ["run.trace.json", "run.metrics.jsonl"])
def test_valid_files_load(run_files, tmp_path, name):
    run = _load(tmp_path, name, run_files[name])
    assert run is not None and len(run.records) > 0 and len(run.events) > 0


@FUZZ
@given(data=st.data(), name=st.sampled_from(["run.trace.json", "run.metrics.jsonl"]))
def fuzz_truncated_files_are_refused(run_files, tmp_path, data, name):
    full = run_files[name]
    cut = data.draw(st.integers(0, len(full.rstrip()) - 1))
    assert _load(tmp_path, name, full[:cut]) is None


@FUZZ
@given(data=st.data(), name=st.sampled_from(["run.trace.json", "run.metrics.jsonl"]))
def fuzz_corrupted_bytes_load_or_fail_cleanly(run_files, tmp_path, data, name):
    raw = bytearray(run_files[name])
    for _ in range(data.draw(st.integers(1, 5))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    _load(tmp_path, name, bytes(raw))


@FUZZ
@given(blob=st.binary(max_size=300))
def fuzz_random_bytes_fail_cleanly(tmp_path, blob):
    _load(tmp_path, "x.json", blob)


@FUZZ
@given(value=json_values, data=st.data())
def fuzz_foreign_or_mangled_json_fails_cleanly(run_files, tmp_path, value, data):
    _load(tmp_path, "foreign.json", json.dumps(value).encode())
    # a kvscope trace with one field replaced by arbitrary JSON
    doc = json.loads(run_files["run.trace.json"])
    node = doc["kvscope"]
    path = []
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        path.append(key)
        node = node[key]
    if path:
        parent = doc["kvscope"]
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
        _load(tmp_path, "mangled.json", json.dumps(doc).encode())


def test_trace_loader_fuzzers(run_files, tmp_path):
    """Each fuzzer runs all its examples here, then the count is checked in the same test (no reliance on
    test order): the loaders must have been tried on a few hundred bad files."""
    before = COUNTS["trace"]
    fuzz_truncated_files_are_refused(run_files=run_files, tmp_path=tmp_path)
    fuzz_corrupted_bytes_load_or_fail_cleanly(run_files=run_files, tmp_path=tmp_path)
    fuzz_random_bytes_fail_cleanly(tmp_path=tmp_path)
    fuzz_foreign_or_mangled_json_fails_cleanly(run_files=run_files, tmp_path=tmp_path)
    assert COUNTS["trace"] - before >= 400, COUNTS


# JSON a kvscope file never holds, put where a number was; a reader must refuse it by name.
hostile = st.one_of(
    st.integers(1000, 120_000).map(lambda d: "[" * d + "]" * d),
    st.integers(1000, 60_000).map(lambda d: '{"a":' * d + "1" + "}" * d),
    st.integers(20, 6000).map(lambda k: "9" * k), st.integers(20, 6000).map(lambda k: "-" + "9" * k),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9223372036854775808", "1e308"]),
    st.integers(309, 99_999).map(lambda e: f"1e{e}"),
)
NUMBER_FIELDS = ['"t0_ns":', '"step":', '"num_blocks":', '"ts":', '"t_ns":', '"blocks_used":']


@FUZZ
@given(literal=hostile, name=st.sampled_from(["run.trace.json", "run.metrics.jsonl"]), data=st.data())
def fuzz_hostile_json_is_refused_by_name(run_files, tmp_path, literal, name, data):
    COUNTS["hostile JSON"] += 1
    text = run_files[name].decode()
    field = data.draw(st.sampled_from([f for f in NUMBER_FIELDS if f in text]))
    starts = [m.end() for m in re.finditer(re.escape(field) + r"\s*(?=-?[0-9])", text)]
    at = data.draw(st.sampled_from(starts))
    end = re.match(r"-?[0-9.eE+-]+", text[at:]).end() + at
    _load(tmp_path, name, (text[:at] + literal + text[end:]).encode())  # loads, or refuses naming the file


def test_hostile_json_fuzzer(run_files, tmp_path):
    before = COUNTS["hostile JSON"]
    fuzz_hostile_json_is_refused_by_name(run_files=run_files, tmp_path=tmp_path)
    assert COUNTS["hostile JSON"] - before >= 100, COUNTS


@pytest.mark.parametrize("literal, why", [
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    ("9" * 5000, "an integer of 5,000 digits"),
    ("18446744073709551616", r"an integer beyond 64 bits \(18446744073709551616\)"),
    ("NaN", "NaN, which is not JSON"),
    ("1e999", r"a number out of range \(1e999\)"),
])
@pytest.mark.parametrize("name", ["run.trace.json", "run.metrics.jsonl"])
def test_hostile_json_gets_the_loaders_own_error(run_files, tmp_path, name, literal, why):
    text = run_files[name].decode()
    path = tmp_path / name
    path.write_text(re.sub(r'"t0_ns":\s*[0-9]+', lambda m: f'"t0_ns": {literal}', text, count=1))
    with pytest.raises(loader.RunFileError, match=rf"^{re.escape(str(path))}: .*{why}"):
        kvscope.load(path)


def test_a_file_too_large_for_the_memory_is_refused_before_it_is_read(run_files, tmp_path, monkeypatch):
    path = tmp_path / "run.trace.json"
    path.write_bytes(run_files["run.trace.json"])
    monkeypatch.setattr("kvscope.utils.host.available_memory", lambda: AvailableMemory(1 << 20, "the test's machine"))
    monkeypatch.setattr(loader, "MEMORY_PER_BYTE", 1 << 20)  # as if each byte took a MiB to load
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("the file was read"))
    with pytest.raises(loader.RunFileError, match=r"is too large to load here: reading it takes about .* and 1 MiB "
                                                  r"available \(the test's machine\)"):
        kvscope.load(path)


def test_running_out_of_memory_while_loading_is_the_loaders_error(run_files, tmp_path, monkeypatch):
    path = tmp_path / "run.metrics.jsonl"
    path.write_bytes(run_files["run.metrics.jsonl"])

    def no_memory(text, **kwargs):
        raise MemoryError

    monkeypatch.setattr(loader.json, "loads", no_memory)
    with pytest.raises(loader.RunFileError, match="too large to load in the memory available"):
        kvscope.load(path)


def test_prompts_file_reader_fuzzer(tmp_path):
    before = COUNTS["prompts"]
    fuzz_prompts_file_reader(tmp_path=tmp_path)
    assert COUNTS["prompts"] - before >= 100, COUNTS


def test_other_tools_traces_are_named_as_such(tmp_path):
    chrome = {"traceEvents": [{"name": "x", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}
    path = tmp_path / "chrome.json"
    path.write_text(json.dumps(chrome))
    with pytest.raises(ValueError, match=r"chrome\.json"):
        kvscope.load(path)


@FUZZ
@given(blob=st.binary(max_size=200))
def fuzz_prompts_file_reader(tmp_path, blob):
    COUNTS["prompts"] += 1
    path = tmp_path / "prompts.txt"
    path.write_bytes(blob)
    try:
        prompts = read_prompts(path)
    except ValueError as exc:
        assert "prompts file" in str(exc)
        return
    assert prompts and all(p.strip() and "\n" not in p for p in prompts)


def test_prompts_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_prompts(tmp_path / "missing.txt")
    (tmp_path / "bad.txt").write_bytes(b"hello\n\xff\xfe world\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_prompts(tmp_path / "bad.txt")
    (tmp_path / "blank.txt").write_text("\n   \n")
    with pytest.raises(ValueError, match="has no prompts"):
        read_prompts(tmp_path / "blank.txt")

