"""``kvscope sweep``: the same seeded workload once per value of one run option
(``kvscope.runs.background.sweep``), a line per run as it ends, then the comparison page and its CSV
(``kvscope.cli.compare.write_comparison``).

SIGINT (Ctrl-C), SIGTERM and SIGHUP stop a sweep alike, as ``kvscope run``: the run going is stopped, the
comparison of the runs that finished is written, a line says so, and the exit code is 128 + the signal's
number; a second Ctrl-C writes it at once, without waiting for the run going to wind down."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from contextlib import nullcontext, suppress
from pathlib import Path

from kvscope.cli.command import Command
from kvscope.cli.compare import write_comparison
from kvscope.cli.parser import CLIError
from kvscope.cli.paths import check_output, different
from kvscope.cli.signals import files_first, signal_number, stop_signals, wait_until_done
from kvscope.options.run import CLI, OptionError
from kvscope.options.simulate import add_simulate_options
from kvscope.options.sweep import add_sweep_options
from kvscope.utils.files import check_outputs

EPILOG_SWEEP = """\
examples:
  kvscope sweep --block-size 8,16,32,64 --requests 32 --num-blocks 256 -o block-size.html
  kvscope sweep --prefix-caching on,off --shared-prefix 64 --requests 16
  kvscope sweep --max-num-batched-tokens 128,512,2048 --model smollm2 --requests 32

Exactly one option gets a comma-separated list; every other option is the same in each run, so the
seeded synthetic workload is the same prompts in every run. Writes the comparison (-o, default
kvscope-sweep.html) and the summary as CSV (--csv, default: the -o path with .csv): one row per value,
with --repeat N the median of its N runs (the page shows their min-max)."""


def _add_options(parser: argparse.ArgumentParser) -> None:
    add_sweep_options(parser, CLI)
    add_simulate_options(parser, switch=True)
    out = parser.add_argument_group("outputs")
    out.add_argument("-o", "--output", default="kvscope-sweep.html", metavar="HTML",
                     help="the comparison page (default kvscope-sweep.html)")
    out.add_argument("--csv", default=None, metavar="PATH",
                     help="the summary, one row per value (with --repeat N: the median of its N runs, each metric; "
                     "the warm-up run is not in it) (default: the -o path with .csv)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress or table; print the paths written")


def cmd_sweep(args: argparse.Namespace) -> int:
    if not args.simulate:  # the simulation's options mean nothing to real runs: refused, never ignored
        from kvscope.options.simulate import simulate_fields

        given = [name for name, value in simulate_fields(args).items() if value not in (None, False, "kvscope")]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise CLIError(f"{flag} is an option of simulated runs: add --simulate (each run simulated), or leave "
                           f"{flag} out (real runs of the model)")
    output = check_output(args.output, "comparison", "-o")
    csv = check_output(args.csv or str(output.with_suffix(".csv")), "CSV", "--csv")
    different(output, csv)
    try:  # the prompts files of the runs (by identity): written over only after every run
        check_outputs([("--prompts", Path(p).expanduser()) for p in getattr(args, "prompts", None) or []],
                      {"-o": output, "--csv": csv})
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    from kvscope.runs.background.sweep import Sweep, plan_from_args  # here: they bring torch
    from kvscope.runs.result.comparison import Comparison

    try:
        plan = plan_from_args(args)
    except OptionError as exc:
        raise CLIError(str(exc)) from None
    sweep = Sweep(plan)
    stopped_by = None
    with stop_signals():
        try:
            _follow(sweep.start(), args.quiet)
        except KeyboardInterrupt as exc:
            stopped_by = _stop(sweep, signal_number(exc))
    if not sweep.runs:
        if stopped_by is not None:
            _say(f"stopped by {signal.Signals(stopped_by).name} before any run of the sweep finished: nothing written")
            return 128 + stopped_by
        label, exc = next(iter(sweep.errors.items()))
        raise CLIError(f"no run of the sweep finished; {label}: {type(exc).__name__}: {exc}", code=1)
    n = len(sweep.labels)  # appended last: the runs finished so far (the sweep may still be winding down)
    cmp = sweep if stopped_by is None else Comparison(sweep.runs[:n], sweep.labels[:n],
                                                      (sweep.plan.dest, sweep.swept[1][:n]))
    try:
        with files_first("the comparison") if stopped_by is not None else nullcontext():
            write_comparison(cmp, output, csv, args.quiet)
    except OSError:  # a hung-up terminal (SIGHUP): the files are written all the same
        if stopped_by is None:
            raise
    if stopped_by is not None:
        how = "interrupted" if stopped_by == signal.SIGINT else f"stopped by {signal.Signals(stopped_by).name}"
        _say(f"{how}: the comparison holds the {len(cmp.runs)} of {len(plan.values)} runs that finished")
        return 128 + stopped_by
    return 1 if sweep.errors else 0


def _stop(sweep, signum: int) -> int:
    """Stop the sweep after SIGINT / SIGTERM / SIGHUP and wait for the run going to end; another SIGTERM /
    SIGHUP changes nothing, a second Ctrl-C stops waiting (the runs finished so far are kept either way)."""
    with suppress(KeyboardInterrupt):
        sweep.stop()
        _say(f"kvscope: {signal.Signals(signum).name}: stopping the sweep and writing the comparison of the "
             "runs that finished (Ctrl-C again to write it at once)")
        wait_until_done(sweep)
    return signum


def _say(text: str) -> None:
    with suppress(OSError):  # a hung-up terminal
        print(text, file=sys.stderr, flush=True)


def _follow(sweep, quiet: bool) -> None:
    """One line per run as it ends (the runs go on the sweep's thread)."""
    reported = 0
    while True:
        done = sweep.done
        while reported < len(sweep.runs):
            if not quiet:
                s = sweep.summaries[reported]
                print(f"{sweep.labels[reported]:<24} {s['output_tokens_per_s']:>10,.1f} output tok/s, "
                      f"TTFT p50 {s['ttft_p50_s'] * 1e3:,.1f} ms, peak KV {s['peak_block_usage']:.0%}, "
                      f"{s['preemptions']} preemptions", flush=True)
            reported += 1
        if done:
            break
        time.sleep(0.1)
    for label, exc in sweep.errors.items():
        print(f"{label:<24} failed: {type(exc).__name__}: {exc}", file=sys.stderr)


COMMAND = Command(
    name="sweep",
    help="one run per value of a run option, compared",
    description="Run the same seeded workload once per value of one run option (any "
                "option of 'kvscope run' that takes a value, given as a comma-separated list) and "
                "compare the runs.",
    epilog=EPILOG_SWEEP,
    add_options=_add_options,
    run=cmd_sweep,
)
