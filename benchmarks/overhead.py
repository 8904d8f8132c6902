"""What telemetry costs: kvscope throughput with telemetry off vs on, same process, same workload.

    python benchmarks/overhead.py            # the throughput benchmark's 56M random Llama, 48 requests
    python benchmarks/overhead.py --quick    # a smaller workload, 3 repeats
    python benchmarks/overhead.py --model tiny --threads 1 --json out.json

The model, workload and engine settings are those of ``benchmarks/throughput.py`` (``harness.py``,
``systems.py``); each run starts with an empty prefix cache.

Each mode gets its own engine over one shared model. Runs are interleaved (off, on, on, off, ...) so
that drift of a shared machine hits every mode alike; the figure is the median of the repeats.
Throughput is reported per wall-clock second and per CPU second of this process (``process_time``):
on a machine shared with other work the wall-clock figure swings with their load, the CPU-time one
much less (with ``--threads 1`` especially). Last, telemetry's own time per step (``EngineSource.record``
timed directly) is the cost itself, free of run-to-run noise.

``MODES`` lists what is compared: a name, whether the engine records, and an optional
``attach(engine)`` called before each timed run that returns a ``detach()``. "telemetry on" records
everything a step has (the records, the page map, wait reasons, GC time, the prompts' token ids that
``kvscope explain`` reads: none of these can be turned off); "everything on" adds ``--capture-slow``
armed (``Engine.capture_slow``: the run's own step model judges every step) with a rule no step meets
(1000x its prediction and 10 s over), so the per-step check runs and no profiler window opens; the
run fails if one did. The last mode attaches the live dashboard headless
(``kvscope.widgets.dashboard.attach_headless``): its update thread ticks at the default rate and
serializes every tick's Bokeh patch as a browser would be sent it.

"Before" and "after" in one process: "telemetry on" is the tree before ``--capture-slow``, "everything
on" the tree with it armed; the direct figures (thread CPU time of the recorder, and of the capture's
check, per step, as a share of the step's) are the costs themselves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from harness import add_omp_wait_option, build_model, make_workload, set_omp_wait
from systems import KvscopeSystem

from kvscope import Engine
from kvscope.runs.workload.items import WorkItem


@dataclass(slots=True)
class Mode:
    name: str
    telemetry: bool
    attach: Callable[[Engine], Callable[[], None]] | None = None


def arm_capture(engine: Engine) -> Callable[[], None]:
    """``--capture-slow 5`` armed with a rule no step meets: the check runs on every step, no window opens."""
    capture = engine.capture_slow(5, ratio=1000.0, min_excess_s=10.0)

    def detach() -> None:
        capture.stop()
        if capture.windows or capture.error:
            raise RuntimeError(f"--capture-slow opened a window in the overhead benchmark: {capture.describe()}")

    return detach


EVERYTHING = "everything on (+ --capture-slow armed)"
MODES: list[Mode] = [Mode("telemetry off", False), Mode("telemetry on", True), Mode(EVERYTHING, True, arm_capture)]

try:  # the live dashboard's update code, ticking on its own thread with no browser (kvscope.widgets)
    from kvscope.widgets.dashboard import attach_headless

    MODES.append(Mode("live dashboard attached (headless)", True, attach=attach_headless))
except ImportError:  # pragma: no cover - bokeh / ipywidgets missing
    pass


def make_engines(model: torch.nn.Module, work: list[WorkItem], block_size: int) -> dict[str, Engine]:
    """One engine per mode, all over one shared model, configured as the throughput benchmark's
    (``systems.KvscopeSystem``: a pool that holds the whole workload, 1024-token budget, 64 sequences)."""
    kwargs = KvscopeSystem(model, work, block_size).kwargs
    return {m.name: Engine(model, telemetry=m.telemetry, **kwargs) for m in MODES}


def run_once(engine: Engine, mode: Mode, work: list[WorkItem]) -> tuple[float, float]:
    """Output tokens per wall-clock second and per CPU second of one full workload."""
    if engine.recorder is not None:
        engine.recorder.clear()
    engine.pool.reset_prefix_cache()  # else every repeat after the first finds its prompts cached
    detach = mode.attach(engine) if mode.attach else None
    try:
        start, cpu = time.perf_counter(), time.process_time()
        outs = engine.generate([w.prompt for w in work], [w.params for w in work])
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        if detach:
            detach()
    tokens = sum(len(o.token_ids) for o in outs)
    assert tokens == sum(w.params.max_tokens for w in work)
    return tokens / elapsed, tokens / cpu


def recorder_cost(engine: Engine, work: list[WorkItem]) -> tuple[float, float, float, float]:
    """(recorder CPU microseconds per step, its share of the steps' CPU time, and the same two for the
    ``--capture-slow`` check alone) over one untimed run with the capture armed as in "everything on".

    Thread CPU time (``thread_time_ns``) of ``EngineSource.record`` (the step's batch summary and counters, and
    ``Recorder.record_step``, whose subscribers include the capture's check) and of ``Engine.step``: unlike wall
    time it does not count the moments another process held the core. With several torch threads the step's
    worker-thread time is left out, which overstates the share (a safe error).
    """
    recorder = engine.recorder
    if recorder is None:
        raise ValueError("recorder_cost needs an engine with telemetry on")
    in_record: list[int] = []
    in_step: list[int] = []
    in_check: list[int] = []
    record_step, step = engine.source.record, engine.step
    capture = engine.capture_slow(5, ratio=1000.0, min_excess_s=10.0)
    check = capture._on_record  # the capture's subscriber, timed in its place

    def timed_check(item):
        t = time.thread_time_ns()
        check(item)
        in_check.append(time.thread_time_ns() - t)

    recorder.subscribers[recorder.subscribers.index(check)] = timed_check

    def timed_record(*args, **kwargs):
        t = time.thread_time_ns()
        out = record_step(*args, **kwargs)
        in_record.append(time.thread_time_ns() - t)
        return out

    def timed_step():
        t = time.thread_time_ns()
        out = step()
        in_step.append(time.thread_time_ns() - t)
        return out

    recorder.clear()
    engine.pool.reset_prefix_cache()
    engine.source.record, engine.step = timed_record, timed_step
    try:
        engine.generate([w.prompt for w in work], [w.params for w in work])
    finally:
        del engine.source.record, engine.step
        recorder.subscribers.remove(timed_check)
        capture.stop()
    assert not capture.windows, "the capture opened a window"
    n, step_ns = len(in_record), sum(in_step)
    return sum(in_record) / n / 1e3, sum(in_record) / step_ns, sum(in_check) / n / 1e3, sum(in_check) / step_ns


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model",
        default="llama-60m",
        help="'llama-60m' (random 56M Llama), 'llama-quick', 'tiny', 'smollm2' or a path",
    )
    ap.add_argument(
        "--quick", action="store_true", help="12 requests, shorter prompts and outputs, 3 repeats"
    )
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", default=None, help="write the results here")
    add_omp_wait_option(ap)
    args = ap.parse_args(argv)
    set_omp_wait(args.omp_wait)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = args.requests or (12 if args.quick else 48)
    repeats = args.repeats or (3 if args.quick else 5)
    prompt_len, output_len = ((16, 64), (8, 32)) if args.quick else ((16, 256), (8, 128))

    model, _ = build_model(args.model)
    work = make_workload(model, n, prompt_len, output_len, seed=0)
    engines = make_engines(model, work, args.block_size)
    warm = make_workload(model, 4, (8, 32), (4, 8), seed=1)
    modes = {m.name: m for m in MODES}
    for name, engine in engines.items():
        run_once(engine, modes[name], warm)

    wall: dict[str, list[float]] = {m.name: [] for m in MODES}
    cpu: dict[str, list[float]] = {m.name: [] for m in MODES}
    for r in range(repeats):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            w, c = run_once(engines[mode.name], mode, work)
            wall[mode.name].append(w)
            cpu[mode.name].append(c)
            print(
                f"repeat {r + 1}/{repeats} {mode.name:40s} {w:8.1f} tok/s {c:8.1f} tok/CPU-s", file=sys.stderr
            )

    off = MODES[0].name
    record_us, record_share, check_us, check_share = recorder_cost(engines["telemetry on"], work)
    modes = {}
    for name in wall:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        modes[name] = {
            "median_tok_s": w,
            "median_tok_cpu_s": c,
            "ratio_to_off": w / statistics.median(wall[off]),
            "cpu_ratio_to_off": c / statistics.median(cpu[off]),
            # per-repeat ratio to the off run beside it, then the median: robust to slow drift
            "paired_ratio_to_off": statistics.median(x / y for x, y in zip(wall[name], wall[off])),
            "paired_cpu_ratio_to_off": statistics.median(x / y for x, y in zip(cpu[name], cpu[off])),
            "runs_tok_s": wall[name],
            "runs_tok_cpu_s": cpu[name],
        }
    report = {
        "model": args.model,
        "requests": n,
        "output_tokens": sum(w.params.max_tokens for w in work),
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "modes": modes,
        "record_step_cpu_us": record_us,
        "record_share_of_step_cpu": record_share,
        "capture_check_cpu_us": check_us,
        "capture_check_share_of_step_cpu": check_share,
    }
    print(
        f"\nmodel {args.model}, {n} requests, {report['output_tokens']} output tokens, {repeats} interleaved "
        f"repeats, {report['threads']} threads"
    )
    print(
        f"{'mode':40s} {'tok/s':>9s} {'vs off':>7s} {'paired':>7s} {'tok/CPU-s':>10s} {'vs off':>7s} {'paired':>7s}"
    )
    for name, row in modes.items():
        print(
            f"{name:40s} {row['median_tok_s']:9.1f} {row['ratio_to_off']:7.3f} {row['paired_ratio_to_off']:7.3f} "
            f"{row['median_tok_cpu_s']:10.1f} {row['cpu_ratio_to_off']:7.3f} {row['paired_cpu_ratio_to_off']:7.3f}"
        )
    on, every = modes["telemetry on"], modes[EVERYTHING]
    print(f"RATIO everything on / telemetry on: {every['median_tok_cpu_s'] / on['median_tok_cpu_s']:.3f} "
          f"(tok/CPU-s; paired vs off: {on['paired_cpu_ratio_to_off']:.3f} before, "
          f"{every['paired_cpu_ratio_to_off']:.3f} after)")
    print(f"capture-slow check: {check_us:.1f} us CPU per step = {100 * check_share:.3f}% of the steps' CPU time")
    print(f"recorder: {record_us:.0f} us CPU per step = {100 * record_share:.2f}% of the steps' CPU time "
          "(with the capture's check)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
