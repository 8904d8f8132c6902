"""``kvscope sweep``: the same seeded workload once per value of one run option (``kvscope.runs.sweep``), a line
per run as it ends, then the comparison page and its CSV (``kvscope.cli.compare.write_comparison``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvscope.cli.command import Command
from kvscope.cli.compare import write_comparison
from kvscope.cli.parser import CLIError
from kvscope.cli.paths import check_output, different
from kvscope.options.run import CLI, OptionError
from kvscope.options.sweep import add_sweep_options
from kvscope.utils.files import check_outputs

EPILOG_SWEEP = """\
examples:
  kvscope sweep --block-size 8,16,32,64 --requests 32 --num-blocks 256 -o block-size.html
  kvscope sweep --prefix-caching on,off --shared-prefix 64 --requests 16
  kvscope sweep --max-num-batched-tokens 128,512,2048 --model smollm2 --requests 32

Exactly one option gets a comma-separated list; every other option is the same in each run, so the
seeded synthetic workload is the same prompts in every run. Writes the comparison (-o, default
kvscope-sweep.html) and the summary as CSV (--csv, default: the -o path with .csv)."""


def _add_options(parser: argparse.ArgumentParser) -> None:
    add_sweep_options(parser, CLI)
    out = parser.add_argument_group("outputs")
    out.add_argument("-o", "--output", default="kvscope-sweep.html", metavar="HTML",
                     help="the comparison page (default kvscope-sweep.html)")
    out.add_argument("--csv", default=None, metavar="PATH",
                     help="the summary, one row per run (default: the -o path with .csv)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress or table; print the paths written")


def cmd_sweep(args: argparse.Namespace) -> int:
    output = check_output(args.output, "comparison", "-o")
    csv = check_output(args.csv or str(output.with_suffix(".csv")), "CSV", "--csv")
    different(output, csv)
    try:  # the prompts files of the runs (by identity): written over only after every run
        check_outputs([("--prompts", Path(p).expanduser()) for p in getattr(args, "prompts", None) or []],
                      {"-o": output, "--csv": csv})
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    from kvscope.runs.sweep import Sweep, plan_from_args  # here: they bring torch

    try:
        plan = plan_from_args(args)
    except OptionError as exc:
        raise CLIError(str(exc)) from None
    sweep = Sweep(plan).start()
    interrupted = False
    try:
        _follow(sweep, args.quiet)
    except KeyboardInterrupt:
        interrupted = True
        sweep.stop()
        sweep.wait()
        if not sweep.runs:
            raise
    if not sweep.runs:
        label, exc = next(iter(sweep.errors.items()))
        raise CLIError(f"no run of the sweep finished; {label}: {type(exc).__name__}: {exc}", code=1)
    write_comparison(sweep, output, csv, args.quiet)
    if interrupted:
        print("interrupted: the comparison holds the runs that finished", flush=True)
        return 130
    return 1 if sweep.errors else 0


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
