"""benchmarks/replay_speed.py at a small N: the tiled watched run loads with ``kvscope.load`` as a watched run with
N requests (new ids, later arrivals, each copy's prompts its own), and ``kvscope simulate --replay`` replays all of
them. No timing is asserted."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest

import kvscope
from kvscope.cli.main import main as kvscope_main
from kvscope.watched.limits import MAX_RECORDS

ROOT = Path(__file__).resolve().parents[2]
N = 300
pytestmark = pytest.mark.slow  # about 20 s: a simulated base run, then the replay of 300 requests


def _benchmark():
    spec = importlib.util.spec_from_file_location("replay_speed", ROOT / "benchmarks" / "replay_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiled(tmp_path_factory):
    bench = _benchmark()
    folder = tmp_path_factory.mktemp("replay-speed")
    base, step, model = bench.base_in_process(folder)
    out = folder / "tiled.metrics.jsonl"
    written = bench.tile(base, out, N, bench._vocab_size(str(model)))
    return kvscope.load(base), kvscope.load(out), written, (out, step, model, folder)


def bench_varied(ids: list[int], k: int, vocab_size: int) -> list[int]:
    return _benchmark()._varied(ids, k, vocab_size)


def test_the_tiled_file_is_a_watched_run_of_n_requests(tiled):
    base, run, written, _ = tiled
    assert written == N and type(run).__name__ == "WatchedRun"
    queued = [e for e in run.events if e.kind == "queued"]
    finished = [e for e in run.events if e.kind == "finished"]
    assert len(queued) == len(finished) == N == len({e.request_id for e in queued})
    assert run.meta["config"] == base.meta["config"] and run.meta["watch"]["config"] == base.meta["config"]
    per_copy = sum(e.kind == "queued" for e in base.events)
    copies = [[e for e in queued if e.request_id.endswith(f"~{k}")] for k in range(-(-N // per_copy))]
    assert [len(c) for c in copies[:-1]] == [per_copy] * (len(copies) - 1)
    # each copy arrives after the one before; its prompts are the base's with the first token moved by k
    assert all(max(e.t_ns for e in a) < min(e.t_ns for e in b) for a, b in itertools.pairwise(copies))
    by_id = {e.request_id: e.prompt_token_ids for e in base.events if e.kind == "queued"}
    for k, copy in enumerate(copies):
        for e in copy:
            original = by_id[e.request_id.rsplit("~", 1)[0]]
            assert e.prompt_token_ids[1:] == original[1:]
            assert (e.prompt_token_ids[0] != original[0]) == (k > 0)
    # past the vocabulary's worth of copies the second token moves too: no two copies' prompts are the same
    assert bench_varied([7, 9, 4], 3, 512) == [10, 9, 4] and bench_varied([7, 9, 4], 515, 512) == [10, 10, 4]
    assert len(run.records) <= MAX_RECORDS and len({r.step for r in run.records}) == len(run.records)


def test_the_tiled_run_replays_with_all_its_requests(tiled):
    _, _, _, (path, step, model, folder) = tiled
    code = kvscope_main(["simulate", "--replay", str(path), "--step-model", str(step), "--engine", "vllm", "--model",
                         str(model), "--quiet", "--out", str(folder / "replay")])
    assert code == 0
    summary = kvscope.load(folder / "replay.metrics.jsonl").summary()
    assert summary["requests"] == N
