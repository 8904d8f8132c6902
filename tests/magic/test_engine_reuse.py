"""A rerun of %kvscope reuses the engine an earlier run loaded (issue 37, item 7): the model is not loaded again,
the reset engine records what a fresh one does, `%kvscope release` and memory pressure let engines go, and ten
runs with their dashboards in one process stay within a memory bound."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from kvscope.engine.config import EngineConfig
from kvscope.magic.history import HISTORY, KEEP_LIVE
from kvscope.runs.setup.engine_cache import ENGINES, EngineCache
from kvscope.utils.host import AvailableMemory

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(180)

# a shared prefix, so a pool that kept the first run's cached blocks would give the second run hits a fresh one has
LINE = "--requests 5 --prompt-len 20-40 --shared-prefix 16 --output-len 4-8 --num-blocks 24 --block-size 8 " \
       "--max-num-seqs 3"


def _shape(run) -> dict:
    """Everything a run recorded but times and memory readings, request ids numbered in order of appearance
    (ids come from one process-wide counter, so they differ between any two runs)."""
    names: dict[str, str] = {}

    def name(rid: str) -> str:
        return names.setdefault(rid, f"r{len(names)}") if rid else ""

    steps = []
    for r in run.records:
        items = [(name(i.request_id), i.kind, i.num_tokens, i.context_len, i.sampled) for i in r.scheduled]
        pages = sorted((b, name(e.owner.split("#")[0]), e.filled, e.state, e.refs) for b, e in r.page_map.items())
        counts = (r.step, r.num_prefill_tokens, r.num_decode_tokens, r.num_running, r.num_waiting, r.num_preempted,
                  r.num_finished, r.num_output_tokens, r.wait_reason)
        steps.append((counts, items, dataclasses.astuple(r.kv), pages))
    events = [(e.kind, name(e.request_id)) for e in run.events]
    return {"steps": steps, "events": events, "outputs": [o.token_ids for o in run.outputs]}


@pytest.fixture()
def fresh_cache():
    ENGINES.release_all()
    yield ENGINES
    ENGINES.release_all()


def test_a_rerun_reuses_the_engine_and_records_what_a_fresh_one_does(ip, fresh_cache):
    loads = fresh_cache.loads
    first = ip.run_line_magic("kvscope", f"{LINE} --wait -q -o")  # a fresh engine: nothing was kept
    assert fresh_cache.loads == loads + 1
    second = ip.run_line_magic("kvscope", f"{LINE} --wait -q -o")
    assert fresh_cache.loads == loads + 1, "the second run loaded the model again"
    assert second.engine is first.engine
    assert first.summary()["prefix_cache_hits"] > 0  # the shared prefix is found within a run
    assert _shape(second) == _shape(first)  # no block, record or counter left over from the first run
    other = ip.run_line_magic("kvscope", f"{LINE} --num-blocks 32 --wait -q -o")  # other settings: its own engine
    assert fresh_cache.loads == loads + 2 and other.engine is not first.engine


def test_release_lets_go_and_the_next_run_loads_again(ip, fresh_cache, capsys):
    ip.run_line_magic("kvscope", f"{LINE} --wait -q")
    loads = fresh_cache.loads
    ip.run_line_magic("kvscope", "release")
    said = capsys.readouterr().out
    assert said.startswith("kvscope: released 1 engine: tiny (idle, ") and not fresh_cache.entries
    ip.run_line_magic("kvscope", f"{LINE} --wait -q")
    assert fresh_cache.loads == loads + 1
    ip.run_line_magic("kvscope", "release")
    ip.run_line_magic("kvscope", "release")
    assert capsys.readouterr().out.endswith("kvscope: no loaded engine is kept\n")
    with pytest.raises(UsageError, match="takes no options"):
        ip.run_line_magic("kvscope", "release --all")


def test_idle_engines_are_let_go_under_memory_pressure_and_beyond_the_limit():
    free = [AvailableMemory(1 << 40, "plenty")]
    cache = EngineCache(max_idle=1, memory=lambda: free[0])
    small = EngineConfig(num_blocks=16, block_size=8)
    a = cache.acquire("tiny", small)
    cache.release(a)
    b = cache.acquire("tiny", EngineConfig(num_blocks=24, block_size=8))  # plenty of memory: a stays
    assert len(cache.entries) == 2
    cache.release(b)  # two idle, one allowed: the least recently used (a) goes
    assert [e.engine for e in cache.entries] == [b]
    free[0] = AvailableMemory(0, "none")
    c = cache.acquire("tiny", EngineConfig(num_blocks=32, block_size=8))  # short of memory: b goes first
    assert [e.engine for e in cache.entries] == [c] and cache.loads == 3
    again = cache.acquire("tiny", EngineConfig(num_blocks=32, block_size=8))  # c is busy: a second engine
    assert again is not c and cache.loads == 4


def test_a_busy_engine_released_meanwhile_goes_when_its_run_ends():
    cache = EngineCache()
    engine = cache.acquire("tiny", EngineConfig(num_blocks=16, block_size=8))
    assert cache.release_all() == [f"tiny (in use, {cache.entries[0].nbytes / 2**20:,.0f} MiB)"]
    assert len(cache.entries) == 1  # still in use
    cache.release(engine)
    assert cache.entries == []


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


@pytest.mark.slow
@pytest.mark.timeout(420)  # ten dashboards built and closed: ~30 s on an idle 2-core machine
def test_ten_runs_of_one_cell_with_their_dashboards_stay_within_a_bound(ip, fresh_cache):
    """A cell run ten times, each run displaying its dashboard: one engine loaded; the dashboards of runs whose
    cell ran again closed, all but the newest KEEP_LIVE, with every widget of theirs (layouts and styles too), so the
    kernel's widget count stops growing; RSS from the third run to the tenth within 16 MiB (it grew ~6 MiB a run,
    ~40 MiB over these seven, when every run's dashboard stayed registered)."""
    import ipywidgets

    line = "--requests 2 --prompt-len 8-16 --output-len 3-4 --num-blocks 32 --refresh 10 --wait"
    HISTORY.runs, HISTORY.last = [], None  # this test's runs only
    loads, closed = fresh_cache.loads, HISTORY.closed
    registry = ipywidgets.widgets.widget._instances
    rss, widgets = [], []
    for _ in range(10):
        with capture_output():
            result = ip.run_cell(f"%kvscope {line}", cell_id="the-cell")
        assert result.success, result.error_in_exec
        gc.collect()
        rss.append(_rss_mib())
        widgets.append(len(registry))
    assert fresh_cache.loads == loads + 1
    assert HISTORY.closed - closed == 10 - KEEP_LIVE
    assert widgets[-1] == widgets[2], f"widgets registered after each run: {widgets}"
    grown = rss[-1] - rss[2]
    print(f"RSS over ten runs (MiB): {[round(r) for r in rss]}; grew {grown:.1f} MiB from the third")
    assert grown < 16, f"RSS grew {grown:.1f} MiB over runs 3-10: {rss}"


def test_release_frees_the_last_runs_engine_and_show_still_shows_its_dashboard(ip, fresh_cache):
    import weakref

    with capture_output() as first:
        ip.run_line_magic("kvscope", f"{LINE} --refresh 10 --wait")  # displayed, not returned: the kernel holds it
    engine = weakref.ref(HISTORY.last.engine)
    with capture_output():
        ip.run_line_magic("kvscope", "release")
    gc.collect()
    assert engine() is None, "the released engine is still held"
    with capture_output() as shown:
        ip.run_line_magic("kvscope", "show")  # the finished run's widgets, displayed again
    widget = "application/vnd.jupyter.widget-view+json"
    ids = [[o.data[widget]["model_id"] for o in c.outputs if widget in o.data] for c in (first, shown)]
    assert ids[0] == ids[1] and len(ids[0]) == 1
