"""How close a simulation comes to the real engine (issue 22), and how fast it runs.

Calibrate on one real run (smollm2 by default), then for each case run the real engine and simulate the same
requests (a replay of the real run's files) under the case's settings: the schedule (steps, preemptions,
prefix-cache hits, peak blocks) must be identical; the table prints the errors of TTFT p50, ITL p50, duration
and throughput. Then the simulator's own speed: simulated requests per second at up to 256 running.

    python benchmarks/simulate.py            # the error table (smollm2; --model tiny) and the speed
    python benchmarks/simulate.py --scale N  # also one simulation of N requests (10**6: minutes), its memory

The speed run's default 60 req/s is about twice what the roofline A100 serves (~28 req/s), so 256 run at all
times and the queue grows (memory with it: every waiting request holds its prompt); ``--rate 25`` keeps up.
Past two of its recorder's windows, a simulation records the steps the window drops light (telemetry/detail.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

from kvscope.engine.config import EngineConfig
from kvscope.engine.engine import Engine
from kvscope.planning.gpus import find_gpu
from kvscope.runs.background.live import LiveRun
from kvscope.runs.result.run import load
from kvscope.runs.workload.items import iter_synthetic_workload, synthetic_workload, with_arrivals
from kvscope.runs.workload.recorded import replay_workload
from kvscope.sim.build import simulated_engine
from kvscope.sim.calibrate import describe_fit, fit_step_model
from kvscope.sim.roofline import RooflineModel
from kvscope.sim.shape import resolve_shape, shape_of_run

SPECIAL = (0, 1, 2)
CASES = {  # name: (engine settings, workload seed, prompt lengths, output lengths, shared prefix, rate)
    "another seed": (dict(num_blocks=256, max_num_seqs=16), 11, (16, 128), (16, 64), 0, None),
    "block size 32": (dict(block_size=32, num_blocks=64, max_num_seqs=16), 12, (16, 128), (16, 64), 0, None),
    "small pool (preempts)": (dict(num_blocks=48, max_num_seqs=16), 13, (32, 160), (16, 64), 0, None),
    "shared prefix": (dict(num_blocks=256, max_num_seqs=16), 14, (16, 64), (16, 64), 96, None),
    "Poisson 40 req/s": (dict(num_blocks=256, max_num_seqs=16), 15, (16, 128), (16, 64), 0, 40.0),
}
KEYS = ("ttft_p50_s", "itl_p50_s", "duration_s", "output_tokens_per_s")
SCHEDULE = ("steps", "preemptions", "prefix_cache_hits", "peak_running")


def run_live(engine, items):
    live = LiveRun(engine, items, dashboard=False).start()
    live.wait()
    return live.run


def workload(seed, prompt, output, prefix, rate, n=64):
    items = synthetic_workload(n, prompt, output, vocab_size=512, shared_prefix_len=prefix, seed=seed,
                               exclude_ids=SPECIAL)
    return with_arrivals(items, rate, seed=seed)


def accuracy(folder: Path, cases: list[str], model_name: str = "tiny") -> None:
    calib = run_live(Engine(model_name, num_blocks=256, max_num_seqs=16),
                     workload(1, (16, 160), (8, 64), 32, None, 96))
    model = fit_step_model(calib.records, 16, "calibration run")
    print(describe_fit(model), "\n")
    print(f"{'case':<22} {'schedule':<10} " + " ".join(f"{k:>20}" for k in KEYS))
    for name in cases:
        cfg, seed, prompt, output, prefix, rate = CASES[name]
        real = run_live(Engine(model_name, **cfg), workload(seed, prompt, output, prefix, rate))
        path = real.save_metrics(folder / f"{seed}.metrics.jsonl")
        recorded = load(path)
        sim = run_live(simulated_engine(shape_of_run(recorded.meta), EngineConfig(**cfg), model),
                       replay_workload(recorded))
        r, s = real.summary(), sim.summary()
        same = "identical" if all(r[k] == s[k] for k in SCHEDULE) else "DIFFERS"
        errors = " ".join(f"{(s[k] / r[k] - 1):>+19.1%} " for k in KEYS)
        print(f"{name:<22} {same:<10} {errors}")


def speed(n: int, rate: float) -> None:
    """Simulated requests per second with up to 256 running (a roofline: the A100 example's shape)."""
    shape = resolve_shape("llama-7b", "bfloat16")
    spec = shape.spec
    model = RooflineModel(find_gpu("a100-80gb"), spec.num_params, spec.dtype_bytes, spec.num_layers, spec.num_heads,
                          spec.head_dim, spec.kv_bytes_per_token)
    cfg = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=2048,
                       kv_cache_memory=60 << 30)
    engine = simulated_engine(shape, cfg, model)
    items = with_arrivals(iter_synthetic_workload(n, (64, 512), (32, 256), vocab_size=32000, seed=0), rate)
    live = LiveRun(engine, items, dashboard=False, keep_outputs=False, total_requests=n)
    t0, cpu0 = time.perf_counter(), time.process_time()
    live.start().wait()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0  # CPU time: steady on a shared machine
    s = live.run.summary()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\n{n:,} requests at {rate:g} req/s: {wall:.1f} s wall, {n / wall:,.0f} simulated requests/s; "
          f"{cpu:.1f} CPU s, {n / cpu:,.0f} per CPU second (load average {os.getloadavg()[0]:.1f}); "
          f"{s['steps']:,} steps, peak {s['peak_running']} running, {s['duration_s']:,.0f} virtual s; "
          f"peak RSS {peak:,.0f} MiB; summary counts {s['requests']:,} requests, {s['output_tokens']:,} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=20_000, help="requests in the speed run (default 20000)")
    parser.add_argument("--rate", type=float, default=60.0, help="their arrival rate (default 60/s)")
    parser.add_argument("--model", default=None, help="the real engine's model (default smollm2, whose forward pass"
                        " dominates a step; tiny with --quick: a 3-4 ms step, mostly Python, noisy)")
    parser.add_argument("--quick", action="store_true", help="two cases and 500 requests (a smoke test)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        accuracy(Path(folder), ["small pool (preempts)", "shared prefix"] if args.quick else list(CASES),
                 args.model or ("tiny" if args.quick else "smollm2"))
    speed(500 if args.quick else args.scale, args.rate)


if __name__ == "__main__":
    main()
