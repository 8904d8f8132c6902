"""The real vLLM of ``test_real_vllm.py``: the watch tests' virtualenv and tiny random Llama (the session
fixtures ``vllm_py`` and ``tiny_llama`` of tests/conftest.py), one server for the module, always stopped.
Skipped without the virtualenv; a failure when ``CI`` is set."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import serve


@pytest.fixture(scope="module")
def vllm_server(vllm_py: Path, tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory):
    yield from serve(vllm_py, tiny_llama, tmp_path_factory.mktemp("vllm"), plugin=False, num_gpu_blocks=64)
