"""The ``kvscope`` command line: the parser, the subcommand registry (``COMMANDS``: one ``Command`` per module,
``kvscope.cli.command``) and the exit codes.

Exit codes: 0 done; 1 the work itself failed (a model that fails mid-run, a file that is not a kvscope
trace, a disk error); 2 a usage error (a bad option, a missing file, an unknown model), caught before
any work starts where possible; 128 + the signal's number when a run is stopped by a signal (130
SIGINT / Ctrl-C, 143 SIGTERM, 129 SIGHUP; the files are still written). Errors are one line on stderr
naming the problem and the fix; ``KVSCOPE_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from kvscope._version import __version__
from kvscope.cli import calibrate, compare, demo, explain, plan, run, search, simulate, sweep, view, watch
from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError, Parser

EPILOG_MAIN = """\
commands:
  kvscope demo                    the main job: a real model (SmolLM2-135M) on a mixed workload, with a
                                  progress bar; writes kvscope-demo.html (report) and kvscope-demo.trace.json
  kvscope run --model M ...       the same for your model and prompts (options as in %kvscope)
  kvscope plan --model llama-7b --gpu-mem 40GiB --weights 14GiB --reserve 4GiB
                                  how many requests fit, static reservation vs paged KV
  kvscope view RUN.trace.json -o report.html
                                  an HTML report from a saved trace or metrics file
  kvscope view RUN.trace.json --perfetto
                                  the trace in a local Perfetto UI (served on 127.0.0.1, offline)
  kvscope compare A.trace.json B.trace.json -o cmp.html
                                  runs side by side: summary ratios, overlaid series, page maps
  kvscope sweep --block-size 8,16,32,64 -o sweep.html
                                  the same seeded workload once per value; a comparison + CSV
  kvscope watch http://127.0.0.1:8000 --kv-events tcp://127.0.0.1:5557 --html watch.html
                                  a running vLLM server (or several) from outside: live status, files

'kvscope COMMAND --help' explains each command."""

# The subcommands, in the order ``kvscope --help`` lists them.
COMMANDS: dict[str, Command] = {c.name: c for c in (demo.COMMAND, run.COMMAND, plan.COMMAND, view.COMMAND,
                                                     compare.COMMAND, sweep.COMMAND, watch.COMMAND,
                                                     simulate.COMMAND, calibrate.COMMAND, explain.COMMAND,
                                                     search.COMMAND)}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvscope", description="An interactive profiler for paged-KV LLM inference.",
                    epilog=EPILOG_MAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kvscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    parser.commands = sub.choices  # name -> subparser, so errors can name the command
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvscope`` console script; returns the exit code."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the command's parser, so the hint points at its --help
            parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command is None:
            parser.print_help()
            raise CLIError("give a command: demo, run, plan, view, compare, sweep or watch")
        return COMMANDS[args.command].run(args)
    except CLIError as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("kvscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kvscope plan ... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug or an unforeseen failure: one line unless debugging
        if os.environ.get("KVSCOPE_DEBUG"):
            traceback.print_exc()
        print(f"kvscope: error: {type(exc).__name__}: {exc} (set KVSCOPE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
