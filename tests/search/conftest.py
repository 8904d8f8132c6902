"""A small search problem every search test shares: llama-7b's shape on an A100's roofline, 40 short requests,
a tight SLO, two bisection steps (a configuration in well under a second)."""

from __future__ import annotations

import pytest

from kvscope.runs.setup.simulated import SimSpec
from kvscope.runs.setup.spec import RunSpec, WorkloadSpec
from kvscope.search.problem import Bisection, SearchProblem
from kvscope.search.slo import SLO

SLO_TEXT = "ttft_p99=0.3,itl_p99=0.03"


def small_problem(requests: int = 40, slo: str = SLO_TEXT, **kw) -> SearchProblem:
    spec = RunSpec(model="llama-7b", workload=WorkloadSpec(requests=requests, prompt_len=(64, 256),
                                                           output_len=(8, 24)))
    return SearchProblem(spec, SimSpec(gpu="a100"), SLO.parse(slo), Bisection(start=4.0, steps=2), **kw)


@pytest.fixture
def problem() -> SearchProblem:
    return small_problem()
