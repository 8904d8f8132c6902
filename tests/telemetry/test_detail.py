"""``DetailWindow``: per-request detail at the start, off while far more steps remain than the window keeps, and
on for good once the estimate says the end is near (a short run never goes light)."""

from __future__ import annotations

from kvscope.telemetry.detail import DetailWindow


def test_a_long_run_goes_light_then_back_for_the_last_windows():
    w = DetailWindow(window_steps=100, total_requests=10_000, margin=2.0, warmup=50)
    assert w.update(steps=0, finished=0) and w.update(steps=40, finished=49)  # warming up: detail
    assert not w.update(steps=60, finished=50)  # 1.2 steps per request, 9,950 left: far more than 200 steps
    assert not w.update(steps=11_700, finished=9_800)  # 200 x 1.19 = 239 steps left
    assert w.update(steps=11_800, finished=9_835)  # 165 x 1.2 = 198 <= 200: on
    assert w.update(steps=11_801, finished=9_835) and w.settled  # and stays on, whatever comes


def test_a_short_run_never_goes_light():
    w = DetailWindow(window_steps=4096, total_requests=2_000, warmup=64)
    assert all(w.update(steps=s, finished=f) for s, f in [(0, 0), (100, 64), (500, 300), (1_000, 1_999)])
