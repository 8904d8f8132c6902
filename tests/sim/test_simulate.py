"""The simulator reproduces the real engine's schedule exactly (issue 22): the same steps, preemptions,
prefix-cache hits and peak blocks, from a replay of a recorded run and from the same workload options."""

from __future__ import annotations

import pytest

from kvscope.engine.config import EngineConfig
from kvscope.engine.engine import Engine
from kvscope.runs.background.live import LiveRun
from kvscope.runs.result.run import Run, load
from kvscope.runs.workload.items import synthetic_workload, with_arrivals
from kvscope.runs.workload.recorded import replay_workload
from kvscope.sim.build import simulated_engine
from kvscope.sim.calibrate import fit_step_model
from kvscope.sim.shape import resolve_shape, shape_of_run

SPECIAL = (0, 1, 2)  # tiny's pad, bos, eos: never in a synthetic prompt


def run_live(engine, workload) -> Run:
    live = LiveRun(engine, workload, dashboard=False).start()
    live.wait()
    assert live.error is None, live.error
    return live.run


def schedule(run: Run) -> dict:
    s = run.summary()
    return {"steps": s["steps"], "preemptions": s["preemptions"], "hits": s["prefix_cache_hits"],
            "queries": s["prefix_cache_queries"], "peak_running": s["peak_running"],
            "peak_blocks": max(r.kv.blocks_used for r in run.records), "output_tokens": s["output_tokens"],
            "per_step": [(r.num_prefill_tokens, r.num_decode_tokens, r.num_preempted) for r in run.records]}


@pytest.fixture(scope="module")
def calibration_run() -> Run:
    engine = Engine("tiny", block_size=16, num_blocks=128, max_num_seqs=8, max_num_batched_tokens=256)
    return run_live(engine, synthetic_workload(24, (16, 80), (8, 32), vocab_size=512, seed=1, exclude_ids=SPECIAL))


CASES = {  # another seed, lengths, block size, a pool small enough to preempt, a shared prefix
    "small-pool-shared-prefix": dict(block_size=16, num_blocks=40, max_num_seqs=12, max_num_batched_tokens=192),
    "block-32": dict(block_size=32, num_blocks=24, max_num_seqs=16, max_num_batched_tokens=256),
    "no-prefix-cache-no-chunking": dict(block_size=8, num_blocks=96, max_num_seqs=6, max_num_batched_tokens=512,
                                        enable_prefix_caching=False, enable_chunked_prefill=False),
}


@pytest.mark.parametrize("case", CASES)
def test_replay_reproduces_the_real_schedule(calibration_run, case, tmp_path):
    cfg = CASES[case]
    workload = synthetic_workload(36, (8, 120), (4, 40), vocab_size=512, shared_prefix_len=40, seed=7,
                                  exclude_ids=SPECIAL)
    real = run_live(Engine("tiny", **cfg), workload)
    real.save_metrics(tmp_path / "real.metrics.jsonl")
    recorded = load(tmp_path / "real.metrics.jsonl")  # the replay reads the files, as --replay does
    model = fit_step_model(calibration_run.records, 16, "calibration")
    sim = simulated_engine(shape_of_run(recorded.meta), EngineConfig(**cfg), model)
    simulated = run_live(sim, replay_workload(recorded))
    assert schedule(simulated) == schedule(real)
    assert schedule(real)["preemptions"] > 0 or case != "small-pool-shared-prefix"
    assert simulated.meta["simulated"]["step_model"]["kind"] == "linear"
    assert simulated.meta["device"] == "simulated (fitted)"


def test_same_options_submit_the_same_requests(calibration_run):
    """Without a replay: the synthetic workload made from the simulated engine (its vocabulary and special
    tokens, from the tiny config and tokenizer alone) is the real engine's, so the schedules match."""
    from kvscope.runs.setup.prepare import prepare
    from kvscope.runs.setup.spec import EngineSpec, RunSpec, WorkloadSpec

    spec = RunSpec(workload=WorkloadSpec(requests=30, prompt_len=(16, 96), output_len=(8, 24), shared_prefix=32),
                   engine=EngineSpec(num_blocks=48, max_num_seqs=10, max_num_batched_tokens=256))
    setup = prepare(spec)
    real = run_live(setup.make_engine(), setup.workload)
    sim = simulated_engine(resolve_shape("tiny"), setup.config, fit_step_model(calibration_run.records, 16))
    simulated = run_live(sim, setup.workload)
    assert schedule(simulated) == schedule(real)
    prompts = [e.prompt_token_ids for e in real.events if e.kind == "queued"]
    assert prompts == [e.prompt_token_ids for e in simulated.events if e.kind == "queued"]


