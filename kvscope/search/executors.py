"""Who evaluates a search's configurations: ``run_search(problem, points, executor=...)``.

- ``sequential``: one after another in this process;
- ``processes`` (the default): a ``concurrent.futures.ProcessPoolExecutor`` of ``workers`` processes (default:
  every core), started by a fork server that imported the simulator once (``forkserver``: no fork of a process
  whose threads hold locks, no re-import of the caller's ``__main__``);
- ``ray``: one Ray task per configuration. ``address=None`` starts an embedded local Ray (``ray.init``, every core
  or ``workers``, no dashboard) and shuts it down after; an address (``127.0.0.1:6379``, ``ray://...``, ``auto``)
  joins that cluster and leaves it running. Ray is an optional extra: without it, ``RayMissing`` says how to get it.

Every executor calls the same pure function (``kvscope.search.goodput.evaluate``) with the same arguments, so
the table is the same whoever computes it; results come back in the space's order. ``progress(outcome)`` is
called in this process as each configuration finishes (in finishing order).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from kvscope.search.goodput import Outcome, evaluate
from kvscope.search.problem import SearchProblem
from kvscope.search.space import Point

EXECUTORS = ("sequential", "processes", "ray")
RAY_HINT = 'pip install -e ".[ray]" (or pip install ray)'
# Ray's own start-up limits (its RayConfig, read from RAY_<name> in the environment of the processes it starts):
# the raylet gives its agent 15 s to register, which a busy 2-core machine misses (seen: 28 s); a user's own
# values are kept.
RAY_START_LIMITS = {"RAY_agent_register_timeout_ms": "120000", "RAY_raylet_start_wait_time_s": "120"}


def ray_start_env() -> dict[str, str]:
    """The environment to start Ray processes with: this one, with ``RAY_START_LIMITS`` where it has none."""
    return {**RAY_START_LIMITS, **os.environ}

Progress = Callable[[Outcome], None]


class RayMissing(RuntimeError):
    """``--ray`` without Ray installed."""


def run_search(problem: SearchProblem, points: Sequence[Point], *, executor: str = "processes",
               workers: int | None = None, address: str | None = None,
               progress: Progress | None = None) -> list[Outcome]:
    """Every point's ``Outcome``, in the points' order."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor {executor!r} must be one of {', '.join(EXECUTORS)}")
    if workers is not None and not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"--workers {workers!r} must be a whole number >= 1")
    tell = progress or (lambda outcome: None)
    if executor == "sequential" or (executor == "processes" and (workers == 1 or len(points) <= 1)):
        out = []
        for p in points:
            out.append(evaluate(problem, p))
            tell(out[-1])
        return out
    if executor == "processes":
        return _processes(problem, points, workers or os.cpu_count() or 1, tell)
    return _ray(problem, points, workers, address, tell)


def _processes(problem: SearchProblem, points: Sequence[Point], workers: int, tell: Progress) -> list[Outcome]:
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["kvscope.search.goodput"])
    results: dict[int, Outcome] = {}
    with ProcessPoolExecutor(max_workers=min(workers, len(points)), mp_context=ctx) as pool:
        pending = {pool.submit(evaluate, problem, p) for p in points}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                outcome = future.result()
                results[outcome.point.index] = outcome
                tell(outcome)
    return [results[p.index] for p in points]


def ray_module():
    """``ray``, or ``RayMissing`` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RayMissing(f"--ray needs Ray, which is not installed: {RAY_HINT}") from None
    return ray


def _ray(problem: SearchProblem, points: Sequence[Point], workers: int | None, address: str | None,
         tell: Progress) -> list[Outcome]:
    ray = ray_module()
    started = not ray.is_initialized()
    if started:
        options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        for name, value in RAY_START_LIMITS.items():  # the processes ray.init starts inherit them
            os.environ.setdefault(name, value)
        if address:
            ray.init(address=address, **options)
        else:
            # "local": a new Ray of its own, never a cluster another process left running on this machine
            ray.init(address="local", num_cpus=workers or os.cpu_count() or 1, **options)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(evaluate)
        shared = ray.put(problem)
        refs = [task.remote(shared, p) for p in points]
        index = {ref: i for i, ref in enumerate(refs)}
        results: dict[int, Outcome] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                results[index[ref]] = outcome = ray.get(ref)
                tell(outcome)
        return [results[i] for i in range(len(points))]
    finally:
        if started:
            ray.shutdown()
