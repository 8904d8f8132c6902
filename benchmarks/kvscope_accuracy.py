"""How well ``kvscope simulate`` predicts kvscope's own engine, on the requests ``benchmarks/vllm_accuracy.py`` sent
to a real vLLM: the same table as that benchmark's, for kvscope instead of vLLM.

    python benchmarks/vllm_accuracy.py --keep DIR       # first: the watched vLLM runs (and the served model) in DIR
    python benchmarks/kvscope_accuracy.py DIR           # then kvscope's engine on each workload's requests

Each workload's requests are the watched vLLM run's, replayed as ``kvscope simulate --replay`` reads them
(``kvscope.runs.workload.recorded.replay_workload``): the prompts' token ids, the output lengths (EOS ignored) and
the arrival times the server saw. kvscope's engine runs them on the same model folder with the server's settings
(block size 32, the server's pool less vLLM's null block, the token budget, max-num-seqs, max-model-len; kvscope's
own scheduling rules; one intra-op thread unless ``--threads`` says otherwise) and records
``NAME.kv.metrics.jsonl``. Then, with kvscope's own commands:

    kvscope calibrate calibrate.kv.metrics.jsonl -o kv-step.json
    kvscope simulate --replay NAME.kv.metrics.jsonl --step-model kv-step.json --out NAME.kv.sim

and per workload the same figures as ``vllm_accuracy.py``: per-request TTFT and E2E error, ITL p50, duration,
steps, prefix-cache hits and preemptions, predicted vs measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from vllm_accuracy import compare, kvscope_cli, table, workloads

from kvscope.engine.engine import Engine
from kvscope.runs.background.live import LiveRun
from kvscope.runs.result.run import load
from kvscope.runs.setup.outputs import Outputs
from kvscope.runs.setup.watched_replay import NULL_BLOCKS, for_replay
from kvscope.runs.workload.recorded import replay_workload


def run_kvscope(watched: Path, model: Path, out: Path) -> Path:
    """kvscope's engine on the watched run's requests, with the server's settings; the run's metrics file."""
    run = for_replay(load(watched), str(model), None, str(watched))
    config = run.meta["config"]  # the server's settings; num_blocks without vLLM's null block (for_replay)
    engine = Engine(str(model), block_size=config["block_size"], num_blocks=config["num_blocks"],
                    max_num_seqs=config["max_num_seqs"], max_num_batched_tokens=config["max_num_batched_tokens"],
                    max_model_len=config["max_model_len"])
    live = LiveRun(engine, replay_workload(run), outputs=Outputs(metrics=out), dashboard=False).start()
    live.wait()
    if live.error is not None:
        raise RuntimeError(f"kvscope's run of {watched.name} failed: {live.error}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the --keep DIR of a benchmarks/vllm_accuracy.py run")
    parser.add_argument("--quick", action="store_true", help="the workloads of vllm_accuracy.py --quick")
    parser.add_argument("--json", metavar="FILE", help="the figures as JSON too")
    parser.add_argument("--reuse", action="store_true", help="predict the kvscope runs already in the folder")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads, fixed for every run (1); "
                        "0: kvscope's adaptive policy, which changes them while a run goes on (a step model "
                        "fitted across the changes mispredicts both)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)  # the user's setting: kvscope's thread policy leaves it alone
    folder = Path(args.folder)
    model = folder / "tiny-llama"
    names = [w.name for w in workloads(args.quick) if (folder / f"{w.name}.metrics.jsonl").exists()]
    if "calibrate" not in names or not model.is_dir():
        print(f"{folder} has no watched 'calibrate' run or no tiny-llama folder: run "
              f"`python benchmarks/vllm_accuracy.py --keep {folder}` first", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    runs = {}
    for name in names:
        path = folder / f"{name}.kv.metrics.jsonl"
        runs[name] = path if args.reuse and path.exists() else \
            run_kvscope(folder / f"{name}.metrics.jsonl", model, path)
        print(f"kvscope ran {name}", file=sys.stderr)
    step = folder / "kv-step.json"
    kvscope_cli("calibrate", str(runs["calibrate"]), "-o", str(step), "-q")
    results = {}
    for name, path in runs.items():
        sim = folder / f"{name}.kv.sim"
        kvscope_cli("simulate", "--replay", str(path), "--step-model", str(step), "--out", str(sim), "--quiet")
        results[name] = compare(path, Path(f"{sim}.metrics.jsonl"))
    load_after = os.getloadavg()
    print(f"kvscope's engine on the watched vLLM runs' requests (tiny random Llama, block size 32, the server's pool "
          f"less its {NULL_BLOCKS} null block, its limits); calibrated on 'calibrate' (so its row is not held out)")
    print(f"load average (1/5/15 min): before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
          f"after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} on {os.cpu_count()} CPUs")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"load_before": load_before, "load_after": load_after,
                                               "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
