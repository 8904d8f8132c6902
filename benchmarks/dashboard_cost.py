"""What the live dashboard takes from a run: its update thread's CPU per tick and as a share of the process's.

    python benchmarks/dashboard_cost.py                       # tiny, 200 requests x 40 tokens, 5 Hz, measure only
    python benchmarks/dashboard_cost.py --model smollm2 --requests 48 --tokens 64
    python benchmarks/dashboard_cost.py --govern              # with the cost governor on (as a notebook runs)
    python benchmarks/dashboard_cost.py --profile             # cProfile of the ticks, by own time

A ``LiveRun`` with a headless dashboard that serializes every tick's messages (what a displayed one sends;
``Dashboard(headless=True, serialize=True)``) at ``--refresh`` Hz. Without ``--govern`` the governor
(``kvscope.widgets.cost``) only measures (an unreachable budget), so the rate stays what was asked; with it, the
run's rate changes are printed as the run metadata keeps them (``meta["dashboard_cost"]``). The share is the
update thread's ``thread_time`` over the process's ``process_time``; the load average is printed beside it (on a
shared machine both move). Results are in ``docs/benchmarks.md`` ("Dashboard cost").
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

from kvscope import Engine
from kvscope.runs.background.live import LiveRun
from kvscope.runs.workload.items import synthetic_workload
from kvscope.widgets.cost import CostGovernor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=40, help="output tokens per request")
    parser.add_argument("--refresh", type=float, default=5.0, help="the dashboard's refresh rate (Hz)")
    parser.add_argument("--govern", action="store_true", help="let the cost governor lower the rate")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the ticks")
    args = parser.parse_args()

    def make() -> Engine:
        if args.model == "tiny":
            return Engine("tiny", num_blocks=256, block_size=16, max_num_seqs=16)
        return Engine(args.model, max_num_seqs=16)

    vocab = 512 if args.model == "tiny" else 32000
    items = synthetic_workload(args.requests, (16, 64), (args.tokens, args.tokens), vocab_size=vocab,
                               exclude_ids=[0, 1, 2], seed=3)
    run = LiveRun(make, items, dashboard_options={"refresh_hz": args.refresh, "headless": True})
    dash = run.dashboard
    if not args.govern:
        dash.governor = CostGovernor(args.refresh, budget=1e9)  # measures, never lowers
    profile = cProfile.Profile()
    tick_cpu: list[float] = []
    tick = dash.tick

    def timed_tick(final: bool = False):
        start = time.thread_time()
        if args.profile:
            profile.enable()
        try:
            return tick(final)
        finally:
            if args.profile:
                profile.disable()
            if not final:
                tick_cpu.append(time.thread_time() - start)

    dash.tick = timed_tick
    load_before = os.getloadavg()
    run.start().wait(timeout=3600)
    worked = sorted(tick_cpu)
    cost = dash.governor.describe()
    print(f"model {args.model}: {run.step} steps, {len(worked)} ticks at up to {args.refresh:g} Hz")
    if worked:
        print(f"tick CPU: mean {sum(worked) / len(worked) * 1e3:.2f} ms, p50 {worked[len(worked) // 2] * 1e3:.2f} ms, "
              f"p90 {worked[int(len(worked) * 0.9)] * 1e3:.2f} ms")
    print(f"dashboard thread CPU {cost['cpu_s']:.3f} s = {(cost['share'] or 0):.2%} of the process's "
          f"(peak {cost['peak_window_share']:.2%} over a {cost['window_s']:g} s window); "
          f"rate at the end {cost['refresh_hz']:g} Hz")
    for change in cost["changes"]:
        print(f"  at {change['t_s']:.1f} s: {change['from_hz']:g} -> {change['to_hz']:g} Hz "
              f"(window share {change['share']:.2%})")
    print("load average before / after: " + " ".join(f"{x:.2f}" for x in load_before) + " / "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.profile:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())


if __name__ == "__main__":
    main()
