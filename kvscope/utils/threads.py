"""The thread settings kvscope may choose, and the user's own that it leaves alone (standard library only).

Two settings decide how torch's CPU ops share the cores: the intra-op threads (``torch.set_num_threads``, which
the engine's ``ThreadPolicy`` adjusts while it runs: ``kvscope/engine/threads.py``) and how OpenMP's idle threads
wait for the next parallel region (``OMP_WAIT_POLICY``). The wait policy is read once, when the OpenMP runtime
starts, and torch's libgomp starts when torch is imported: it can only be chosen before that, so
``prepare_openmp`` runs when ``kvscope`` is imported (``kvscope/__init__.py``). It chooses only when

- the user set none of ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` (theirs are kept as they are),
- ``KVSCOPE_THREAD_POLICY`` is not ``fixed`` (kvscope then changes no thread setting at all), and
- torch is not imported yet (``import torch`` before ``import kvscope``: the runtime's own default stays, said so),
  nor vLLM (kvscope's stat-logger plugin inside a watched server changes nothing of the server's).

What it chooses: on a machine whose load average is already at least its usable cores, and where other work keeps
at least half of them busy now (a 0.1 s ``/proc/stat`` sample: the load average lags by minutes), ``PASSIVE`` (an idle
thread sleeps at once: a spinning one would take the core that a descheduled peer, or another process, needs);
otherwise nothing, i.e. libgomp's default (spin ~300k iterations, then sleep), which is best on a quiet machine,
where a wake-up per op (~40 us on a 2-core VM) made passive waits slower. Once the engine runs, the thread count
adapts to load anyway; one thread, what a heavily shared machine ends up with, never waits for another. The
variable kvscope put in ``os.environ`` is taken back at ``Engine()`` once torch is loaded (``release_env``); a
process started before that inherits it.

The user's intra-op threads (``user_threads``): ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` in the environment, or
a ``torch.get_num_threads()`` other than torch's default (``torch_default_threads``: its physical-core count, as
cpuinfo counts them) and other than what kvscope itself set. A user who calls ``torch.set_num_threads`` with
torch's default value cannot be told apart from the default: ``OMP_NUM_THREADS`` or ``KVSCOPE_THREAD_POLICY=fixed``
pins it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvscope.utils.cpu_load import allowed_cpus, others_busy, sample, usable_cores

POLICY_ENV = "KVSCOPE_THREAD_POLICY"  # "adaptive" (the default) or "fixed" (kvscope changes no thread setting)
POLICIES = ("adaptive", "fixed")
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch's own default reads these, in this order
WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
CPU_SYS = Path("/sys/devices/system/cpu")
BUSY_NOW = 0.5  # share of the usable cores that other work must keep busy now for the machine to count as loaded


@dataclass(slots=True, frozen=True)
class WaitChoice:
    """How OpenMP's idle threads wait in this process, and who decided it."""

    policy: str  # "PASSIVE", "ACTIVE", "default" (libgomp's: spin a while, then sleep), or the user's value
    source: str  # "user", "kvscope" or "runtime" (torch started before kvscope could choose)
    reason: str

    def describe(self) -> dict[str, str]:
        return {"policy": self.policy, "source": self.source, "reason": self.reason}


_wait: WaitChoice | None = None
_kvscope_threads: int | None = None  # the intra-op threads kvscope last set (set_by_kvscope)


def policy_mode() -> str:
    """``KVSCOPE_THREAD_POLICY``, checked: "adaptive" (unset) or "fixed"."""
    value = os.environ.get(POLICY_ENV, "adaptive").strip().lower() or "adaptive"
    if value not in POLICIES:
        raise ValueError(f"{POLICY_ENV}={os.environ[POLICY_ENV]!r} is not a thread policy: use one of "
                         f"{', '.join(POLICIES)} (or leave it unset for adaptive)")
    return value


def others_now(window_s: float = 0.1) -> float | None:
    """Cores other processes keep busy over the next ``window_s`` (``/proc/stat``), or None where unreadable."""
    cpus = allowed_cpus()
    start = sample(cpus)
    time.sleep(window_s)
    return others_busy(start, sample(cpus))


