"""``kvscope compare``, ``kvscope sweep`` and ``kvscope view --perfetto``.

``add_compare_parser`` / ``add_sweep_parser`` add the commands to ``cli.py``'s subparsers,
``add_perfetto_options`` adds ``--perfetto`` (and ``--port``, ``--no-browser``) to its ``view``; the
``cmd_*`` functions run them and return the exit code (errors are ``CLIError``s, as in ``cli.py``). Only
the standard library at import, so ``kvscope --help`` stays fast.

Inputs and outputs are checked before any work: an input that is not a kvscope run is one error naming
it (exit 1, as ``kvscope view``); the same input twice is allowed; an output that is one of the inputs
(the same file by identity: ``os.path.samefile``, so links and other spellings count) is refused.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from kvscope.cli.parser import CLIError
from kvscope.options.run import CLI, OptionError, positive_int
from kvscope.options.sweep import add_sweep_options
from kvscope.utils.files import check_outputs, not_a_file, unwritable

EPILOG_COMPARE = """\
examples:
  kvscope compare bs16.trace.json bs64.trace.json -o cmp.html
  kvscope compare a.metrics.jsonl b.metrics.jsonl c.metrics.jsonl --label base --label big-batch --label spec
  (ratios are against the first run; runs of different models or workloads are compared with a warning)"""

EPILOG_SWEEP = """\
examples:
  kvscope sweep --block-size 8,16,32,64 --requests 32 --num-blocks 256 -o block-size.html
  kvscope sweep --prefix-caching on,off --shared-prefix 64 --requests 16
  kvscope sweep --max-num-batched-tokens 128,512,2048 --model smollm2 --requests 32

Exactly one option gets a comma-separated list; every other option is the same in each run, so the
seeded synthetic workload is the same prompts in every run. Writes the comparison (-o, default
kvscope-sweep.html) and the summary as CSV (--csv, default: the -o path with .csv)."""


# ---- paths --------------------------------------------------------------------------------------------
def _input(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_file():
        why = "is a folder" if path.is_dir() else "does not exist"
        raise CLIError(f"{text!r} {why}; give a .trace.json or .metrics.jsonl written by kvscope")
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): not the same file
        return False


def check_output(text: str, kind: str, flag: str, inputs: list[Path] = ()) -> Path:
    """A path the command may write: its folder exists and takes files, it is no folder, no input."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise CLIError(f"the {kind} path {text!r} is a folder; give a file name for {flag}")
    what = not_a_file(path)  # /dev/null, a FIFO: atomic_write would refuse it, but only after the work
    if what is not None:
        raise CLIError(f"the {kind} path {text!r} is {what}, not a regular file; choose another {flag} path")
    if not path.parent.is_dir():
        raise CLIError(f"the folder of {text!r} does not exist; create it or choose another {flag} path")
    for source in inputs:
        if _same_file(path, source):
            raise CLIError(f"the {kind} path {text!r} is the input {str(source)!r}; writing it would destroy "
                           f"that run: choose another {flag} path")
    why = unwritable(path)
    if why is not None:
        raise CLIError(f"cannot write the {kind} file {text!r} ({why}); choose another {flag} path")
    return path


# ---- kvscope compare ----------------------------------------------------------------------------------
def add_compare_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("compare", help="runs side by side: a summary table with ratios, overlaid plots",
                              description="Compare saved runs (traces or metrics files) in one standalone "
                              "HTML page: a summary table with ratios against the first run, the time series "
                              "overlaid (aligned by step or by time), latency distributions overlaid, and the "
                              "page maps side by side under one replay slider.",
                              epilog=EPILOG_COMPARE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="two or more .trace.json / .metrics.jsonl files")
    p.add_argument("-o", "--output", default="kvscope-compare.html", metavar="HTML",
                   help="the comparison page (default kvscope-compare.html)")
    p.add_argument("--label", action="append", default=None, metavar="NAME",
                   help="a name per run, in order (repeat it; default: the file names)")
    p.add_argument("--csv", default=None, metavar="PATH", help="also write the summary, one row per run, as CSV")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the paths written")
    return p


