"""A configuration's goodput: the bisection's bracket holds (the SLO holds at the goodput and breaks at the rate
above it), the early-stop rule never changes a verdict, and every deployment shape runs and costs its GPUs."""

from __future__ import annotations

import pytest

from kvscope.search.goodput import deployment, evaluate
from kvscope.search.space import SearchSpace
from kvscope.search.trial import run_trial
from tests.search.conftest import small_problem


def point(text: str):
    return next(SearchSpace.parse(text).points())


def test_goodput_holds_and_the_rate_above_breaks(problem):
    p = point("max_num_seqs=32")
    out = evaluate(problem, p)
    assert out.error is None and out.goodput > 0 and out.broke_at is not None and out.broke_at > out.goodput
    dep = deployment(problem, p)
    at = run_trial(dep, problem.slo, out.goodput, early_stop=False).verdict
    above = run_trial(dep, problem.slo, out.broke_at, early_stop=False).verdict
    assert at.ok and at.percentiles == out.percentiles
    assert not above.ok and above.broke == out.broke
    assert out.num_gpus == 1 and out.usd_per_hour == pytest.approx(4.10)
    assert out.per_dollar_hour == pytest.approx(out.goodput * 3600 / 4.10)
    again = evaluate(problem, p)
    assert again.to_row() == out.to_row()  # deterministic


def test_early_stop_changes_no_verdict_and_saves_steps(problem):
    dep = deployment(problem, point("max_num_seqs=32"))
    saved = 0
    for rate in (2.0, 20.0, 60.0, 200.0):
        fast, full = run_trial(dep, problem.slo, rate), run_trial(dep, problem.slo, rate, early_stop=False)
        assert fast.verdict.ok == full.verdict.ok
        if fast.verdict.stopped_early:
            assert fast.num_steps < full.num_steps
            saved += 1
        else:
            assert fast.verdict == full.verdict
    assert saved >= 1  # the hopeless rates stopped early


def test_deployment_shapes_count_gpus_and_scale():
    problem = small_problem(requests=60)
    outs = {label: evaluate(problem, point(label)) for label in
            ("replicas=1", "replicas=2", "pd=1P1D", "replicas=2 pd=1P2D", "tp=2")}
    assert all(o.error is None and o.goodput > 0 for o in outs.values()), {k: o.error for k, o in outs.items()}
    assert [outs[k].num_gpus for k in outs] == [1, 2, 2, 6, 2]
    assert outs["replicas=2"].goodput > outs["replicas=1"].goodput
    assert outs["tp=2"].goodput > outs["replicas=1"].goodput  # half the step time, and a bigger KV pool


def fitted_problem(tmp_path):
    from dataclasses import replace

    from kvscope.runs.setup.simulated import SimSpec
    from kvscope.sim.step_model import PHASES, LinearStepModel, PhaseFit

    path = tmp_path / "step.json"
    LinearStepModel({p: PhaseFit(0.01, {"prefill_tokens": 1e-5}, [0.8, 1.0, 1.3]) for p in PHASES}, seed=3).save(path)
    return replace(small_problem(), sim=SimSpec(step_model=str(path)))


def test_a_fitted_step_model_with_scatter_gives_the_same_trial_every_time(tmp_path):
    problem = fitted_problem(tmp_path)
    dep = deployment(problem, point("max_num_seqs=16"))
    first = run_trial(dep, problem.slo, 10.0)
    assert run_trial(dep, problem.slo, 10.0) == first  # the scatter restarts from its seed at every trial
    out = evaluate(problem, point("max_num_seqs=16"))
    assert out.error is None and out.usd_per_hour is None and out.per_dollar_hour is None


def test_configurations_that_cannot_run_say_why(tmp_path):
    out = evaluate(fitted_problem(tmp_path), point("tp=2"))
    assert out.goodput == 0 and "tp= needs a roofline" in out.error
    out = evaluate(small_problem(), point("num_blocks=1"))  # no request fits: each fails, at every rate
    assert out.goodput == 0 and out.broke == "ttft_p99" and out.broke_at == small_problem().bisection.minimum


def test_a_model_too_big_for_one_gpu_runs_across_tp_gpus():
    """llama-70b's 140 GB of weights fit no single A100-80GB; at tp=4 the four GPUs' memory less the weights is the
    instance's KV pool (prepare_simulation's rule), and tp=1 is refused, naming why."""
    from dataclasses import replace

    from kvscope.runs.setup.simulated import SimSpec

    problem = small_problem(requests=20)
    problem = replace(problem, spec=replace(problem.spec, model="llama-70b"), sim=SimSpec(gpu="a100-80gb"))
    one, four = evaluate(problem, point("tp=1")), evaluate(problem, point("tp=4"))
    assert one.error is not None and "does not fit on a100-80gb" in one.error
    assert four.error is None and four.num_gpus == 4 and four.goodput > 0
    from kvscope.planning.gpus import find_gpu
    from kvscope.planning.planner import weights_bytes
    from kvscope.runs.setup.simulated import ACTIVATION_RESERVE
    from kvscope.sim.shape import resolve_shape

    spec = resolve_shape("llama-70b", "bfloat16").spec
    weights = weights_bytes("llama-70b", spec.num_params, spec.dtype_bytes)[0]
    assert weights > find_gpu("a100-80gb").memory_bytes
    assert deployment(problem, point("tp=4")).kv_budget == \
        4 * (find_gpu("a100-80gb").memory_bytes - ACTIVATION_RESERVE) - weights
