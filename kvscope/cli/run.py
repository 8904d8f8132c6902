"""``kvscope run``: a run in the terminal with a progress bar, a summary table and files (``kvscope demo``
runs the same way, ``kvscope.cli.demo``).

The engine steps on a ``LiveRun``'s background thread (no dashboard); the main thread only watches its
records to move a tqdm bar (finished requests; output tokens, running/waiting, KV usage), so Ctrl-C stops
the run cleanly at a step boundary and the files are still written.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from contextlib import suppress
from pathlib import Path

from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError
from kvscope.cli.paths import check_output, output_folder
from kvscope.cli.run_summary import print_answers, print_summary
from kvscope.cli.signals import signal_number, stop_signals, wait_until_done
from kvscope.options.run import CLI, OptionError, add_run_options
from kvscope.runs.background.status import RunStatus
from kvscope.runs.setup.spec import OUTPUT_KINDS, OutputSpec, RunSpec

EPILOG_RUN = """\
examples:
  kvscope run --model smollm2 --prompts prompts.txt --max-new-tokens 64
  kvscope run --requests 32 --prompt-len 64-256 --output-len 32-128 --num-blocks 128
  kvscope run --model smollm2 --requests 8 --shared-prefix 64 --profile 5 --out my-run
  kvscope run --model ./my-hf-folder --requests 16 --kv-memory 256MiB --max-num-seqs 8

