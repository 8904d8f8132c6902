"""What CPUs this process may run on, and how busy other processes keep them (standard library only).

``usable_cores()``: the CPUs of this process's affinity mask (``os.sched_getaffinity``), fewer when its cgroup
has a CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``: a container given 1.5
CPUs of a 16-core host has 1.5).

``LoadMeter``: how many of those cores other work kept busy between two readings. It reads the busy time of
the allowed CPUs from ``/proc/stat`` (user, nice, system, irq, softirq and steal: time a hypervisor gave another
guest is a core this process did not get) and subtracts this process's own CPU time (``time.process_time``, all
its threads), so kvscope's own threads, spinning ones included, never count as load. Each reading costs one read
of ``/proc/stat`` (~30 us); ``None`` where ``/proc/stat`` cannot be read or the interval is too short to say.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
CGROUP_ROOT = Path("/sys/fs/cgroup")
MIN_INTERVAL_S = 0.05  # shorter intervals are a few clock ticks: too coarse to read a load from
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (idle = 3, iowait = 4)


def allowed_cpus() -> set[int]:
    """The CPU ids this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """The cgroup's CPU quota in cores (``None``: no quota, or none readable)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max" and float(period) > 0:
            return float(quota) / float(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = float((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = float((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def usable_cores(root: Path = CGROUP_ROOT) -> float:
    """The cores this process can use at most: its affinity mask, capped by its cgroup's CPU quota."""
    cores = float(len(allowed_cpus()))
    limit = cgroup_cpu_limit(root)
    return max(min(cores, limit), 0.01) if limit is not None else cores


@dataclass(slots=True, frozen=True)
class CpuSample:
    t_s: float  # time.monotonic()
    busy_s: float | None  # busy seconds of the allowed CPUs since boot (None: /proc/stat unreadable)
    own_s: float  # this process's CPU seconds


def read_busy_s(cpus: set[int], path: Path = PROC_STAT) -> float | None:
    """Busy seconds since boot summed over ``cpus`` (the ``cpuN`` lines of ``/proc/stat``)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    ticks, found = 0, False
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *values = line.split()
        try:
            if int(name[3:]) not in cpus:
                continue
            ticks += sum(int(values[i]) for i in _BUSY_FIELDS if i < len(values))
        except ValueError:
            continue
        found = True
    return ticks / os.sysconf("SC_CLK_TCK") if found else None


def sample(cpus: set[int], path: Path = PROC_STAT) -> CpuSample:
    return CpuSample(time.monotonic(), read_busy_s(cpus, path), time.process_time())


def others_busy(a: CpuSample, b: CpuSample) -> float | None:
    """Cores kept busy by other processes between ``a`` and ``b`` (>= 0), or ``None`` when it cannot be said."""
    wall = b.t_s - a.t_s
    if a.busy_s is None or b.busy_s is None or wall < MIN_INTERVAL_S:
        return None
    return max(0.0, ((b.busy_s - a.busy_s) - (b.own_s - a.own_s)) / wall)


def own_running(tasks: Path = Path("/proc/self/task")) -> int:
    """This process's threads that are runnable now (state ``R`` in ``/proc/self/task/*/stat``), the reader
    included: at least 1. Right after a parallel region OpenMP's idle workers spin for a while and are runnable,
    so a process that just ran a GEMM (an engine that just loaded and probed its model) has more than one."""
    count = 0
    try:
        stats = list(tasks.iterdir())
    except OSError:
        return 1
    for task in stats:
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        count += text[text.rfind(")") + 2 : text.rfind(")") + 3] == "R"  # after "pid (comm) ", comm may hold ")"
    return max(count, 1)


def runnable_others(path: Path = Path("/proc/loadavg"), tasks: Path = Path("/proc/self/task")) -> float | None:
    """Other processes' tasks runnable right now (``/proc/loadavg``'s running count, less this process's runnable
    threads: ``own_running``): an instant, noisy figure, for when no recent ``LoadMeter`` interval is at hand;
    ``None`` where it cannot be read."""
    try:
        running = int(path.read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None
    return float(max(0, running - own_running(tasks)))


class LoadMeter:
    """Other processes' busy cores since the previous reading (see the module doc)."""

    __slots__ = ("cpus", "last", "path")

    def __init__(self, cpus: set[int] | None = None, path: Path = PROC_STAT) -> None:
        self.cpus = cpus if cpus is not None else allowed_cpus()
        self.path = path
        self.last = sample(self.cpus, path)

    def age_s(self) -> float:
        """Seconds since the last reading."""
        return time.monotonic() - self.last.t_s

    def read(self) -> float | None:
        """Others' busy cores since the last reading that returned a figure (short intervals keep accumulating)."""
        now = sample(self.cpus, self.path)
        value = others_busy(self.last, now)
        if value is not None or now.busy_s is None:
            self.last = now
        return value
