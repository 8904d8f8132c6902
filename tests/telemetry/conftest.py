"""Fixtures for the telemetry tests: small deterministic runs of the ``tiny`` model on the CPU."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from telemetry_util import PROMPT_A, PROMPT_B, greedy, make_engine

from kvscope import Engine

# On a shared 2-core machine, torch's intra-op threads spin against other processes and a 1 ms step
# can take 500 ms; one thread keeps these tests fast and their timing stable.
torch.set_num_threads(1)


@pytest.fixture
def engine() -> Engine:
    return make_engine()


@pytest.fixture(scope="module")
def two_request_run():
    """(engine, run) of PROMPT_A and PROMPT_B, 4 greedy tokens each."""
    from kvscope import Run

    eng = make_engine()
    eng.generate([PROMPT_A, PROMPT_B], greedy(4))
    return eng, Run.from_engine(eng)