def prepare_openmp(load_average: float | None = None, others_busy_now: float | None = None) -> WaitChoice:
    """Choose OpenMP's wait policy if nobody has (see the module doc); once per process, at ``import kvscope``.
    ``load_average``: the 1-minute load to judge by (default: ``os.getloadavg()``). A load average that says loaded
    is checked against the present (``others_busy_now``, default: a 0.1 s ``/proc/stat`` sample): it lags by
    minutes, and a machine whose other work just ended is quiet."""
    global _wait
    if _wait is not None:
        return _wait
    user = [f"{name}={os.environ[name]}" for name in WAIT_ENV if name in os.environ]
    if user:
        _wait = WaitChoice(os.environ.get("OMP_WAIT_POLICY", "default"), "user", f"set by the user: {', '.join(user)}")
    elif os.environ.get(POLICY_ENV, "").strip().lower() == "fixed":
        _wait = WaitChoice("default", "user", f"{POLICY_ENV}=fixed: kvscope changes no thread setting")
    elif "vllm" in sys.modules:  # kvscope's vLLM plugin, inside a watched server: never change the server
        _wait = WaitChoice("default", "runtime", "imported inside a vLLM process (kvscope's plugin): left to vLLM")
    elif "torch" in sys.modules:
        _wait = WaitChoice("default", "runtime", "torch was imported before kvscope, so OpenMP had started: import "
                           "kvscope first, or set OMP_WAIT_POLICY, to choose")
    else:
        cores = usable_cores()
        try:
            load = os.getloadavg()[0] if load_average is None else load_average
        except OSError:
            load = 0.0
        now = (others_now() if others_busy_now is None else others_busy_now) if load >= cores else None
        if load >= cores and (now is None or now >= BUSY_NOW * cores):
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
            _wait = WaitChoice("PASSIVE", "kvscope", f"load average {load:.2f} >= {cores:g} usable cores at import: "
                               "idle OpenMP threads sleep at once rather than spin")
        elif load >= cores:  # the 1-minute average still counts work that has ended
            _wait = WaitChoice("default", "kvscope", f"load average {load:.2f} >= {cores:g} usable cores, but other "
                               f"work keeps only {now:.2f} of them busy now: libgomp's default (spin briefly, then "
                               "sleep)")
        else:
            _wait = WaitChoice("default", "kvscope", f"load average {load:.2f} < {cores:g} usable cores at import: "
                               "libgomp's default (spin briefly, then sleep)")
    return _wait


def wait_choice() -> WaitChoice:
    """What ``prepare_openmp`` decided (it runs now if kvscope's import did not run it)."""
    return _wait if _wait is not None else prepare_openmp()


def torch_default_threads() -> int:
    """The intra-op threads torch starts with when no variable says otherwise: its physical cores (cpuinfo's
    count of cores, which ignores the affinity mask), else the logical CPUs."""
    logical = os.cpu_count() or 1
    cores = set()
    for folder in CPU_SYS.glob("cpu[0-9]*/topology"):
        try:
            cores.add((folder / "core_cpus_list").read_text().strip())
        except OSError:
            try:
                cores.add((folder / "thread_siblings_list").read_text().strip())
            except OSError:
                return logical
    return len(cores) if 0 < len(cores) < logical else logical


def user_threads(current: int) -> str | None:
    """Why the intra-op threads (``current``: ``torch.get_num_threads()``) are the user's, or ``None`` when they
    are torch's default or kvscope's own (see the module doc)."""
    for name in THREAD_ENV:
        if os.environ.get(name, "").strip():
            return f"{name}={os.environ[name]} in the environment"
    if _kvscope_threads is not None:
        if current == _kvscope_threads:
            return None
        return f"torch.set_num_threads({current}) called after kvscope set {_kvscope_threads}"
    if current not in (torch_default_threads(), os.cpu_count()):
        return f"torch.set_num_threads({current}) called before the engine (torch's default here: " \
               f"{torch_default_threads()})"
    return None


def release_env() -> None:
    """Take back the ``OMP_WAIT_POLICY`` kvscope put in the environment once torch (and its OpenMP runtime) is
    loaded, so that the processes this one starts (a vLLM server, a notebook kernel) choose their own."""
    mine = _wait is not None and _wait.source == "kvscope" and _wait.policy != "default"
    if mine and "torch" in sys.modules and _wait is not None and os.environ.get("OMP_WAIT_POLICY") == _wait.policy:
        del os.environ["OMP_WAIT_POLICY"]


def set_by_kvscope(threads: int) -> None:
    """Note the intra-op threads kvscope just set, so that they are not taken for the user's."""
    global _kvscope_threads
    _kvscope_threads = threads