Every run writes PREFIX.html (report: open in a browser), PREFIX.trace.json (kvscope view
PREFIX.trace.json --perfetto: a local Perfetto UI, offline) and PREFIX.metrics.jsonl (kvscope.load(path)
in Python); --out sets PREFIX."""


def _add_options(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser, CLI)
_SUFFIXES = {"html": ".html", "trace": ".trace.json", "metrics": ".metrics.jsonl"}


def output_paths(args: argparse.Namespace, default_name: str) -> dict[str, Path]:
    """trace / metrics / html paths from ``--out PREFIX`` and the per-file overrides (those were checked by
    their option's parser; the paths made from PREFIX are checked here). A PREFIX that is a folder, or ends
    in a separator, puts the files inside it under ``default_name``. The PREFIX's folder is made if it is the
    only one missing (``--out runs/a`` without ``runs/``; ``output_folder``)."""
    prefix = Path(args.out).expanduser()
    if args.out.endswith(("/", os.sep)) or prefix.is_dir():
        output_folder(prefix, "--out", getattr(args, "quiet", False))
        prefix = prefix / default_name
    else:
        output_folder(prefix.parent, "--out", getattr(args, "quiet", False))
    paths = {kind: f"{prefix}{suffix}" for kind, suffix in _SUFFIXES.items()}
    for kind in paths:
        if getattr(args, kind, None):
            paths[kind] = str(Path(getattr(args, kind)).expanduser())
    return {kind: check_output(text, kind, f"--out / --{kind}") for kind, text in paths.items()}


def output_spec(args: argparse.Namespace, paths: dict[str, Path]) -> OutputSpec:
    """The files, each called in messages by its own option if given, else "the html file of --out"."""
    names = tuple(f"--{kind}" if getattr(args, kind, None) else f"the {kind} file of --out" for kind in OUTPUT_KINDS)
    return OutputSpec(**{kind: paths[kind] for kind in OUTPUT_KINDS}, names=names)


def cmd_run(args: argparse.Namespace) -> int:
    from kvscope.runs.setup.prepare import prepare  # here: it brings torch, which a usage error does not need

    spec = RunSpec.from_args(args, outputs=output_spec(args, output_paths(args, "kvscope-run")))
    try:
        setup = prepare(spec)
    except OptionError as exc:
        raise CLIError(str(exc)) from None
    return execute(setup, title=f"kvscope run · {setup.model}", quiet=args.quiet,
                   answers=bool(spec.workload.prompts))


def execute(setup, *, title: str, quiet: bool, watch=None, answers: bool = False) -> int:
    """Run a checked ``RunSetup`` to the end with a progress bar, write the files, print the summary; the
    exit code.

    SIGINT (Ctrl-C), SIGTERM and SIGHUP stop the run alike: the requests are aborted at the next step
    boundary, the files are written, and the exit code is 128 + the signal's number (130, 143, 129).
    ``watch(run, quiet)`` follows the run from this thread (default: a bar of output tokens); ``answers``:
    print each prompt's answer (the user's own ``--prompts``) before the summary."""
    from kvscope.runs.background.live import LiveRun

    if not quiet:
        for note in setup.notes:  # lines of --prompts skipped, ...
            _say(note)
    run = LiveRun(setup.make_engine, setup.workload, **setup.run_options(), dashboard=False)
    run.meta["title"] = title  # the report's title ("kvscope demo · smollm2"; widgets/report.py's run_title)
    stopped_by = None
    with stop_signals():
        try:
            (watch or _watch)(run.start(), quiet)
        except KeyboardInterrupt as exc:
            stopped_by = signal_number(exc)
            run.stop()
            if not quiet:
                _say(f"kvscope: {signal.Signals(stopped_by).name}: stopping the run and writing the files "
                     "(Ctrl-C again to quit without them)")
            wait_until_done(run)
    try:
        return _report(run, title, quiet, stopped_by, answers)
    except OSError:  # SIGHUP: the terminal is gone, and printing fails; the files are written all the same
        if stopped_by is None:
            raise
        return 128 + stopped_by


def _say(text: str) -> None:
    with suppress(OSError):  # a hung-up terminal
        print(text, file=sys.stderr, flush=True)


def _report(run, title: str, quiet: bool, stopped_by: int | None, answers: bool = False) -> int:
    """Print the summary and the files written; the exit code (``CLIError`` for a failed run)."""
    if run.error is not None:
        exc = run.error
        if os.environ.get("KVSCOPE_DEBUG"):
            import traceback

            traceback.print_exception(exc)
        if run.engine is None and isinstance(exc, ValueError):  # the model or config was refused
            raise CLIError(str(exc)) from None
        raise CLIError(f"the run failed: {type(exc).__name__}: {exc}", code=1) from None
    if not quiet:
        if answers:
            print_answers(run)
        print_summary(run, title)
        print()
    for kind in ("html", "trace", "metrics"):
        path = run.files.written.get(kind)
        if path is not None:
            print(path if quiet else f"{kind:<8} {path}  ({_HOW_TO_OPEN[kind]})")
    if run.files.errors:
        raise CLIError("could not write " + "; ".join(f"{k}: {v}" for k, v in run.files.errors.items()), code=1)
    failed = run.requests[run.requests.finish_reason == "error"] if len(run.requests) else []
    if len(failed):
        raise CLIError(f"{len(failed)} of {len(run.requests)} requests failed (the files hold the run); "
                       f"first: {failed.error.iloc[0]}", code=1)
    if stopped_by is not None:
        how = "interrupted" if stopped_by == signal.SIGINT else f"stopped by {signal.Signals(stopped_by).name}"
        print(f"{how}: the run was stopped early; the files hold what ran", flush=True)
        return 128 + stopped_by
    return 0


_HOW_TO_OPEN = {"html": "report: open in a browser, works offline",
                "trace": "kvscope view PATH --perfetto: the Perfetto UI, offline",
                "metrics": "JSON Lines: kvscope.load(path).steps / .requests"}


def _watch(run, quiet: bool) -> None:
    """Follow the run from the main thread: a tqdm bar of finished requests (a total known from the start:
    output tokens are not, as EOS ends requests early) once the model is loaded; tokens in its postfix."""
    bar, seen, tokens, shown_loading = None, 0, 0, False
    try:
        while not run.done:
            time.sleep(0.1)
            if quiet:
                continue
            try:
                if run.status is RunStatus.LOADING and not shown_loading:
                    print("loading the model ...", flush=True)
                    shown_loading = True
                if bar is None and run.status is RunStatus.RUNNING and run.workload:
                    from tqdm.auto import tqdm

                    bar = tqdm(total=len(run.workload), unit="req", desc="requests", dynamic_ncols=True)
                records = run.records
                if bar is None or len(records) <= seen:
                    continue
                new = records[seen:]
                seen = len(records)
                last = new[-1]
                tokens += sum(r.num_output_tokens for r in new)
                bar.update(sum(r.num_finished for r in new))
                bar.set_postfix_str(f"{tokens} tok out, running {last.num_running}, waiting {last.num_waiting}, "
                                    f"KV {last.kv.block_usage:.0%}", refresh=False)
            except OSError:  # a hung-up terminal (SIGHUP): stop showing, go on watching
                quiet = True
    finally:
        if bar is not None:
            with suppress(OSError):  # a hung-up terminal (SIGHUP)
                bar.update(max(0, run.num_finished - bar.n))  # aborted at the end: no step record says so
                bar.refresh()
                bar.close()


COMMAND = Command(
    name="run",
    help="run any model on your prompts or a synthetic workload",
    description="Run a model on the kvscope engine with progress, a summary table, a "
                "report, a Perfetto trace and a metrics file. The options are those of %kvscope "
                "(kvscope/options/run.py), with --out for the files' names instead of the dashboard's.",
    epilog=EPILOG_RUN,
    add_options=_add_options,
    run=cmd_run,
)