def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.runs) < 2:
        raise CLIError("give at least two runs to compare (the same file twice is allowed)")
    if args.label is not None and len(args.label) != len(args.runs):
        raise CLIError(f"{len(args.label)} --label for {len(args.runs)} runs; give one per run, in order")
    inputs = [_input(text) for text in args.runs]
    output = check_output(args.output, "comparison", "-o", inputs)
    csv = check_output(args.csv, "CSV", "--csv", inputs) if args.csv else None
    if csv is not None and (csv.resolve() == output.resolve() or _same_file(csv, output)):
        raise CLIError("-o and --csv name the same file; give them different paths")
    from kvscope.runs.comparison import compare

    try:
        cmp = compare(*inputs, labels=args.label or [p.name for p in inputs])
    except ValueError as exc:  # a damaged or foreign file, named in the message
        raise CLIError(str(exc), code=1) from None
    return _write(cmp, output, csv, args.quiet)


def _write(cmp, output: Path, csv: Path | None, quiet: bool) -> int:
    written = []
    try:
        written.append(("comparison", cmp.save_html(output), "open in a browser; works offline"))
        if csv is not None:
            written.append(("summary", cmp.save_csv(csv), "one row per run"))
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
                text += f" ({ratio:.2f}x)" if ratio == ratio else " (–)"
            cells.append(f"  {text:>{c}}")
        print(f"{m.name:<{width}}" + "".join(cells))


# ---- kvscope sweep ------------------------------------------------------------------------------------
def add_sweep_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sweep", help="one run per value of a run option, compared",
                              description="Run the same seeded workload once per value of one run option "
                              "(any option of 'kvscope run' that takes a value, given as a comma-separated "
                              "list) and compare the runs.",
                              epilog=EPILOG_SWEEP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep_options(p, CLI)
    out = p.add_argument_group("outputs")
    out.add_argument("-o", "--output", default="kvscope-sweep.html", metavar="HTML",
                     help="the comparison page (default kvscope-sweep.html)")
    out.add_argument("--csv", default=None, metavar="PATH",
                     help="the summary, one row per run (default: the -o path with .csv)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress or table; print the paths written")
    return p


def cmd_sweep(args: argparse.Namespace) -> int:
    output = check_output(args.output, "comparison", "-o")
    csv = check_output(args.csv or str(output.with_suffix(".csv")), "CSV", "--csv")
    if csv.resolve() == output.resolve():
        raise CLIError("-o and --csv name the same file; give them different paths")
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
    _write(sweep, output, csv, args.quiet)
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


# ---- kvscope view --perfetto --------------------------------------------------------------------------
def add_perfetto_options(view: argparse.ArgumentParser) -> None:
    g = view.add_argument_group("Perfetto UI (offline)")
    g.add_argument("--perfetto", action="store_true",
                   help="open the trace in a local build of the Perfetto UI served on 127.0.0.1 (no internet) "
                        "instead of writing a report; Ctrl-C stops it")
    g.add_argument("--port", type=positive_int, default=None, help="port for --perfetto (default: any free one)")
    g.add_argument("--no-browser", action="store_true", help="with --perfetto: only print the URL")


def cmd_view_perfetto(args: argparse.Namespace) -> int:
    """Serve ``args.trace`` in the local Perfetto UI until Ctrl-C."""
    source = _input(args.trace)
    import webbrowser

    from kvscope.cli.perfetto_ui import PerfettoServer

    try:
        server = PerfettoServer(source, port=args.port or 0)
    except ValueError as exc:
        raise CLIError(str(exc), code=1) from None
    except RuntimeError as exc:  # the UI package is missing
        raise CLIError(str(exc), code=1) from None
    with server:
        print(f"Perfetto UI with {source.name}: {server.url}", flush=True)
        print("(served from this machine only, no internet needed; Ctrl-C to stop)", flush=True)
        if not args.no_browser:
            webbrowser.open(server.url)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopped", flush=True)
    return 0
