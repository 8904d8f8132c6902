"""Whoever evaluates the configurations, the table is the same: sequential, local processes, an embedded Ray."""

from __future__ import annotations

import builtins
import os

import pytest

from kvscope.search.executors import RayMissing, run_search
from kvscope.search.space import SearchSpace
from kvscope.search.table import best, csv_text
from tests.search.conftest import small_problem

SPACE = SearchSpace.parse("max_num_seqs=8,32 replicas=1,2")


def table(executor: str, **kw) -> str:
    problem = small_problem(requests=24)
    seen = []
    outcomes = run_search(problem, list(SPACE.points()), executor=executor, progress=seen.append, **kw)
    assert sorted(o.point.index for o in seen) == list(range(len(SPACE)))  # progress once per configuration
    return csv_text(outcomes, SPACE.names, problem.slo, best(outcomes))


@pytest.fixture(scope="module")
def sequential() -> str:
    return table("sequential")


def test_the_table_names_each_key_and_the_best(sequential):
    lines = sequential.splitlines()
    assert lines[0].startswith("max_num_seqs,replicas,gpus,usd_per_hour,goodput_rps,goodput_per_gpu,")
    assert "ttft_p99,itl_p99,attained,capped,broke_first" in lines[0]
    assert len(lines) == 5 and sum(line.split(",")[-2] == "1" for line in lines[1:]) == 1


def test_processes_give_the_same_table(sequential):
    assert table("processes", workers=2) == sequential


def ray_or_skip():
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail('ray is missing in CI: the dev extra installs it (pip install -e ".[dev]")')
        pytest.skip("ray is not installed (pip install -e '.[ray]')")


def test_an_embedded_ray_gives_the_same_table(sequential):
    ray_or_skip()
    assert table("ray", workers=2) == sequential


def test_without_ray_the_flag_says_how_to_get_it(monkeypatch):
    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(RayMissing, match=r'pip install -e "\.\[ray\]"'):
        run_search(small_problem(), list(SPACE.points())[:1], executor="ray")
