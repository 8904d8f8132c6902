"""Other processes' load on this process's CPUs (kvscope/utils/cpu_load.py), from a written /proc/stat."""

from __future__ import annotations

import os
from pathlib import Path

from kvscope.utils.cpu_load import (
    CpuSample,
    LoadMeter,
    cgroup_cpu_limit,
    others_busy,
    own_running,
    read_busy_s,
    runnable_others,
    usable_cores,
)

HZ = os.sysconf("SC_CLK_TCK")


def stat(path: Path, cpu0: tuple[int, ...], cpu1: tuple[int, ...]) -> Path:
    total = [a + b for a, b in zip(cpu0, cpu1)]
    path.write_text("\n".join([
        "cpu  " + " ".join(map(str, total)),
        "cpu0 " + " ".join(map(str, cpu0)),
        "cpu1 " + " ".join(map(str, cpu1)),
        "intr 1 2 3", "ctxt 99",
    ]) + "\n")
    return path


def test_busy_time_counts_the_allowed_cpus_and_steal_not_idle(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal
    path = stat(tmp_path / "stat", (100, 0, 20, 500, 50, 1, 2, 7), (40, 1, 9, 900, 0, 0, 0, 0))
    assert read_busy_s({0}, path) == (100 + 20 + 1 + 2 + 7) / HZ
    assert read_busy_s({0, 1}, path) == (130 + 50) / HZ
    assert read_busy_s({5}, path) is None
    assert read_busy_s({0}, tmp_path / "missing") is None


def test_others_busy_subtracts_this_process_and_needs_a_long_enough_interval() -> None:
    a = CpuSample(10.0, 100.0, 5.0)
    assert others_busy(a, CpuSample(12.0, 103.0, 6.0)) == 1.0  # 3 busy core-seconds, 1 of them ours, over 2 s
    assert others_busy(a, CpuSample(11.0, 100.5, 6.0)) == 0.0  # never below zero (tick rounding)
    assert others_busy(a, CpuSample(10.01, 101.0, 5.0)) is None
    assert others_busy(CpuSample(10.0, None, 5.0), CpuSample(12.0, 103.0, 6.0)) is None


def test_the_meter_reads_a_real_proc_stat() -> None:
    meter = LoadMeter()
    meter.last = CpuSample(meter.last.t_s - 1.0, meter.last.busy_s, meter.last.own_s)  # a second ago
    value = meter.read()
    assert value is not None and 0.0 <= value <= len(os.sched_getaffinity(0)) + 0.5


def test_a_cgroup_quota_caps_the_usable_cores(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    assert usable_cores(tmp_path) == min(1.5, len(os.sched_getaffinity(0)))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    assert cgroup_cpu_limit(tmp_path / "none") is None


def test_the_instant_figure_leaves_out_this_processs_own_runnable_threads(tmp_path: Path) -> None:
    """An engine that just ran GEMMs has OpenMP workers spinning: runnable, but its own, not other work (a quiet
    machine read as one core busy, and the thread policy started at one thread: benchmarks/contention.py)."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.50 0.40 0.30 3/112 4242\n")
    tasks = tmp_path / "task"
    for tid, state in ((10, "R"), (11, "R"), (12, "S")):
        (tasks / str(tid)).mkdir(parents=True)
        (tasks / str(tid) / "stat").write_text(f"{tid} (py (worker) {state} 1 2 3\n")  # a comm holding ") "
    assert own_running(tasks) == 2
    assert runnable_others(loadavg, tasks) == 1.0  # 3 running, 2 of them this process's
    assert runnable_others(loadavg, tmp_path / "none") == 2.0  # no task list: only the reader is known
    assert runnable_others(tmp_path / "missing", tasks) is None
    assert own_running() >= 1 and runnable_others() is not None  # the real /proc
