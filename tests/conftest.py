"""Shared test setup: never touch the network, one thread per process, quiet transformers, shared helpers."""

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread: tests (and the kernels, notebooks and CLIs they start, which inherit this) share
# two cores; OpenMP threads spinning against each other made small steps 10x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="module")
def ip():
    """IPython's own shell with ``%load_ext kvscope`` (as in a test of any magic), unloaded after the module."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kvscope")
    yield shell
    shell.run_line_magic("unload_ext", "kvscope")
