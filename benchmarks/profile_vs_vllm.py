"""Where the time goes, kvscope against vLLM, on the throughput benchmark's workload.

    python benchmarks/profile_vs_vllm.py                 # 56M Llama, 48 requests, ~3 minutes
    python benchmarks/profile_vs_vllm.py --threads 1 --top 30

Both systems run the same workload once under ``torch.profiler`` (vLLM's own profiler, in its engine
process: ``vllm_peer.py``'s ``profile`` command), after a warm-up. Each Chrome trace is read the same
way (``self_times``): per thread, an op's self time is its duration minus that of the ops nested in it.
Printed per system: the ops by self time, the same time by category (GEMM, attention, elementwise,
copies and gathers, sampling, other), and the share of the busiest thread's wall time that no op
covers (Python: the scheduler, the model's modules, the engine loop).
``flop_gap.py`` reads kvscope's trace the same way to split the gap between its FLOP rate and the GEMM peak.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from harness import build_model, make_workload
from systems import KvscopeSystem, VllmSystem, save_model, vllm_python
from torch.profiler import ProfilerActivity, profile

CATEGORIES = (  # first match wins; names lower-cased
    ("gemm", ("linear", "addmm", "aten::mm", "matmul", "gemm", "onednn", "mkldnn")),
    ("attention", ("attention", "attn", "softmax", "bmm", "baddbmm", "paged")),
    ("copies / gathers", ("index_select", "index_copy", "copy_", "cat", "gather", "scatter", "reshape_and_cache",
                          "contiguous", "clone", "to_copy", "fill_", "zero_")),
    ("sampling", ("argmax", "sort", "topk", "multinomial", "sample")),
    ("elementwise", ("mul", "add", "silu", "pow", "rsqrt", "mean", "neg", "sub", "div", "exp", "rms", "rotary",
                     "act_and_mul", "embedding")),
)


def category(name: str) -> str:
    low = name.lower()
    return next((c for c, words in CATEGORIES if any(w in low for w in words)), "other")


def self_times(trace: dict) -> tuple[dict[str, float], float, float]:
    """(self µs per op name, covered µs, span µs) of the thread with the most op time in ``trace``."""
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "kernel", "cuda_runtime") and "dur" in e:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    best: tuple[dict[str, float], float, float] = ({}, 0.0, 0.0)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        own: dict[str, float] = defaultdict(float)
        stack: list[tuple[float, str]] = []  # (end, name) of the open ops
        covered = 0.0
        for e in events:
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                own[stack[-1][1]] -= e["dur"]  # nested: not its parent's own time
            else:
                covered += e["dur"]
            own[e["name"]] += e["dur"]
            stack.append((end, e["name"]))
        span = events[-1]["ts"] + events[-1]["dur"] - events[0]["ts"] if events else 0.0
        if sum(own.values()) > sum(best[0].values()):
            best = (dict(own), covered, span)
    return best


def report(name: str, trace: dict, wall_s: float, tokens: int, top: int) -> None:
    own, covered, span = self_times(trace)
    total = sum(own.values())
    print(f"\n## {name}: {tokens} tokens in {wall_s:.2f} s ({tokens / wall_s:.0f} tok/s under the profiler); "
          f"op self time {total / 1e6:.2f} s on its busiest thread, {1 - covered / span:.0%} of that thread's "
          f"{span / 1e6:.2f} s outside any op (Python)")
    cats: dict[str, float] = defaultdict(float)
    for op, t in own.items():
        cats[category(op)] += t
    print("| category | self s | share |\n| --- | ---: | ---: |")
    for c, t in sorted(cats.items(), key=lambda kv: -kv[1]):
        print(f"| {c} | {t / 1e6:.2f} | {t / total:.0%} |")
    print("| op | self s | share | category |\n| --- | ---: | ---: | --- |")
    for op, t in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| `{op[:60]}` | {t / 1e6:.3f} | {t / total:.1%} | {category(op)} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-60m")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--threads", type=int, default=None, help="kvscope's intra-op threads (default: torch's)")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--no-vllm", action="store_true", help="profile kvscope only")
    p.add_argument("--quick", action="store_true", help="llama-quick and 8 requests, kvscope only (the smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.requests, args.no_vllm = "llama-quick", 8, True
    if args.threads:
        torch.set_num_threads(args.threads)
    model, label = build_model(args.model)
    items = make_workload(model, args.requests, (16, 256), (8, 128), 0)
    print(f"model {label}; {args.requests} requests; kvscope threads {torch.get_num_threads()}")

    kv = KvscopeSystem(model, items)
    kv.run(items)  # warm-up
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            result = kv.run(items)
            wall = time.perf_counter() - t0
        path = Path(tmp) / "kvscope.json"
        prof.export_chrome_trace(str(path))
        report("kvscope", json.loads(path.read_text()), wall, result.output_tokens, args.top)
        steps = list(kv.engine.recorder.steps)
        phases = {k: sum(getattr(s, f"{k}_ns") for s in steps) / 1e9
                  for k in ("schedule", "prepare", "forward", "sample", "update")}
        print(f"kvscope per step ({len(steps)} steps), seconds: "
              + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))

        if args.no_vllm:
            return 0
        if vllm_python() is None:
            print("vllm: skipped, no vLLM virtualenv (make one with `.ci/vllm-env`)")
            return 0
        folder = Path(tmp) / "model"
        vllm = VllmSystem(save_model(model, folder), items, profile_dir=str(Path(tmp) / "vllm-trace"))
        try:
            vllm.start()
            vllm.run(items)  # warm-up
            vllm.command(cmd="profile", on=True)
            result = vllm.run(items)
            vllm.command(cmd="profile", on=False)
        finally:
            vllm.close()
        traces = sorted((Path(tmp) / "vllm-trace").rglob("*.json"), key=lambda f: f.stat().st_size)
        if not traces:
            print(f"vllm: no trace was written (log: {vllm.log})")
            return 1
        report(f"vLLM {vllm.info.get('version', '')}", json.loads(traces[-1].read_text()), result.wall_s,
               result.output_tokens, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
