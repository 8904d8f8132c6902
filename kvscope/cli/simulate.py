"""``kvscope simulate``: the engine's own scheduler and KV cache on a virtual clock, timed by a step-time
model instead of a forward pass (``kvscope.sim``); the same options, files and summary as ``kvscope run``.

Its progress bar counts requests (a simulation of 10**6 requests runs through them in minutes); the run
is marked simulated in its metadata, its report and its summary table.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError
from kvscope.cli.run import execute, output_paths, output_spec
from kvscope.options.run import CLI, OptionError, add_run_options
from kvscope.options.simulate import add_simulate_options, simulate_fields
from kvscope.runs.background.status import RunStatus
from kvscope.runs.setup.spec import RunSpec

EPILOG = """\
examples:
  kvscope run --requests 64 --out real && kvscope calibrate real.metrics.jsonl -o step.json
  kvscope simulate --step-model step.json --requests 64 --block-size 32 --metrics S.jsonl
  kvscope simulate --step-model step.json --replay real.metrics.jsonl --num-blocks 64 --metrics S.jsonl
  kvscope simulate --gpu a100-40gb --model llama-7b --requests 2000 --rate 20 --max-model-len 2048
  kvscope simulate --gpu a100-40gb --model llama-7b --static --requests 2000 --rate 20 --max-model-len 2048
  kvscope simulate --gpu h100 --model llama-7b --pd 1P1D --kv-bandwidth 50 --requests 500 --rate 8

No model is loaded or run: --model gives only the shape (tiny, smollm2, a folder's config.json, or a known
shape such as llama-7b). Outputs reach their max tokens (no EOS), or the recorded lengths with --replay.
With --pd, each instance is a simulated engine (its own pool: a whole GPU's with --gpu) on one virtual clock,
and each KV transfer takes bytes / --kv-bandwidth + --kv-latency."""


def _add_options(parser: argparse.ArgumentParser) -> None:
    add_simulate_options(parser)
    add_run_options(parser, CLI)
    parser.set_defaults(out="kvscope-sim")


def cmd_simulate(args: argparse.Namespace) -> int:
    from kvscope.runs.setup.simulated import SimSpec, prepare_simulation

    spec = RunSpec.from_args(args, outputs=output_spec(args, output_paths(args, "kvscope-sim")))
    sim = SimSpec(**simulate_fields(args))
    try:
        setup = prepare_simulation(spec, sim)
    except OptionError as exc:
        raise CLIError(str(exc)) from None
    how = setup.sim_meta["step_model_from"]
    if sim.engine != "kvscope":
        how += f"; {sim.engine}'s scheduling rules"
    if setup.link is not None:
        how += f"; {spec.engine.pd}, KV at {setup.link.bandwidth_gb_per_s:g} GB/s + {setup.link.latency_s:g} s"
    total = spec.workload.requests or 16
    return execute(setup, title=f"kvscope simulate · {setup.model} (simulated; {how})", quiet=args.quiet,
                   watch=partial(_watch_requests, total=total))


def _watch_requests(run, quiet: bool, total: int) -> None:
    """A tqdm bar of finished requests, with simulated time and the simulation's own speed."""
    bar, started = None, time.perf_counter()
    try:
        while not run.done:
            time.sleep(0.2)
            if quiet or run.status is not RunStatus.RUNNING:
                continue
            if bar is None:
                from tqdm.auto import tqdm

                bar = tqdm(total=len(run.workload) or total, unit="req", desc="simulated", dynamic_ncols=True)
            done = run.num_finished
            bar.update(done - bar.n)
            rate = done / max(time.perf_counter() - started, 1e-9)
            bar.set_postfix_str(f"{rate:,.0f} req/s simulated, virtual clock {run.elapsed_s:,.1f} s",
                                refresh=False)
    finally:
        if bar is not None:
            bar.update(run.num_finished - bar.n)
            bar.set_postfix_str(f"virtual clock {_final_clock(run):,.1f} s", refresh=True)  # the summary's figure
            bar.close()


def _final_clock(run) -> float:
    """The simulated time the summary prints (its ``duration_s``), so the bar's last word agrees with it."""
    try:
        duration = run.summary().get("duration_s") if run.records else None
    except Exception:  # a failed run: the bar ends on the clock as it stood
        duration = None
    return duration if isinstance(duration, (int, float)) and duration == duration else run.elapsed_s


COMMAND = Command(
    name="simulate",
    help="what if: the real scheduler and KV cache on a virtual clock, no model",
    description="Simulate a run: kvscope's own scheduler, KV cache manager and block pool, with the model "
                "replaced by a step-time model (fitted on your run, or a roofline of a GPU), on a virtual "
                "clock. The options are kvscope run's; the files and the summary are the same, marked simulated.",
    epilog=EPILOG,
    add_options=_add_options,
    run=cmd_simulate,
)
