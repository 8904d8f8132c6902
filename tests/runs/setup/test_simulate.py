"""``prepare_simulation``: a replay re-timed by --rate keeps the run's requests and spaces their arrivals."""

from __future__ import annotations

from kvscope.engine.engine import Engine
from kvscope.runs.background.live import LiveRun
from kvscope.runs.setup.simulated import SimSpec, prepare_simulation
from kvscope.runs.setup.spec import RunSpec, WorkloadSpec
from kvscope.runs.workload.items import synthetic_workload


def test_a_replay_at_another_rate_keeps_the_requests_and_retimes_them(tmp_path):
    items = synthetic_workload(12, (8, 32), (12, 20), vocab_size=512, seed=2, exclude_ids=(0, 1, 2))
    live = LiveRun(Engine("tiny", num_blocks=64, max_num_seqs=4), items, dashboard=False)
    live.start().wait()
    path = live.run.save_metrics(tmp_path / "r.metrics.jsonl")
    setup = prepare_simulation(RunSpec(workload=WorkloadSpec(rate=4.0)), SimSpec(replay=str(path)))
    items = setup.workload
    assert [i.prompt for i in items] == [e.prompt_token_ids for e in live.run.events if e.kind == "queued"]
    assert items[0].arrival_s == 0 and items[-1].arrival_s > 1.0  # 12 arrivals at 4/s: about 3 s
    assert setup.sim_meta["step_model_from"] == "fitted on the replayed run itself"


def test_a_long_replay_lets_finished_requests_go_like_a_long_synthetic_run(tmp_path, monkeypatch):
    """Past ``LAZY_ABOVE`` requests a replay's finished requests are not kept (its memory is bounded by the
    unfinished ones), as for as many synthetic ones; a short replay keeps them."""
    import kvscope.runs.setup.simulated as simulated

    items = synthetic_workload(6, (8, 16), (12, 16), vocab_size=512, seed=2, exclude_ids=(0, 1, 2))
    live = LiveRun(Engine("tiny", num_blocks=64, max_num_seqs=4), items, dashboard=False)
    live.start().wait()
    path = live.run.save_metrics(tmp_path / "r.metrics.jsonl")
    setup = prepare_simulation(RunSpec(), SimSpec(replay=str(path)))
    assert len(setup.workload) == 6 and setup.run_options()["keep_outputs"] is True
    monkeypatch.setattr(simulated, "LAZY_ABOVE", 5)
    assert setup.run_options()["keep_outputs"] is False
