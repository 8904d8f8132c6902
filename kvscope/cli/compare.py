"""``kvscope compare``: saved runs side by side in one HTML page (and a CSV), with the summary table in the
terminal. ``write_comparison`` and ``print_table`` serve ``kvscope sweep`` too. Only the standard library at
import, so ``kvscope --help`` stays fast.

Inputs and outputs are checked before any work: an input that is not a kvscope run is one error naming
it (exit 1, as ``kvscope view``); the same input twice is allowed; an output that is one of the inputs
(the same file by identity: links and other spellings count) is refused.
"""

from __future__ import annotations

import argparse
import signal
import sys
from contextlib import suppress
from pathlib import Path

from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError
from kvscope.cli.paths import check_output, different, input_run
from kvscope.cli.signals import signal_number, stop_signals

EPILOG_COMPARE = """\
examples:
  kvscope compare bs16.trace.json bs64.trace.json -o cmp.html
  kvscope compare a.metrics.jsonl b.metrics.jsonl c.metrics.jsonl --label base --label big-batch --label spec
  (ratios are against the first run; runs of different models or workloads are compared with a warning)"""


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", help="two or more .trace.json / .metrics.jsonl files")
    parser.add_argument("-o", "--output", default="kvscope-compare.html", metavar="HTML",
                        help="the comparison page (default kvscope-compare.html)")
    parser.add_argument("--label", action="append", default=None, metavar="NAME",
                        help="a name per run, in order (repeat it; default: the file names)")
    parser.add_argument("--csv", default=None, metavar="PATH", help="also write the summary, one row per run, as CSV")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the paths written")


def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.runs) < 2:
        raise CLIError("give at least two runs to compare (the same file twice is allowed)")
    if args.label is not None and len(args.label) != len(args.runs):
        raise CLIError(f"{len(args.label)} --label for {len(args.runs)} runs; give one per run, in order")
    inputs = [input_run(text) for text in args.runs]
    output = check_output(args.output, "comparison", "-o", inputs)
    csv = check_output(args.csv, "CSV", "--csv", inputs) if args.csv else None
    if csv is not None:
        different(output, csv)
    from kvscope.runs.result.comparison import compare

    with stop_signals():
        try:
            cmp = compare(*inputs, labels=args.label or [p.name for p in inputs])
            return write_comparison(cmp, output, csv, args.quiet)
        except ValueError as exc:  # a damaged or foreign file, named in the message
            raise CLIError(str(exc), code=1) from None
        except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP: the files are whole or not written
            signum = signal_number(exc)
            with suppress(OSError):
                print(f"kvscope: {signal.Signals(signum).name}: compare stopped; no file was left half-written "
                      f"(each is written whole or not at all)", file=sys.stderr, flush=True)
            return 128 + signum


def write_comparison(cmp, output: Path, csv: Path | None, quiet: bool) -> int:
    written = []
    try:
        written.append(("comparison", cmp.save_html(output), "open in a browser; works offline"))
        if csv is not None:
            written.append(("summary", cmp.save_csv(csv), "one row per run" if cmp.swept is None else
                            "one row per value" + (", the median of its repeats" if cmp.spreads and cmp.spreads[0]
                                                   else "")))
    except OSError as exc:
        raise CLIError(f"cannot write {exc.filename or output}: {exc.strerror or exc}", code=1) from None
    if not quiet:
        print_table(cmp)
        print()
    for kind, path, how in written:
        print(path if quiet else f"{kind:<11} {path}  ({how})")
    return 0


def print_table(cmp) -> None:
    """The summary table in the terminal: metric, each run's value and its ratio against the first."""
    from kvscope.widgets.compare_table import format_value

    for note in getattr(cmp, "notes", []):
        print(f"note: {note}")
    for warning in cmp.warnings:
        print(f"warning: {warning}")
    table = cmp.table
    first = cmp.labels[0]
    width = max(len(m.name) for m in cmp.metrics)
    cols = [max(len(label), 16) for label in cmp.labels]
    print(" " * width + "".join(f"  {label:>{c}}" for label, c in zip(cmp.labels, cols)))
    for m in cmp.metrics:
        cells = []
        for i, (label, c) in enumerate(zip(cmp.labels, cols)):
            text = format_value(m.unit, table.at[m.key, label])
            ratio = table.at[m.key, f"{label} / {first}"] if i else None
            if ratio is not None:
                noise = "≈" if cmp.within_noise(m.key, i) else ""
                text += f" ({noise}{ratio:.2f}x)" if ratio == ratio else " (–)"
            cells.append(f"  {text:>{c}}")
        print(f"{m.name:<{width}}" + "".join(cells))


COMMAND = Command(
    name="compare",
    help="runs side by side: a summary table with ratios, overlaid plots",
    description="Compare saved runs (traces or metrics files) in one standalone HTML page: "
                "a summary table with ratios against the first run, the time series overlaid (aligned "
                "by step or by time), latency distributions overlaid, and the page maps side by side "
                "under one replay slider.",
    epilog=EPILOG_COMPARE,
    add_options=_add_options,
    run=cmd_compare,
)
