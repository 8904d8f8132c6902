"""How fast `kvscope simulate --replay WATCH.metrics.jsonl --step-model step.json --engine vllm` replays a long
watched vLLM run (issue 35's goal: a 10^5-request watched run at >= 2,000 simulated requests per CPU second).

No server runs 10^5 requests here, so the watched run is made by tiling a real one (``--from``, a file of
``kvscope watch`` with the plugin: e.g. one that benchmarks/vllm_accuracy.py recorded) until it has N requests:

- copy k of the base run's lines is the base again with every request id suffixed ``~k``, every time
  (events' ``t_ns``, steps' ``t_start_ns`` / ``t_end_ns``) shifted by k x (the base run's span, from its first
  line's time to its last, plus its mean gap between arrivals), and step numbers shifted by k x its steps;
- each copy's prompts differ from every other copy's in their first two tokens (the base's first token plus k and
  its second plus k // V, modulo the vocabulary V of the served model's config.json), so the prefix cache finds in
  copy k only what copy k shares within itself (as in the base run), never an earlier copy's;
- only the last ``MAX_RECORDS`` step records (20,000) are written, as a watch keeps them (its ring,
  ``kvscope.watched.limits``): a replay with ``--step-model`` reads none of them, and 4.5 million of them (a
  10^5-request run of the accuracy suite's calibrate run) would be a 4 GB file no watch writes. A watch's ring
  of events (4 x ``MAX_RECORDS``) would also keep only a 10^5-request run's last ~20,000 requests; this file
  keeps all of them, the run the goal asks for;
- the header is the base's (its ``watch`` with the plugin's ``config``, the server's settings); its poll lanes and
  totals stay the base's (the replay reads neither), and the end line counts the new steps and events.

Without ``--from``, the base is made here without a server: kvscope's simulator under vLLM's rules (a roofline
of an A100 on a tiny Llama saved in the work folder) wrapped in a watched header, and the step model is fitted on
it; that is for the test (tests/benchmarks/test_replay_speed.py), the figures take a real watched run.

The replay runs as a person runs it, ``python -m kvscope simulate --replay FILE --step-model STEP --engine vllm
--model DIR --quiet --out PREFIX`` in a child process (its files written too), and this prints its CPU seconds
(user + system, ``RUSAGE_CHILDREN``), wall seconds, peak RSS, requests per CPU second and per wall second, and
the load average before and after. ``--profile`` runs it in this process under cProfile instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvscope.watched.limits import MAX_RECORDS

ROOT = Path(__file__).resolve().parents[1]
GOAL = 2000.0  # simulated requests per CPU second (issue 35)


def _vocab_size(model: str | None) -> int:
    try:
        return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"]) if model else 32000
    except (OSError, ValueError, KeyError, TypeError):
        return 32000


def _varied(ids: list[int], k: int, vocab_size: int) -> list[int]:
    """Copy ``k``'s prompt: the first token moved by ``k``, the second by ``k // vocab_size`` (so no two of
    ``vocab_size``**2 copies share a first block; a one-token prompt, ``vocab_size`` copies)."""
    ids = list(ids)
    ids[0] = (ids[0] + k) % vocab_size
    if len(ids) > 1:
        ids[1] = (ids[1] + k // vocab_size) % vocab_size
    return ids


def tile(base: Path, out: Path, requests: int, vocab_size: int) -> int:
    """Write ``out``: the watched run ``base`` tiled to ``requests`` requests (the module doc); the count written."""
    header: dict[str, Any] | None = None
    body: list[dict[str, Any]] = []  # events and steps, in the base's order
    with base.open() as f:
        for line in f:
            item = json.loads(line)
            if item.get("type") == "header":
                header = item
            elif item.get("type") in ("event", "step"):
                body.append(item)
    events = [item for item in body if item["type"] == "event"]
    steps = [item for item in body if item["type"] == "step"]
    if header is None or not isinstance(header.get("meta", {}).get("watch"), dict):
        raise SystemExit(f"{base} is not a file of `kvscope watch` (no header with meta.watch)")
    queued = [e for e in events if e["kind"] == "queued" and e.get("prompt_token_ids")]
    if not queued:
        raise SystemExit(f"{base} records no prompts (run the watch with --prompts): nothing to replay")
    times = [e["t_ns"] for e in events] + [s["t_start_ns"] for s in steps] + [s["t_end_ns"] for s in steps]
    arrivals = sorted(e["t_ns"] for e in queued)
    gap = (arrivals[-1] - arrivals[0]) // max(len(arrivals) - 1, 1)
    shift = max(times) - min(times) + max(gap, 1)
    num_steps = max((s["step"] for s in steps), default=-1) + 1
    order = [e["request_id"] for e in sorted(queued, key=lambda e: e["t_ns"])]  # arrival order
    copies = -(-requests // len(order))
    first_kept = copies * num_steps - MAX_RECORDS  # steps before this one are not written (a watch's ring)
    written = num_events = num_records = 0
    with out.open("w") as f:
        f.write(json.dumps(header) + "\n")
        for k in range(copies):
            keep = set(order[: requests - written])  # the last copy: its first arrivals only
            dt = k * shift
            for item in body:
                if item["type"] == "event":
                    if item["request_id"] not in keep:
                        continue
                    new = dict(item, t_ns=item["t_ns"] + dt, request_id=f"{item['request_id']}~{k}")
                    if isinstance(new.get("step"), int) and new["step"] >= 0:
                        new["step"] += k * num_steps
                    if new.get("prompt_token_ids"):
                        new["prompt_token_ids"] = _varied(new["prompt_token_ids"], k, vocab_size)
                    num_events += 1
                elif item["step"] + k * num_steps < first_kept:
                    continue
                else:
                    new = dict(item, step=item["step"] + k * num_steps, t_start_ns=item["t_start_ns"] + dt,
                               t_end_ns=item["t_end_ns"] + dt)
                    if new.get("scheduled"):
                        new["scheduled"] = [dict(x, request_id=f"{x['request_id']}~{k}")
                                            if isinstance(x, dict) and "request_id" in x else x
                                            for x in new["scheduled"]]
                    num_records += 1
                f.write(json.dumps(new) + "\n")
            written += len(keep)
        f.write(json.dumps({"type": "end", "num_steps": num_records, "num_events": num_events}) + "\n")
    return written


def base_in_process(folder: Path) -> tuple[Path, Path, Path]:
    """A base watched run made without a server (the module doc): (its file, a step model fitted on it, the model
    folder). A stand-in for tests; the figures come from a real watched run (``--from``)."""
    from kvscope.cli.main import main as kvscope_main
    from kvscope.runs.result.run import load
    from kvscope.sim.calibrate import fit_step_model
    from kvscope.watched.vllm_demo import save_tiny_llama

    model = save_tiny_llama(folder / "tiny-llama")
    sim = folder / "base.sim.metrics.jsonl"
    code = kvscope_main(["simulate", "--gpu", "a100-40gb", "--engine", "vllm", "--model", str(model),
                         "--requests", "32", "--rate", "8", "--prompt-len", "32-200", "--output-len", "8-32",
                         "--block-size", "32", "--num-blocks", "63", "--max-num-batched-tokens", "256",
                         "--out", str(folder / "base.sim"), "--quiet"])
    if code != 0:
        raise SystemExit(f"the simulated base run failed ({code})")
    run = load(sim)
    config = {"block_size": 32, "num_blocks": 64, "max_num_seqs": run.meta["config"]["max_num_seqs"],
              "max_num_batched_tokens": 256, "max_model_len": run.meta["max_model_len"],
              "enable_prefix_caching": True, "enable_chunked_prefill": True, "async_scheduling": False,
              "policy": "fcfs", "scheduler_reserve_full_isl": True}
    lines = sim.read_text().splitlines()
    header = json.loads(lines[0])
    header["meta"] = {"model": str(model), "device": "vLLM server", "source_kind": "kvscope watch",
                      "t0_ns": header["meta"]["t0_ns"], "block_size": 32, "num_blocks": 64, "kv_bytes_per_token": 0,
                      "kv_bytes_per_block": 0, "max_model_len": config["max_model_len"], "config": config,
                      "watch": {"version": 1, "plugin": True, "config": config}}
    watched = folder / "base.metrics.jsonl"
    watched.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    step = fit_step_model(run.records, 32, str(sim)).save(folder / "step.json")
    return watched, step, model


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def replay(watch: Path, step: Path, model: Path, prefix: Path, profile: bool) -> dict[str, float]:
    """Replay ``watch`` as the CLI does; CPU and wall seconds and peak RSS (MiB) of the replay."""
    argv = ["simulate", "--replay", str(watch), "--step-model", str(step), "--engine", "vllm", "--model",
            str(model), "--quiet", "--out", str(prefix)]
    if profile:
        import cProfile
        import pstats
        import threading

        from kvscope.cli.main import main as kvscope_main

        profilers = [cProfile.Profile()]
        thread_run = threading.Thread.run

        def profiled(self: threading.Thread) -> None:  # the simulation runs in LiveRun's thread
            profilers.append(cProfile.Profile())
            profilers[-1].runcall(thread_run, self)

        threading.Thread.run = profiled  # type: ignore[method-assign]
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            code = profilers[0].runcall(kvscope_main, argv)
        finally:
            threading.Thread.run = thread_run  # type: ignore[method-assign]
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        for p in profilers:
            pstats.Stats(p).sort_stats("cumulative").print_stats(40)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    else:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter()
        path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)  # a PYTHONPATH first
        proc = subprocess.run([sys.executable, "-m", "kvscope", *argv], cwd=prefix.parent, capture_output=True,
                              text=True, env=dict(os.environ, TQDM_DISABLE="1", PYTHONPATH=path))
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        code = proc.returncode
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        rss = after.ru_maxrss / 1024  # the largest child so far: the replay (the only child)
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    if code != 0:
        raise SystemExit(f"the replay failed ({code})")
    return {"cpu_s": cpu, "wall_s": wall, "rss_mib": rss}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="base", type=Path, help="a watched run (kvscope watch, plugin, --prompts)")
    parser.add_argument("--step-model", type=Path, help="with --from: its calibrated step model (kvscope calibrate)")
    parser.add_argument("--model", type=Path, help="with --from: the served model's folder")
    parser.add_argument("--requests", "-n", type=int, default=100_000)
    parser.add_argument("--out", type=Path, help="work folder (default: a temporary one)")
    parser.add_argument("--profile", action="store_true", help="replay in this process under cProfile")
    parser.add_argument("--tiled", type=Path, help="replay this file tiled before (with --from's step model and model)")
    args = parser.parse_args(argv)
    if args.base is not None and (args.step_model is None or args.model is None):
        parser.error("--from takes --step-model (its calibrated step model) and --model (the served model's folder)")
    with tempfile.TemporaryDirectory(prefix="kvscope-replay-speed-") as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.base is None:
            base, step, model = base_in_process(folder)
            print(f"base: a simulated stand-in made here ({base}); give --from a real watched run for the figures")
        else:
            base, step, model = args.base, args.step_model, args.model
        watch = args.tiled or folder / f"tiled-{args.requests}.metrics.jsonl"
        t = time.perf_counter()
        if args.tiled is None:
            written = tile(base, watch, args.requests, _vocab_size(str(model)))
        else:
            written = sum(1 for line in watch.open() if '"kind": "queued"' in line)
        print(f"tiled {base.name} to {written:,} requests: {watch} ({watch.stat().st_size / 2**20:,.1f} MiB, "
              f"{time.perf_counter() - t:.1f} s)")
        load_before = _loadavg()
        got = replay(watch, step, model, folder / "replay", args.profile)
        load_after = _loadavg()
        from kvscope.runs.result.run import load

        sim = load(folder / "replay.metrics.jsonl")
        replayed = sim.summary()["requests"]
        per_cpu = written / got["cpu_s"]
        print(f"requests: {written:,} tiled, {replayed:,} replayed")
        print(f"cpu: {got['cpu_s']:.2f} s; wall: {got['wall_s']:.2f} s; peak RSS: {got['rss_mib']:,.0f} MiB")
        print(f"simulated requests per CPU second: {per_cpu:,.0f}; per wall second: {written / got['wall_s']:,.0f}")
        print(f"load average (1, 5, 15 min): before {load_before}; after {load_after}")
        print(f"GOAL >= {GOAL:,.0f} requests per CPU second: {'met' if per_cpu >= GOAL else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
