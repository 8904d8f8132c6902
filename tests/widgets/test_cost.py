"""The dashboard's own cost (``widgets/cost.py``): a refresh rate whose cost exceeds the 1% budget is lowered
and the status line says so; a cheap one is kept; the user's rate is the ceiling. Clocks are made up
(``observe(wall, own_cpu, process_cpu)``), except in the last test, a real tiny live run."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvscope import Engine
from kvscope.runs.background.live import LiveRun
from kvscope.runs.workload.items import synthetic_workload
from kvscope.widgets.cost import COST_BUDGET, MIN_REFRESH_HZ, CostGovernor
from kvscope.widgets.dashboard import Dashboard
from kvscope.widgets.feed import Feed
from kvscope.widgets.panels import apply_tick, build_panels
from kvscope.widgets.stats import LatencyStats

pytestmark = pytest.mark.timeout(120)


def _feed(gov: CostGovernor, seconds: float, share: float, busy: float = 1.0,
          state: list[float] | None = None) -> list[float]:
    """Readings every 0.2 s for ``seconds``: the process busy on ``busy`` cores, the dashboard ``share`` of it.
    Returns every new rate; ``state`` carries the cumulative clocks on from a previous call."""
    wall, own, proc = state if state is not None else (0.0, 0.0, 0.0)
    rates = []
    for _ in range(round(seconds / 0.2)):
        wall += 0.2
        proc += 0.2 * busy
        own += 0.2 * busy * share
        hz = gov.observe(wall, own, proc)
        if hz is not None:
            rates.append(hz)
    if state is not None:
        state[:] = [wall, own, proc]
    return rates


def test_an_expensive_dashboard_is_lowered_and_says_so():
    gov = CostGovernor(5.0)
    clocks = [100.0, 7.0, 50.0]
    assert _feed(gov, 2.8, share=0.023, state=clocks) == []  # not a whole window yet
    assert _feed(gov, 0.4, share=0.023, state=clocks) == [2.5]
    assert gov.refresh_hz == 2.5 and gov.changes[0].from_hz == 5.0 and gov.changes[0].share == pytest.approx(0.023)
    assert gov.note() == "refresh lowered to 2.5 Hz: the dashboard took 2.3% of the run's CPU (budget 1%)"
    described = gov.describe()
    assert described["refresh_hz"] == 2.5 and described["ceiling_hz"] == 5.0 and described["num_changes"] == 1


def test_lowering_goes_on_to_the_floor_and_a_cheap_dashboard_is_kept():
    gov = CostGovernor(5.0)
    assert _feed(gov, 30, share=0.5) == [2.5, 1.25, 0.625, MIN_REFRESH_HZ]
    assert gov.note().startswith("refresh lowered to 0.5 Hz, the lowest: the dashboard took 50%")
    just_over = CostGovernor(5.0)
    assert _feed(just_over, 3.2, share=0.01039) == [2.5]
    assert "took 1.04% of the run's CPU (budget 1%)" in just_over.note()  # not a rounded "1.0%" over a 1% budget
    cheap = CostGovernor(5.0)
    assert _feed(cheap, 30, share=COST_BUDGET * 0.9) == []
    assert cheap.refresh_hz == 5.0 and cheap.note() is None and cheap.share == pytest.approx(0.009)


def test_an_idle_engine_is_not_judged():
    """Paused or sleeping between steps: the process barely ran, so the dashboard took nothing from it."""
    gov = CostGovernor(5.0)
    assert _feed(gov, 10, share=0.9, busy=0.1) == []
    assert gov.refresh_hz == 5.0 and gov.share is None


def test_the_users_rate_is_the_ceiling():
    gov = CostGovernor(10.0)
    clocks = [0.0, 0.0, 0.0]
    assert _feed(gov, 3.2, share=0.02, state=clocks) == [5.0]
    gov.set_ceiling(2.0)  # the user picks 2 Hz: that rate now, and no note
    assert gov.refresh_hz == 2.0 and gov.note() is None
    assert _feed(gov, 3.2, share=0.02, state=clocks) == [1.0]  # still too expensive
    assert _feed(gov, 20, share=0.001, state=clocks) == [2.0]  # cheap again: back up, never past the user's 2 Hz
    assert gov.refresh_hz == 2.0 and gov.note() is None


def test_a_dashboard_shows_the_governors_words_and_the_user_resets_them():
    dash = Dashboard(headless=True, refresh_hz=5.0)
    dash.governor = CostGovernor(5.0, window_s=1.0)
    dash._apply_rate(_feed(dash.governor, 1.2, share=0.05)[-1])
    assert dash.refresh_hz == 2.5 and dash.cost_note is not None and dash.cost_note in dash.status_parts()
    dash.set_refresh(2.0)
    assert dash.refresh_hz == 2.0 and dash.governor.ceiling_hz == 2.0 and dash.cost_note is None


def test_the_shared_sample_arrays_follow_every_new_sample(finished_run):
    """The KPI tiles and the histograms read the TTFT / ITL samples from one array per tick (stats.samples): after
    each tick they still match the samples, computed afresh."""
    stats = LatencyStats()
    panels = {p.name: p for p in build_panels(stats, None, {"t0_ns": finished_run.t0_ns})}
    feed, events, seen = Feed(), sorted(finished_run.events, key=lambda e: e.t_ns), set()
    for record in finished_run.records:
        while events and events[0].t_ns <= record.t_end_ns:
            feed.push(events.pop(0))
        feed.push(record)
        apply_tick(list(panels.values()), stats, feed.poll())
        kpi = panels["kpi"].values
        for name in ("ttft", "itl"):
            values = np.array(getattr(stats, name))
            if len(values):
                seen.add(name)
                assert kpi[f"{name}_p50"] == np.percentile(values, 50)
                assert kpi[f"{name}_p99"] == np.percentile(values, 99)
                assert sum(getattr(panels["latency"], f"{name}_source").data["count"]) == len(values)
    assert seen == {"ttft", "itl"}


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_live_run_lowers_an_expensive_dashboards_rate(monkeypatch):
    """A real tiny run whose dashboard ticks burn ~30 ms of CPU each: its rate comes down, the status line and
    the run's metadata say so."""
    engine = Engine("tiny", num_blocks=64, block_size=8, max_num_seqs=4)
    items = synthetic_workload(400, (8, 24), (40, 40), vocab_size=512, exclude_ids=[0, 1, 2], seed=3)
    run = LiveRun(engine, items, dashboard_options={"refresh_hz": 10.0})
    dash = run.dashboard
    assert dash.widget is not None  # built, as a notebook shows it
    dash.governor = CostGovernor(10.0, window_s=1.0, min_busy=0.2)
    real_tick = dash.tick

    def expensive_tick(final: bool = False):
        _burn(0.03)
        return real_tick(final)

    monkeypatch.setattr(dash, "tick", expensive_tick)
    run.start()
    deadline = time.monotonic() + 30
    while dash.refresh_hz >= 10.0 and not run.done and time.monotonic() < deadline:
        time.sleep(0.1)
    run.stop()
    run.wait(timeout=60)
    assert dash.refresh_hz < 10.0, dash.governor.describe()
    assert any(p.startswith("refresh lowered to") for p in dash.view.parts), dash.view.parts
    cost = run.meta["dashboard_cost"]
    assert cost["changes"][0]["from_hz"] == 10.0 and cost["changes"][0]["share"] > COST_BUDGET
    assert cost["ceiling_hz"] == 10.0 and cost["cpu_s"] > 0
