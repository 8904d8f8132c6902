"""Shared setup of the reliability tests: one torch thread, the helpers module on the path, and the
greedy reference outputs that "a new run after the interrupt still works" is checked against."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from helpers import print_reliability_figures
from reliability_util import FIGURES, reference_tokens, workload

from kvscope.runs.workload.items import WorkItem

torch.set_num_threads(1)  # a shared 2-core machine: no spinning intra-op threads


@pytest.fixture(scope="session")
def after_items() -> list[WorkItem]:
    """The small workload every "a new run afterwards" check runs."""
    return workload(3, out=6, seed=11)


@pytest.fixture(scope="session")
def after_reference(after_items) -> list[list[int]]:
    """What ``after_items`` must produce: each request alone, on a fresh engine."""
    return reference_tokens(after_items)


def reliability_figures() -> dict[str, dict[str, int]]:
    """The figures of docs/reliability.md: what the state machine, the soak, the fuzzers and the tests here
    tried in this process (each module's ``COUNTS``, and ``FIGURES``), by module."""
    here = os.path.dirname(__file__)
    figures = {}
    for module in list(sys.modules.values()):
        counts = getattr(module, "COUNTS", None)
        if isinstance(counts, dict) and os.path.dirname(getattr(module, "__file__", "") or "") == here:
            figures[os.path.basename(module.__file__).removesuffix(".py")] = dict(counts)
    if FIGURES:
        figures["other reliability tests"] = dict(FIGURES)
    return figures


def pytest_sessionfinish(session) -> None:
    """Under pytest-xdist, a worker hands its figures to the controller (tests/conftest.py prints them all)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["kvscope_reliability_figures"] = reliability_figures()


def pytest_terminal_summary(terminalreporter) -> None:
    if not hasattr(terminalreporter.config, "workerinput"):  # one process: this is the only one
        print_reliability_figures(terminalreporter, reliability_figures())
