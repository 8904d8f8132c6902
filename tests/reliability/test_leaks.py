"""Memory: a live run with its dashboard is freed, engine and KV pool included, once the user drops
it, even while its dashboard stays displayed (ipywidgets keeps every widget until it is closed, and
the widgets hold the run only weakly); closing the dashboard frees the widgets. Repeated runs, as
repeated ``%kvscope`` cells make them, do not grow the process's memory."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import weakref

import ipywidgets
import pytest
from reliability_util import FIGURES, workload

from kvscope import Engine
from kvscope.runs.background.live import LiveRun

pytestmark = pytest.mark.timeout(300)
BLOCK_SIZE, NUM_BLOCKS = 256, 384  # the tiny model's KV: 128 KiB a block, a 48 MiB pool
POOL_BYTES = 48 << 20


def _live_run(widgets: bool, num_blocks: int = 16) -> LiveRun:
    def make() -> Engine:
        return Engine("tiny", block_size=BLOCK_SIZE, num_blocks=num_blocks, max_num_seqs=4)

    run = LiveRun(make, workload(3, out=4, seed=91), dashboard_options={"headless": not widgets, "refresh_hz": 10.0})
    if widgets:
        assert run.dashboard.widget is not None  # built, as a notebook shows it
    return run.start().wait(timeout=120)


def _refs(run: LiveRun) -> dict[str, weakref.ref]:
    engine = run.engine
    refs = {"run": weakref.ref(run), "engine": weakref.ref(engine), "dashboard": weakref.ref(run.dashboard),
            "kv pages": weakref.ref(engine.runner.kv_caches[0][0]), "model": weakref.ref(engine.model)}
    if run.dashboard.view is not None:
        refs["a panel widget"] = weakref.ref(run.dashboard.view.models[0])
    return refs


def _alive(refs: dict[str, weakref.ref]) -> list[str]:
    gc.collect()
    return sorted(name for name, ref in refs.items() if ref() is not None)


@pytest.mark.parametrize("widgets", [True, False], ids=["displayed", "headless"])
def test_a_dropped_run_frees_its_engine_while_its_dashboard_stays(widgets):
    run = _live_run(widgets)
    refs = _refs(run)
    view = run.dashboard.view
    del run
    FIGURES["live runs dropped and checked freed"] += 1
    kept = {"a panel widget"} if widgets else set()  # still displayed: ipywidgets holds it
    assert _alive(refs) == sorted(kept)
    if view is not None:
        assert view.control is None
        view.buttons[0].click()  # the Stop button of a run that is gone does nothing
        view.close()
        del view
        assert _alive(refs) == []  # closed: the widgets are freed too


def test_closing_a_run_closes_its_widgets_and_dropping_it_frees_everything():
    run = _live_run(widgets=True)
    refs = _refs(run)
    ids = {m.model_id for m in run.dashboard.view.models}
    run.close()
    registry = ipywidgets.widgets.widget._instances  # every open widget of the kernel (ipywidgets 8)
    assert not ids & set(registry), "closed widgets are still registered"
    assert run.outputs and run.records  # results stay readable after close
    del run
    assert _alive(refs) == []


def _rss_bytes() -> int:
    """Resident memory after glibc hands back what it keeps cached: freed memory in the arenas of the
    runs' threads otherwise stays resident for a while, tens of MiB of noise next to the 48 MiB a kept
    pool would add."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: measure as is
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_repeated_dashboard_runs_do_not_grow_memory():
    """Eight runs with a 48 MiB KV pool each and a built dashboard, each dropped after it ends (the
    widgets left registered, as a displayed %kvscope leaves them). A run kept alive would add its
    pool: six of them 288 MiB; the tolerance is three pools (each dropped run's widgets stay registered, a few
    MiB each, and the allocator's cache varies with what ran before)."""
    for _ in range(2):  # warm-up: imports, allocator pools, first-use caches
        _live_run(widgets=True, num_blocks=NUM_BLOCKS)
    gc.collect()
    before = _rss_bytes()
    engines = []
    for _ in range(6):
        run = _live_run(widgets=True, num_blocks=NUM_BLOCKS)
        assert run.engine.runner.kv_cache_bytes == POOL_BYTES
        engines.append(weakref.ref(run.engine))
        del run
        gc.collect()
    grown = _rss_bytes() - before
    print(f"RSS grew by {grown / 2**20:.1f} MiB over 6 runs of a {POOL_BYTES >> 20} MiB pool")
    FIGURES["live runs dropped and checked freed"] += 8
    assert [e for e in engines if e() is not None] == []
    assert grown < 3 * POOL_BYTES, f"RSS grew by {grown / 2**20:.0f} MiB over 6 runs"
