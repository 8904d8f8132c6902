"""KV memory: kvscope's paged pool against a static max-length reservation, same requests, same budget.

    python benchmarks/memory.py              # ~56M-param random Llama; the short workload and avg-512 one
    python benchmarks/memory.py --quick      # a tiny model and workloads (the smoke test runs this)

For each workload one real engine run (greedy, EOS ignored) under a KV budget of ``--static-seqs``
max-length sequences: what a static allocator that reserves ``max_model_len`` slots per sequence (a
padded ``[batch, max_len]`` cache, as ``generate`` with a static cache does) could run at most that
many requests at once; the paged pool admits as many as the pages they actually fill allow. Every
figure comes from the engine's telemetry (``engine.recorder.steps[i].kv``, a ``KVState`` after each
step), over the steps where requests were running:

- KV in use: ``paged_bytes`` (pages held) against ``static_reservation_bytes`` (running requests x
  ``max_model_len`` x KV bytes per token) and against a reservation of each running request's own
  final length (prompt + max_tokens: the best a static allocator that knows every ``max_tokens`` does);
- waste: allocated but unfilled slots, ``1 - tokens_stored / slots allocated``: the paged pool's
  partly filled last pages (``fragmentation``) against the reservations' unfilled tails;
- concurrency: how many requests the budget holds at once, budget / mean slots a running request
  holds in the pool (and the peak measured in the run, which a small workload caps), against the
  static allocator's fixed ``--static-seqs``.
"""

from __future__ import annotations

import argparse
import sys

import torch
from harness import add_omp_wait_option, build_model, machine_line, make_workload, median, set_omp_wait, table

from kvscope import Engine
from kvscope.engine.config import cdiv
from kvscope.runs.workload.items import WorkItem, parse_range

