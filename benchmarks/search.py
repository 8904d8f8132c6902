"""``kvscope search`` at scale, its speed-up per core, and checked against the real engine (issue 36).

    python benchmarks/search.py scale --configs 64 --requests 1000     # time N configurations (goal: 1,000 x 10**4)
    python benchmarks/search.py speedup --max-workers 16 [--ray]       # configurations per second at 1..N workers
    python benchmarks/search.py real                                    # the real-engine check (smollm2, this CPU)

``scale`` prints the wall time, the load average it ran under and what 1,000 configurations of 10**4 requests would
take at the measured cost per simulated request. ``speedup`` runs one space at 1, 2, 4, ... workers (local processes,
or an embedded Ray with ``--ray``) and prints the speed-up per added core (the goal: >= 0.8). ``real`` calibrates a
step model on one smollm2 run, searches a small space under an SLO, then runs kvscope's real engine at the best
configuration and at two the search rejected, at the goodput rate the search predicted for the best: the best must
meet the SLO and the rejected must miss it, as predicted.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from kvscope.runs.setup.simulated import SimSpec
from kvscope.runs.setup.spec import RunSpec, WorkloadSpec
from kvscope.search.executors import run_search
from kvscope.search.problem import Bisection, SearchProblem
from kvscope.search.slo import SLO, judge
from kvscope.search.space import SearchSpace
from kvscope.search.table import best, csv_text


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def roofline_problem(requests: int, slo: str = "ttft_p99=0.5,itl_p99=0.05") -> SearchProblem:
    spec = RunSpec(model="llama-7b", workload=WorkloadSpec(requests=requests, prompt_len=(128, 1024),
                                                           output_len=(32, 256)))
    return SearchProblem(spec, SimSpec(gpu="a100"), SLO.parse(slo), Bisection(start=4.0))


def space_of(n: int) -> SearchSpace:
    """A space of about ``n`` configurations (engine settings x replicas)."""
    axes = [("max_num_seqs", [16, 32, 64, 128, 256]), ("block_size", [16, 32]),
            ("max_num_batched_tokens", [512, 1024, 2048, 4096, 8192]), ("replicas", [1, 2, 3, 4]),
            ("chunked_prefill", ["on", "off"]), ("prefix_caching", ["on", "off"]), ("tp", [1, 2, 4])]
    terms, size = [], 1
    for key, values in axes:
        if size >= n:
            break
        take = values[: max(1, min(len(values), -(-n // size)))]
        terms.append(f"{key}={','.join(map(str, take))}")
        size *= len(take)
    return SearchSpace.parse(" ".join(terms))


def cmd_scale(args: argparse.Namespace) -> None:
    problem, space = roofline_problem(args.requests), space_of(args.configs)
    points = list(space.points())[: args.configs]
    before = load()
    t0 = time.perf_counter()
    outs = run_search(problem, points, executor="ray" if args.ray else "processes", workers=args.workers)
    took = time.perf_counter() - t0
    trials = sum(o.trials for o in outs)
    simulated = trials * args.requests
    per_config = took / len(points) * (args.workers or os.cpu_count() or 1)
    print(f"{len(points)} configurations x {args.requests} requests: {took:.1f} s ({trials} trials, "
          f"{sum(o.stopped_early for o in outs)} stopped early; <= {simulated:,} simulated requests); "
          f"{before} -> {load()}")
    scale = 10_000 / args.requests
    print(f"1,000 configurations x 10**4 requests at this cost: ~{1000 * per_config * scale / 3600:.1f} CPU-hours "
          f"(~{1000 * per_config * scale / 3600 / (os.cpu_count() or 1):.1f} h on this machine's "
          f"{os.cpu_count()} cores)")


def cmd_speedup(args: argparse.Namespace) -> None:
    problem, space = roofline_problem(args.requests), space_of(args.configs)
    points = list(space.points())[: args.configs]
    base = None
    workers = 1
    while workers <= args.max_workers:
        t0 = time.perf_counter()
        outs = run_search(problem, points, executor="ray" if args.ray else
                          "sequential" if workers == 1 else "processes", workers=workers)
        took = time.perf_counter() - t0
        base = base or took
        table = csv_text(outs, space.names, problem.slo, None)
        speed = base / took
        print(f"{workers:>3} workers: {took:7.1f} s, speed-up {speed:5.2f} ({speed / workers:.2f} per core); "
              f"table digest {hash(table) & 0xFFFF:04x}; {load()}")
        workers *= 2


def cmd_real(args: argparse.Namespace) -> None:
    """Calibrate on one smollm2 run, search, then run the real engine at the best and two rejected."""
    import torch

    from kvscope.runs.background.live import LiveRun
    from kvscope.runs.setup.prepare import prepare
    from kvscope.sim.calibrate import fit_step_model

    if args.threads:  # fixed for every run: the thread policy would change them as the load changes, and a step
        torch.set_num_threads(args.threads)  # model fitted across those changes mispredicts both
    work = Path(tempfile.mkdtemp(prefix="kvscope-search-"))
    workload = WorkloadSpec(requests=args.requests, prompt_len=(64, 256), output_len=(16, 64))
    spec = RunSpec(model=args.model, workload=workload)
    # calibrated at a bursty rate, so that its batches range from one request to many (an all-at-once run only has
    # full batches, and the line fitted on them mispredicts the small ones a rate makes); another seed than the
    # checked runs' requests
    calib = replace(workload, requests=args.calibrate_requests, rate=args.calibrate_rate, arrival="gamma:2")
    setup = prepare(replace(spec, workload=calib).with_option("seed", 1))
    run = LiveRun(setup.make_engine, setup.workload, **setup.run_options()).start().wait().run
    step = work / "step.json"
    fit_step_model(run.records, setup.config.block_size, "calibration").save(step)
    print(f"calibrated on {args.calibrate_requests} requests at {args.calibrate_rate} req/s (gamma, CV 2); {load()}")
    slo = SLO.parse(args.slo)
    problem = SearchProblem(spec, SimSpec(step_model=str(step)), slo, Bisection(start=0.5, steps=4))
    space = SearchSpace.parse(args.space)
    outs = run_search(problem, list(space.points()), executor="processes")
    chosen = best(outs, "goodput")
    print(csv_text(outs, space.names, slo, chosen))
    if chosen is None:
        print("no configuration met the SLO")
        return
    rate = chosen.goodput
    rejected = sorted((o for o in outs if o is not chosen and o.goodput < rate), key=lambda o: o.goodput)[:2]
    print(f"real engine at {rate:.3g} req/s (the best's predicted goodput):")
    for o in [chosen, *rejected]:
        real = spec.with_option("rate", rate)
        for key, value in zip(o.point.keys, o.point.values):
            if key != "replicas":
                real = real.with_option(key, value)
        s = prepare(real)
        live = LiveRun(s.make_engine, s.workload, **s.run_options()).start().wait().run
        verdict = _judge(live, slo, args.requests)
        predicted = "meets" if o is chosen else "misses"
        got = "meets" if verdict.ok else f"misses ({verdict.broke})"
        said = (f"predicted at this rate {o.percentiles}" if o is chosen else
                f"predicted goodput {o.goodput:.3g} req/s, {o.broke} broke first at {o.broke_at:.3g} req/s")
        print(f"  {o.point.label():<40} predicted {predicted}, real {got}: {verdict.percentiles}; {said}; {load()}")


def _judge(result, slo: SLO, total: int):
    """The real run's per-request TTFT / ITL / E2E from its events, judged as the search judges a trial."""
    first: dict[str, int] = {}
    queued: dict[str, int] = {}
    values: dict[str, list[float]] = {"ttft": [], "itl": [], "e2e": []}
    for e in result.events:
        if e.kind == "queued":
            queued[e.request_id] = e.t_ns
        elif e.kind == "first_token":
            first[e.request_id] = e.t_ns
        elif e.kind == "finished" and e.request_id in first:
            arr, f, n = queued[e.request_id], first[e.request_id], max(e.num_output_tokens, 1)
            values["ttft"].append((f - arr) / 1e9)
            values["e2e"].append((e.t_ns - arr) / 1e9)
            values["itl"].append((e.t_ns - f) / 1e9 / (n - 1) if n > 1 else 0.0)
    return judge(slo, values, total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("scale", "speedup"):
        p = sub.add_parser(name)
        p.add_argument("--configs", type=int, default=16)
        p.add_argument("--requests", type=int, default=1000)
        p.add_argument("--ray", action="store_true")
        if name == "scale":
            p.add_argument("--workers", type=int)
        else:
            p.add_argument("--max-workers", type=int, default=os.cpu_count() or 1)
    p = sub.add_parser("real")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--slo", default="ttft_p90=2,itl_p90=0.2")
    p.add_argument("--space", default="block_size=16,32 max_num_seqs=4,16 max_num_batched_tokens=256,1024")
    p.add_argument("--threads", type=int, default=1, help="torch threads for every run (0: the adaptive policy)")
    p.add_argument("--calibrate-requests", type=int, default=64)
    p.add_argument("--calibrate-rate", type=float, default=1.5)
    args = parser.parse_args()
    {"scale": cmd_scale, "speedup": cmd_speedup, "real": cmd_real}[args.what](args)


if __name__ == "__main__":
    main()
