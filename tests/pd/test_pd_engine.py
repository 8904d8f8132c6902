"""A 1P1D engine on the tiny model: the colocated engine's greedy tokens, one transfer per request with the
bytes of the prompt's full blocks, only missing blocks moved, no leaked blocks, files that load back."""

import random

import pytest

import kvscope
from kvscope import Engine, Run, SamplingParams
from kvscope.pd import PDEngine

BS = 8
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def fresh_prompts(n: int, seed: int, lo: int = 9, hi: int = 60) -> list[list[int]]:
    """Prompts that share no block with each other (nor, by their seed, with another test's)."""
    rng = random.Random(seed)
    return [[rng.randrange(5, 250) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


@pytest.fixture(scope="module")
def pd_engine():
    engine = PDEngine("tiny", pd="1P1D", block_size=BS, num_blocks=128)
    yield engine
    engine.close()
    assert all(i.process.poll() is not None for i in engine.instances.values())


@pytest.fixture(scope="module")
def colocated():
    return Engine("tiny", block_size=BS, num_blocks=128)


def test_engine_pd_builds_a_disaggregated_engine(pd_engine):
    assert isinstance(pd_engine, PDEngine)
    assert isinstance(pd_engine, kvscope.pd.PDEngine)
    roles = {name: inst.role for name, inst in pd_engine.instances.items()}
    assert roles == {"prefill-0": "kv_producer", "decode-0": "kv_consumer"}
    pids = {inst.info["pid"] for inst in pd_engine.instances.values()}
    assert len(pids) == 2  # each instance in its own process


def test_greedy_tokens_match_colocated(pd_engine, colocated):
    prompts = fresh_prompts(5, seed=1)
    ref = colocated.generate(prompts, PARAMS)
    outs = pd_engine.generate(prompts, PARAMS)
    assert [o.token_ids for o in outs] == [r.token_ids for r in ref]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 6 for o in outs)


def test_summary_counts_each_transfer_and_its_bytes(pd_engine):
    prompts = fresh_prompts(4, seed=2)
    before = len(pd_engine.transfers)
    pd_engine.generate(prompts, PARAMS)
    per_block = pd_engine.instances["prefill-0"].info["kv_bytes_per_block"]
    expected = sum((len(p) - 1) // BS for p in prompts) * per_block  # full blocks; the last token recomputed
    moved = pd_engine.transfers[before:]
    assert len(moved) == 4 and all(t.ok and t.num_held_blocks == 0 for t in moved)
    assert sum(t.num_bytes for t in moved) == expected
    s = Run.from_engine(pd_engine).summary()
    assert s["kv_transfers"] == len(pd_engine.transfers)
    assert s["kv_transfer_bytes"] == sum(t.num_bytes for t in pd_engine.transfers)
    assert s["kv_transfer_time_p99_s"] >= s["kv_transfer_time_p50_s"] > 0
    assert s["kv_transfer_mb_per_s"] > 0
    assert s["decode-0_itl_p50_s"] > 0 and s["prefill-0_ttft_p50_s"] > 0
    assert s["ttft_p50_s"] > s["prefill-0_ttft_p50_s"]  # end to end: prefill, transfer, then decode


def test_only_blocks_the_decode_side_lacks_move(pd_engine, colocated):
    prefix = fresh_prompts(1, seed=3, lo=40, hi=41)[0]  # 5 full blocks
    first, second = [*prefix, 7, 8, 9], [*prefix, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    pd_engine.generate([first], PARAMS)
    before = len(pd_engine.transfers)
    out = pd_engine.generate([second], PARAMS)[0]
    t = pd_engine.transfers[before]
    assert t.num_held_blocks == 5  # the decode instance kept the shared prefix in its prefix cache
    assert t.num_blocks == (len(second) - 1) // BS - 5
    assert out.token_ids == colocated.generate([second], PARAMS)[0].token_ids


def test_no_block_leaks_on_either_side(pd_engine):
    pd_engine.generate(fresh_prompts(3, seed=4), PARAMS)
    stats = pd_engine.instance_stats()
    assert set(stats) == {"prefill-0", "decode-0"}
    for name, s in stats.items():
        assert s["num_used_blocks"] == 0 and s["num_pinned"] == 0 and s["num_unfinished"] == 0, name


def test_trace_and_metrics_carry_the_transfers_and_load_back(pd_engine, tmp_path):
    pd_engine.generate(fresh_prompts(2, seed=5), PARAMS)
    run = Run.from_engine(pd_engine)
    assert [i["role"] for i in run.meta["pd"]["instances"]] == ["kv_producer", "kv_consumer"]
    trace, metrics = run.save_trace(tmp_path / "t.json"), run.save_metrics(tmp_path / "m.jsonl")
    assert '"KV transfers"' in trace.read_text()  # the trace's transfer track
    for path in (trace, metrics):
        back = kvscope.load(path)
        assert back.meta["pd"]["transfers"] == run.meta["pd"]["transfers"]
        assert back.summary()["kv_transfers"] == run.summary()["kv_transfers"] > 0


def test_aborting_a_request_that_waits_for_its_hand_over_keeps_the_load_right(pd_engine, monkeypatch):
    """A prompt whose prefill ended waits in ``handovers`` (its producer's load already given back): aborting it
    there must not give the load back twice, or the router would pick that instance as if it were idle."""
    monkeypatch.setattr(pd_engine, "_hand_over_ready", lambda: None)  # hold every hand-over
    rid = pd_engine.add_request(fresh_prompts(1, seed=6)[0], PARAMS)
    for _ in range(50):
        if any(r.request_id == rid for r in pd_engine.handovers):
            break
        pd_engine.step()
    assert [r.request_id for r in pd_engine.handovers] == [rid]
    assert pd_engine.abort(rid)
    assert pd_engine.load == {"prefill-0": 0, "decode-0": 0}
    assert not pd_engine.handovers and not pd_engine.has_unfinished_requests()
    monkeypatch.undo()
    out = pd_engine.generate(fresh_prompts(1, seed=7), PARAMS)[0]  # the engine goes on as before
    assert out.finish_reason == "length" and pd_engine.load == {"prefill-0": 0, "decode-0": 0}