WORKLOADS = {  # name: (requests, prompt range, output range); "avg512": mean final length 384 + 128
    "short": (48, "16-256", "8-128"),
    "avg512": (48, "256-512", "64-192"),
}
QUICK = {"short": (12, "8-48", "4-16"), "avg512": (12, "64-128", "16-48")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-60m", help="llama-60m (default), llama-quick, tiny, smollm2, a folder")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=2048, help="the static reservation per sequence")
    p.add_argument("--static-seqs", type=int, default=4,
                   help="KV budget = this many max-length sequences (what the static allocator can run at once)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="kvscope's cap on running requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="tiny model, small workloads, max_model_len 256")
    add_omp_wait_option(p)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.max_model_len, args.static_seqs = "llama-quick", 256, 4
    return args


def measure(model: torch.nn.Module, items: list[WorkItem], args: argparse.Namespace) -> dict:
    bs = args.block_size
    budget_tokens = args.static_seqs * args.max_model_len
    engine = Engine(model, block_size=bs, num_blocks=cdiv(budget_tokens, bs), max_model_len=args.max_model_len,
                    max_num_seqs=args.max_num_seqs, max_num_batched_tokens=1024)
    outs = engine.generate([i.prompt for i in items], [i.params for i in items])
    assert all(len(o.token_ids) == i.params.max_tokens for o, i in zip(outs, items)), "a request fell short"
    per_token = engine.spec.kv_bytes_per_token
    final_len = {o.request_id: len(o.prompt_token_ids) + len(o.token_ids) for o in outs}
    steps = [s for s in engine.recorder.steps if s.kv.blocks_used > 0]
    paged = [s.kv.paged_bytes for s in steps]
    static = [s.kv.static_reservation_bytes for s in steps]
    # Reservation of each running request's own final length. ``scheduled`` lists every running request
    # unless the step's token budget was exhausted first; then this undercounts (kinder to static).
    own = [sum(final_len[i.request_id] for i in s.scheduled) * per_token for s in steps]
    stored = [s.kv.tokens_stored * per_token for s in steps]
    running = [s.num_running + s.num_finished for s in steps]  # requests that held KV during the step
    # Slots the pool gives a running request on average: the budget holds budget / that many at once.
    slots_per_request = sum(s.kv.blocks_used * bs / n for s, n in zip(steps, running) if n) / len(steps)
    return dict(
        requests=len(items), steps=len(steps), kv_per_token=per_token, budget=budget_tokens * per_token,
        mean_len=sum(final_len.values()) / len(final_len),
        paged_peak=max(paged), paged_mean=sum(paged) / len(paged),
        static_peak=max(static), static_mean=sum(static) / len(static),
        own_peak=max(own), own_mean=sum(own) / len(own),
        waste_paged=1 - sum(stored) / sum(paged), waste_paged_median=median([s.kv.fragmentation for s in steps]),
        waste_static=1 - sum(stored) / sum(static), waste_own=1 - sum(stored) / sum(own),
        capacity=budget_tokens / slots_per_request, conc_peak=max(running),
        preemptions=sum(s.num_preempted for s in steps),
    )


def mib(x: float) -> str:
    return f"{x / 2**20:.1f}"


def peak_mean(result: dict, key: str) -> str:
    """``result``'s ``{key}_peak / {key}_mean`` in MiB."""
    return f"{mib(result[key + '_peak'])} / {mib(result[key + '_mean'])}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_omp_wait(args.omp_wait)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, desc = build_model(args.model, args.seed)
    workloads = QUICK if args.quick else WORKLOADS
    print(f"model: {desc}")
    print(f"machine: {machine_line()}")
    print(f"block size {args.block_size}; static reservation: max_model_len {args.max_model_len} slots per sequence; "
          f"KV budget: {args.static_seqs} such sequences")
    results = {}
    with torch.inference_mode():
        for name, (n, prompt_len, output_len) in workloads.items():
            items = make_workload(model, n, parse_range(prompt_len), parse_range(output_len), args.seed)
            results[name] = r = measure(model, items, args)
            print(f"  {name}: {n} requests, prompts {prompt_len}, outputs {output_len}: mean final length "
                  f"{r['mean_len']:.0f} tokens, {r['steps']} steps, {r['preemptions']} preemptions", flush=True)
    names = list(results)
    rows = [
        ["KV budget (MiB)", *(mib(results[k]["budget"]) for k in names)],
        ["paged pool in use, peak / mean (MiB)", *(peak_mean(results[k], "paged") for k in names)],
        ["static max-length reservation of the same requests, peak / mean (MiB)",
         *(peak_mean(results[k], "static") for k in names)],
        ["reservation of prompt + max_tokens, peak / mean (MiB)", *(peak_mean(results[k], "own") for k in names)],
        ["waste: paged (unfilled slots / allocated)", *(f"{results[k]['waste_paged']:.2%}" for k in names)],
        ["waste: paged, median over steps", *(f"{results[k]['waste_paged_median']:.2%}" for k in names)],
        ["waste: static max-length", *(f"{results[k]['waste_static']:.2%}" for k in names)],
        ["waste: prompt + max_tokens reservation", *(f"{results[k]['waste_own']:.2%}" for k in names)],
        ["concurrency the budget holds: paged (budget / mean slots per request)",
         *(f"{results[k]['capacity']:.1f}" for k in names)],
        ["concurrency: paged, measured peak",
         *(f"{results[k]['conc_peak']} of {results[k]['requests']}" for k in names)],
        ["concurrency the budget holds: static max-length", *(str(args.static_seqs) for _ in names)],
    ]
    print()
    print(table(["", *names], rows))
    print("\nratios (paged vs static max-length reservation, same requests, same KV budget):")
    for k in names:
        r = results[k]
        print(f"RATIO {k}: static/paged KV bytes (mean) = {r['static_mean'] / r['paged_mean']:.1f}x; "
              f"concurrency paged/static = {r['capacity'] / args.static_seqs:.1f}x; "
              f"paged waste = {r['waste_paged']:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