def test_arrivals_on_the_virtual_clock(calibration_run):
    """Requests arrive at their times on the virtual clock: an idle engine jumps to the next arrival, and
    each request is queued at its arrival time exactly."""
    items = with_arrivals(synthetic_workload(20, (16, 32), (4, 8), vocab_size=512, seed=3, exclude_ids=SPECIAL),
                          rate=2.0, seed=3)
    sim = simulated_engine(resolve_shape("tiny"), EngineConfig(num_blocks=64),
                           fit_step_model(calibration_run.records, 16))
    run = run_live(sim, items)
    queued = [e.t_ns for e in run.events if e.kind == "queued"]
    offsets = [(t - run.meta["t0_ns"]) / 1e9 for t in queued]
    assert offsets == pytest.approx([i.arrival_s for i in items], abs=1e-8)
    assert run.summary()["duration_s"] > items[-1].arrival_s  # 20 arrivals at 2/s span about 10 virtual seconds
    assert run.summary()["finished"] == 20


@pytest.mark.parametrize("rate", [0.0, 0.6, 1.0])
def test_speculative_decoding_at_an_acceptance_rate(calibration_run, rate):
    """The engine's own Speculator drafts placeholders; each draft is accepted with the given chance until
    the first rejection, so k=3 drafts keep rate + rate**2 + rate**3 of them on average. Outputs keep their
    exact lengths and every block comes back."""
    cfg = EngineConfig(num_blocks=96, max_num_seqs=8, speculative_config={"method": "ngram",
                                                                          "num_speculative_tokens": 3})
    sim = simulated_engine(resolve_shape("tiny"), cfg, fit_step_model(calibration_run.records, 16),
                           acceptance_rate=rate)
    items = synthetic_workload(24, (16, 48), (30, 60), vocab_size=512, seed=9, exclude_ids=SPECIAL)
    s = run_live(sim, items).summary()
    assert s["output_tokens"] == sum(i.params.max_tokens for i in items)
    expected = (rate + rate**2 + rate**3) / 3
    assert s["spec_acceptance_rate"] == pytest.approx(expected, abs=0.06)
    assert sim.pool.num_used_blocks == 0


def test_speculation_without_an_acceptance_rate_is_refused(calibration_run):
    cfg = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="--acceptance-rate"):
        simulated_engine(resolve_shape("tiny"), cfg, fit_step_model(calibration_run.records, 16))


def test_a_long_simulation_records_the_steps_its_window_drops_light():
    """Past its window, a simulation records the steps its window will not keep light (no items, no page map):
    the same schedule and the same exact summary as with detail everywhere, and the window all in detail."""
    from kvscope.planning.gpus import find_gpu
    from kvscope.sim.roofline import RooflineModel
    from kvscope.telemetry.records import StepRecord

    shape = resolve_shape("tiny")
    s = shape.spec
    model = RooflineModel(find_gpu("a100-80gb"), s.num_params, s.dtype_bytes, s.num_layers, s.num_heads, s.head_dim,
                          s.kv_bytes_per_token)
    items = synthetic_workload(300, (16, 48), (4, 16), vocab_size=512, seed=5, exclude_ids=SPECIAL)

    def simulate(workload) -> tuple[Run, list[bool], list]:
        sim = simulated_engine(shape, EngineConfig(num_blocks=64, max_num_seqs=8), model, window_steps=40)
        light = []
        sim.recorder.subscribe(lambda it: light.append((it.sampled_ids is not None, it.page_map_full))
                               if isinstance(it, StepRecord) else None)
        return run_live(sim, workload), light, sim.recorder.pages.entries

    detailed, always, detailed_map = simulate(iter(items))  # a lazy workload of unknown length: detail everywhere
    run, light, page_map = simulate(items)
    assert not any(lt for lt, _ in always) and 100 < sum(lt for lt, _ in light) < len(light) - 80  # light between
    back = next(i for i in range(len(light) - 1, 0, -1) if light[i - 1][0])  # the first record in detail again
    assert light[back] == (False, True)  # a full page-map snapshot: the page map starts again from the pool
    assert len(run.records) == len(detailed.records) == 40
    assert all(r.scheduled and r.sampled_ids is None for r in run.records if r.num_running)
    assert [(r.step, r.num_prefill_tokens, r.num_decode_tokens, r.num_output_tokens, r.kv) for r in run.records] == \
        [(r.step, r.num_prefill_tokens, r.num_decode_tokens, r.num_output_tokens, r.kv) for r in detailed.records]
    assert run.summary() == detailed.summary() and run.summary()["requests"] == 300
    assert [e[1:4] for e in page_map] == [e[1:4] for e in detailed_map]  # filled, state, refs of every block
