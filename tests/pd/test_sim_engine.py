"""``kvscope simulate --pd``: simulated instances on one virtual clock, KV transfers timed by a bandwidth and a
latency, and the telemetry of a real P/D run (``kvscope.pd.sim_engine``)."""

from __future__ import annotations

import math

import pytest

from kvscope.runs.background.live import LiveRun
from kvscope.runs.result.run import Run, load
from kvscope.runs.setup.simulated import SimSpec, prepare_simulation
from kvscope.runs.setup.spec import EngineSpec, OutputSpec, RunSpec, WorkloadSpec
from kvscope.sim.shape import resolve_shape

BLOCK = 16


def simulate(requests: int = 8, *, rate: float | None = None, shared_prefix: int = 0, bandwidth: float | None = None,
             latency: float | None = None, pd: str = "1P1D", prompt_len=(100, 300), output_len=(16, 32),
             outputs: OutputSpec | None = None) -> Run:
    spec = RunSpec(model="llama-7b", workload=WorkloadSpec(requests=requests, prompt_len=prompt_len,
                                                           output_len=output_len, shared_prefix=shared_prefix,
                                                           rate=rate),
                   engine=EngineSpec(block_size=BLOCK, pd=pd), outputs=outputs or OutputSpec())
    setup = prepare_simulation(spec, SimSpec(gpu="h100", kv_bandwidth=bandwidth, kv_latency=latency))
    live = LiveRun(setup.make_engine, setup.workload, **setup.run_options(), dashboard=False)
    live.start().wait()
    assert live.error is None, live.error
    return live.run


def prompts(run: Run) -> list[list[int]]:
    return [ev.prompt_token_ids for ev in run.events if ev.kind == "queued"]


def bytes_per_block() -> int:
    import torch

    return resolve_shape("llama-7b", None, default_dtype=torch.bfloat16).spec.kv_bytes_per_block(BLOCK)


def full_blocks(prompt: list[int]) -> int:
    return (len(prompt) - 1) // BLOCK  # the block of the last token is recomputed by the consumer


def test_prompts_that_share_nothing_move_every_full_block_once():
    run = simulate(8, rate=20.0)
    s = run.summary()
    assert run.meta["simulated"]["pd"]["layout"] == "1P1D"
    assert s["requests"] == 8 and s["kv_transfers"] == 8 and s["kv_transfer_failures"] == 0
    blocks = sum(full_blocks(p) for p in prompts(run))
    assert s["kv_transfer_blocks"] == blocks and s["kv_transfer_held_blocks"] == 0
    assert s["kv_transfer_bytes"] == blocks * bytes_per_block()
    roles = {i["name"]: i["role"] for i in run.meta["pd"]["instances"]}
    assert roles == {"prefill-0": "kv_producer", "decode-0": "kv_consumer"}
    assert {r["prefill"] for r in run.meta["pd"]["requests"]} == {"prefill-0"}
    for key in ("prefill-0_ttft_p50_s", "decode-0_itl_p99_s", "kv_transfer_time_p99_s"):
        assert s[key] > 0, key


def test_a_shared_prefix_moves_fewer_blocks():
    shared = simulate(8, rate=20.0, shared_prefix=128).summary()
    held = 128 // BLOCK
    assert shared["kv_transfer_held_blocks"] >= 7 * held  # every request after the first finds the prefix
    run = simulate(8, rate=20.0, shared_prefix=128)
    assert run.summary() == shared  # deterministic
    total = sum(full_blocks(p) for p in prompts(run))
    assert shared["kv_transfer_blocks"] + shared["kv_transfer_held_blocks"] == total
    assert shared["kv_transfer_blocks"] < total


def test_each_transfer_takes_bytes_over_bandwidth_plus_latency():
    run = simulate(6, rate=10.0, bandwidth=5.0, latency=0.002)
    transfers = run.meta["pd"]["transfers"]
    assert len(transfers) == 6
    for t in transfers:
        expected = t["num_bytes"] / 5e9 + 0.002
        assert t["transport"] == "simulated" and t["num_bytes"] > 0
        assert abs((t["end_ns"] - t["start_ns"]) / 1e9 - expected) < 2e-9
    link = run.meta["pd"]["kv_transfer_config"]
    assert link["kv_bandwidth_gb_per_s"] == 5.0 and link["kv_latency_s"] == 0.002


def test_lower_bandwidth_raises_ttft_and_leaves_decode_itl_alone():
    fast = simulate(12, rate=4.0, bandwidth=400.0)
    slow = simulate(12, rate=4.0, bandwidth=2.0)
    f, s = fast.summary(), slow.summary()
    extra = s["kv_transfer_time_p50_s"] - f["kv_transfer_time_p50_s"]
    assert extra > 0.02  # 100-300 tokens of 0.5 MiB each at 2 GB/s
    assert s["ttft_p50_s"] - f["ttft_p50_s"] > 0.5 * extra
    assert s["prefill-0_ttft_p50_s"] == pytest.approx(f["prefill-0_ttft_p50_s"], rel=0.02)
    assert s["decode-0_itl_p50_s"] == pytest.approx(f["decode-0_itl_p50_s"], rel=0.02)
    assert s["decode-0_itl_p99_s"] == pytest.approx(f["decode-0_itl_p99_s"], rel=0.05)


def test_two_prefill_instances_share_the_requests():
    run = simulate(8, pd="2P1D")
    used = {r["prefill"] for r in run.meta["pd"]["requests"]}
    assert used == {"prefill-0", "prefill-1"}
    s = run.summary()
    assert s["kv_transfers"] == 8 and not math.isnan(s["prefill-1_ttft_p50_s"])


def test_files_load_back_with_the_transfers(tmp_path):
    paths = OutputSpec(trace=tmp_path / "pd.trace.json", metrics=tmp_path / "pd.metrics.jsonl",
                       html=tmp_path / "pd.html")
    run = simulate(6, rate=10.0, outputs=paths)
    want = run.summary()
    for path in (paths.trace, paths.metrics):
        loaded = load(path)
        assert loaded.meta["simulated"]["step_model_from"] == "roofline: h100"
        got = loaded.summary()
        for key in ("kv_transfers", "kv_transfer_bytes", "ttft_p50_s", "decode-0_itl_p99_s"):
            assert got[key] == pytest.approx(want[key]), (path, key)
    assert "KV transfers" in paths.trace.read_text()
    assert paths.html.stat().st_size > 0


def test_an_abort_mid_transfer_leaks_no_block():
    spec = RunSpec(model="llama-7b", workload=WorkloadSpec(requests=4), engine=EngineSpec(block_size=BLOCK, pd="1P1D"))
    engine = prepare_simulation(spec, SimSpec(gpu="h100", kv_bandwidth=1.0)).make_engine()
    ids = [engine.add_request(list(range(100 + 50 * i, 400 + 50 * i))) for i in range(4)]
    while not engine.flights:
        engine.step()
    victim = engine.flights[0].req.request_id
    assert engine.abort(victim)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step()})
    assert set(finished) == set(ids) - {victim}
    assert all(len(o.token_ids) == 16 for o in finished.values())  # SamplingParams' default max_tokens
    for name, stats in engine.instance_stats().items():
        assert stats["num_used_blocks"] == 0 and stats["num_pinned"] == 0, name
