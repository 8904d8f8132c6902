"""Where the gap between kvscope's FLOP rate and this CPU's GEMM peak goes (issue 39, item 4).

    python benchmarks/flop_gap.py                  # llama-60m, 48 requests, 1 thread: ~1.5 minutes on 2 cores
    python benchmarks/flop_gap.py --threads 2 --requests 24
    python benchmarks/flop_gap.py --quick          # llama-quick, 8 requests (the smoke test)

On the throughput benchmark's workload (``harness.build_model`` / ``make_workload``, ``KvscopeSystem``), at
``--threads`` intra-op threads (pinned with ``torch.set_num_threads``; ``KVSCOPE_THREAD_POLICY=fixed`` so the
engine's thread policy changes nothing), after a warm-up run:

1. one run unprofiled (wall and CPU seconds, and the per-step phases kvscope records itself: schedule, prepare,
   forward, sample, update, summed over the run's ``StepRecord``s), then one under ``torch.profiler``, read
   with ``profile_vs_vllm.self_times`` / ``category`` (self time per op on the busiest thread);
2. the workload's FLOPs and the GEMM peak at the same threads (``flops.workload_flops`` / ``gemm_peak``);
3. the split (``gap_split``): the ideal time (every FLOP at the GEMM peak), then each category's excess over its
   share of that ideal: the GEMMs' time beyond their FLOPs at the peak (their own efficiency), attention's the
   same, elementwise / copies / sampling / other ops in full, and the time no op covers (Python: the scheduler,
   the input preparation, the model's modules, the loop). The profiled run is slower than the unprofiled one (the
   profiler costs a few µs per op); every profiled time is scaled by unprofiled wall / profiled wall, i.e. the
   profiler's cost is assumed spread in proportion to the time. The parts then add up to the unprofiled wall;
4. the GEMM rate at the run's own shapes: each distinct linear of the model (merged q/k/v and gate/up as the
   engine runs them) through the engine's GEMM (``fusion.FusedLinears``: oneDNN on prepacked weights when that
   is what ``linear_backend`` resolves to) and through plain ``torch.mm``, at decode-sized row counts and a
   prefill chunk; and from those, interpolated over the run's own steps (rows = tokens computed per step, the
   head's rows = tokens sampled), the GEMM time this workload needs at the best rate its shapes allow: the FLOP
   rate physically reachable here, against the square-matrix peak.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from flops import WorkloadFlops, gemm_peak, workload_flops
from harness import build_model, machine_line, make_workload
from profile_vs_vllm import CATEGORIES, category, self_times
from systems import KvscopeSystem
from torch.profiler import ProfilerActivity, profile

from kvscope import Engine
from kvscope.engine.worker.fusion import FusedLinears, resolve_linear_backend
from kvscope.runs.workload.items import parse_range

PHASES = ("schedule", "prepare", "forward", "sample", "update")
ROWS = (1, 8, 32, 48, 64, 128, 256)  # decode batch sizes; the prefill chunk (--max-num-batched-tokens) is added


@dataclass(slots=True, frozen=True)
class GapPart:
    name: str
    seconds: float  # on the unprofiled run's scale
    note: str = ""


def gap_split(work: WorkloadFlops, peak: float, wall_s: float, profiled_wall_s: float,
              op_seconds: dict[str, float]) -> tuple[float, list[GapPart]]:
    """(the ideal seconds, the parts of the gap ``wall_s - ideal``) from the profiled run's self seconds per
    category (``op_seconds``, keys ``category()``'s names), each scaled by ``wall_s / profiled_wall_s``. The
    GEMMs' and attention's parts are their time beyond their own FLOPs at ``peak``; the last part is the profiled
    wall that no op covers. The parts add up to ``wall_s - ideal`` exactly."""
    if wall_s <= 0 or profiled_wall_s <= 0 or peak <= 0:
        raise ValueError(f"wall times and peak must be positive (got {wall_s}, {profiled_wall_s}, {peak})")
    unknown = set(op_seconds) - {c for c, _ in CATEGORIES} - {"other"}
    if unknown:
        raise ValueError(f"unknown categories {sorted(unknown)}: use profile_vs_vllm.category()'s names")
    scale = wall_s / profiled_wall_s
    t = {c: scale * s for c, s in op_seconds.items()}
    gemm_flops = work.linear + work.head
    parts = []
    gemm = t.get("gemm", 0.0)
    rate = f"{gemm_flops / gemm / 1e9:.1f} GFLOP/s = {100 * gemm_flops / gemm / peak:.0f}% of peak" if gemm else ""
    parts.append(GapPart("GEMMs beyond their FLOPs at peak", gemm - gemm_flops / peak,
                         f"{gemm:.2f} s of GEMMs at {rate}" if gemm else "no GEMM ops"))
    attn = t.get("attention", 0.0)
    parts.append(GapPart("attention beyond its FLOPs at peak", attn - work.attention / peak,
                         f"{attn:.2f} s of attention ops" + (f" at {work.attention / attn / 1e9:.1f} GFLOP/s"
                                                             if attn else "")))
    for c in ("elementwise", "copies / gathers", "sampling", "other"):
        parts.append(GapPart(f"{c} ops", t.get(c, 0.0), "no counted FLOPs"))
    uncovered = scale * (profiled_wall_s - sum(op_seconds.values()))
    parts.append(GapPart("no op (Python: scheduler, prepare, modules, loop)", uncovered,
                         f"{100 * (1 - sum(op_seconds.values()) / profiled_wall_s):.0f}% of the profiled wall"))
    return work.total / peak, parts


def gap_table(ideal: float, parts: Sequence[GapPart], wall_s: float) -> str:
    gap = wall_s - ideal
    lines = ["| part | s | share of the gap | note |", "| --- | ---: | ---: | --- |",
             f"| ideal: every FLOP at the GEMM peak | {ideal:.2f} | – | {100 * ideal / wall_s:.0f}% of the wall |"]
    lines += [f"| {p.name} | {p.seconds:.2f} | {100 * p.seconds / gap:.0f}% | {p.note} |" for p in parts]
    lines.append(f"| the run's wall (unprofiled) | {wall_s:.2f} | gap {gap:.2f} s | |")
    return "\n".join(lines)


def _best_seconds(fn, min_s: float = 0.03, tries: int = 3) -> float:
    """The best per-call seconds of ``fn`` over ``tries`` timed batches of at least ``min_s`` each."""
    fn()
    fn()
    n, best = 1, float("inf")
    for _ in range(tries):
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = time.perf_counter() - t0
            if dt >= min_s:
                break
            n *= 2
        best = min(best, dt / n)
    return best


def shape_times(model: torch.nn.Module, backend: str, rows: Sequence[int]) -> list[dict]:
    """Per distinct linear GEMM of ``model`` as the engine runs it: its label, in, out, how many the model has,
    and per row count its seconds through the engine's GEMM and through ``torch.mm``."""
    fused = FusedLinears.build(model, backend)
    names = {m: n for n, m in model.named_modules()}
    head = model.get_output_embeddings()
    seen: dict[tuple, dict] = {}
    for linear, (group, index) in fused.members.items():
        if index:
            continue  # one entry per group (its first member)
        kind = "+".join(names[m].rsplit(".", 1)[-1] for m, (g, _) in fused.members.items() if g is group)
        key = (kind, linear.in_features, sum(group.splits))
        if key in seen:
            seen[key]["count"] += 1
            continue
        seen[key] = dict(kind=kind, inp=linear.in_features, out=sum(group.splits), count=1, head=linear is head,
                         group=group)
    with torch.inference_mode():
        for entry in seen.values():
            w = torch.randn(entry["inp"], entry["out"])
            entry["engine"], entry["mm"] = {}, {}
            for r in rows:
                x = torch.randn(r, entry["inp"])
                entry["engine"][r] = _best_seconds(lambda x=x, g=entry["group"]: g.gemm(x))
                entry["mm"][r] = _best_seconds(lambda x=x, w=w: torch.mm(x, w))
            del entry["group"]
    return list(seen.values())


def interp(times: dict[int, float], rows: int) -> float:
    """Seconds at ``rows`` rows, linear between the measured row counts (proportional past the last)."""
    if rows <= 0:
        return 0.0
    known = sorted(times)
    if rows >= known[-1]:
        return times[known[-1]] * rows / known[-1]
    if rows <= known[0]:
        return times[known[0]]
    hi = next(k for k in known if k >= rows)
    lo = max(k for k in known if k <= rows)
    if hi == lo:
        return times[lo]
    return times[lo] + (times[hi] - times[lo]) * (rows - lo) / (hi - lo)


def shapes_report(shapes: list[dict], steps: list, work: WorkloadFlops, peak: float, gemm_run_s: float) -> None:
    rows = sorted(shapes[0]["engine"])
    print(f"\nGEMM rate at the run's shapes (GFLOP/s; engine GEMM / torch.mm; square peak {peak / 1e9:.1f}):")
    print("| linear (x per model) | in x out | " + " | ".join(f"{r} rows" for r in rows) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in rows) + " |")
    for s in shapes:
        cells = [f"{2 * r * s['inp'] * s['out'] / s['engine'][r] / 1e9:.0f} / "
                 f"{2 * r * s['inp'] * s['out'] / s['mm'][r] / 1e9:.0f}" for r in rows]
        print(f"| {s['kind']} (x{s['count']}) | {s['inp']} x {s['out']} | " + " | ".join(cells) + " |")
    need = {"engine": 0.0, "mm": 0.0}
    for st in steps:
        computed, sampled = st.num_prefill_tokens + st.num_decode_tokens, st.num_output_tokens
        for s in shapes:
            n = sampled if s["head"] else computed
            for path in need:
                need[path] += s["count"] * interp(s[path], n)
    gemm_flops = work.linear + work.head
    best = min(need.values())
    print(f"this run's GEMMs at its own shapes ({len(steps)} steps), timed alone: {need['engine']:.2f} s through the "
          f"engine's GEMM, {need['mm']:.2f} s through torch.mm; the faster = {gemm_flops / best / 1e9:.1f} GFLOP/s = "
          f"{100 * gemm_flops / best / peak:.0f}% of the square peak; in the run they took {gemm_run_s:.2f} s "
          f"(scaled): {100 * best / gemm_run_s:.0f}% of the rate their shapes reach alone")
    reach = work.total / (best + work.attention / peak)
    print(f"REACHABLE end-to-end FLOP rate (these GEMMs, attention at peak, nothing else costing) = "
          f"{reach / 1e9:.1f} GFLOP/s = {100 * reach / peak:.0f}% of the square GEMM peak")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-60m")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--prompt-len", default="16-256")
    p.add_argument("--output-len", default="8-128")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (pinned)")
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--top", type=int, default=8, help="ops to list by self time")
    p.add_argument("--quick", action="store_true", help="llama-quick and 8 requests (the smoke test)")
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads must be at least 1 (got {args.threads})")
    if args.quick:
        args.model, args.requests, args.prompt_len, args.output_len = "llama-quick", 8, "8-48", "4-16"
    os.environ["KVSCOPE_THREAD_POLICY"] = "fixed"  # the engine keeps the threads set here
    torch.set_num_threads(args.threads)
    model, desc = build_model(args.model)
    items = make_workload(model, args.requests, parse_range(args.prompt_len), parse_range(args.output_len), 0)
    print(f"model: {desc}\nworkload: {len(items)} requests, prompts {args.prompt_len}, outputs {args.output_len}; "
          f"{args.threads} threads\nmachine: {machine_line()}")

    kv = KvscopeSystem(model, items, max_num_batched_tokens=args.max_num_batched_tokens)
    with torch.inference_mode():
        kv.run(items)  # warm-up
        result = kv.run(items)
        assert kv.engine is not None
        steps = list(kv.engine.recorder.steps)
        backend = resolve_linear_backend(kv.engine.config.linear_backend, torch.device("cpu"), torch.float32)
        engine = Engine(model, **kv.kwargs)  # built outside the profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            outs = engine.generate([i.prompt for i in items], [i.params for i in items])
            profiled_wall = time.perf_counter() - t0
    same = [o.token_ids for o in outs] == result.tokens
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        own, _covered, _span = self_times(json.loads(path.read_text()))
    op_seconds: dict[str, float] = defaultdict(float)
    for op, us in own.items():
        op_seconds[category(op)] += us / 1e6

    work = workload_flops(model, items)
    peak, _peak_cpu, where = gemm_peak(args.threads)
    torch.set_num_threads(args.threads)
    wall = result.wall_s
    print(f"\nunprofiled: {result.output_tokens} tokens in {wall:.2f} s wall, {result.cpu_s:.2f} CPU-s "
          f"({result.tokens_per_s:.0f} tok/s); profiled: {profiled_wall:.2f} s (x{profiled_wall / wall:.2f}, every "
          f"profiled time below is scaled by {wall / profiled_wall:.3f}); same tokens: {same}")
    phases = {k: sum(getattr(s, f"{k}_ns") for s in steps) / 1e9 for k in PHASES}
    print(f"kvscope per step (unprofiled, {len(steps)} steps), s: "
          + ", ".join(f"{k} {v:.3f}" for k, v in phases.items())
          + f"; outside the steps {wall - sum(phases.values()):.3f}")
    print(f"FLOPs {work.total / 1e9:.1f} G (linear {work.linear / 1e9:.1f}, head {work.head / 1e9:.1f}, attention "
          f"{work.attention / 1e9:.1f}); GEMM peak {peak / 1e9:.1f} GFLOP/s ({where}); FLOP rate "
          f"{work.total / wall / 1e9:.1f} GFLOP/s = {100 * work.total / wall / peak:.0f}% of it")
    ideal, parts = gap_split(work, peak, wall, profiled_wall, dict(op_seconds))
    print("\n" + gap_table(ideal, parts, wall))
    top = sorted(own.items(), key=lambda kv: -kv[1])[:args.top]
    print("top ops by self time (s, scaled): " + "; ".join(
        f"{op} {us / 1e6 * wall / profiled_wall:.2f} ({category(op)})" for op, us in top))

    rows = sorted({*ROWS, args.max_num_batched_tokens})
    shapes = shape_times(model, backend, rows)
    shapes_report(shapes, steps, work, peak, op_seconds.get("gemm", 0.0) * wall / profiled_wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
