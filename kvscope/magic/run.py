"""``%kvscope`` / ``%%kvscope``: start a live run from a notebook cell.

``%load_ext kvscope`` registers the magic and loads BokehJS into the page (inline, works offline).
The magic splits its line the POSIX way (``shlex``: quotes hold spaces, ``--prompts "my file.txt"``),
parses it with the run options of ``kvscope.options.run`` (those of ``kvscope run``; ``%kvscope?`` and
``%kvscope --help`` show them all), checks everything it can before anything starts (a bad option raises
``UsageError`` with the reason, the same line ``kvscope run`` prints), then starts a ``LiveRun`` and returns
at once: the engine steps in a background thread and the dashboard updates while the notebook stays usable
(widget messages and button clicks are only delivered while the kernel is idle). ``--wait`` blocks until
the run is over instead.
"""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from kvscope.magic.base import HelpShown, MagicParser, launch
from kvscope.options.run import MAGIC, OptionError, add_run_options
from kvscope.runs.background.live import LiveRun
from kvscope.runs.setup.engine_cache import ENGINES, EngineLease
from kvscope.runs.setup.prepare import prepare
from kvscope.runs.setup.spec import RunSpec

DESCRIPTION = """\
Run a model on the kvscope engine in the background and watch it live.

Examples::

  %kvscope --requests 32 --output-len 64 --num-blocks 256
  run = %kvscope --model smollm2 --prompts prompts.txt --html report.html -o
  %%kvscope --model smollm2 --wait
  Explain the KV cache in one sentence.
  Write a haiku about GPUs.

A rerun with the same model and engine settings reuses the loaded model (reset: the run records what a
fresh engine would). ``%kvscope show`` displays the running (or last) run's dashboard again, after a page
reload; ``%kvscope release`` lets go of the loaded models this kernel keeps.

The returned run (``-o``) has ``wait()``, ``stop()``, ``pause()``, ``resume()``, ``outputs``,
``steps`` and ``requests`` DataFrames, ``summary()``, ``save_trace()``, ``save_metrics()`` and
``save_html()``, and shows the dashboard when displayed."""


def build_parser() -> MagicParser:
    parser = MagicParser("%kvscope", DESCRIPTION, add_help=False)
    parser.add_argument("-h", "--help", action="help", help="show this help (as %%kvscope? does)")
    add_run_options(parser, MAGIC)
    return parser


def parse_line(line: str) -> argparse.Namespace:
    """The magic's options from its line (``UsageError`` with the reason; ``HelpShown`` after ``--help``)."""
    return build_parser().parse_line(line)


@magics_class
class KVScopeMagics(Magics):
    @line_cell_magic
    def kvscope(self, line: str, cell: str | None = None):
        head, _, rest = line.strip().partition(" ")
        if head == "sweep":  # %kvscope sweep --block-size 8,16,32 ... (kvscope.magic.sweep)
            from kvscope.magic.sweep import magic_sweep

            return magic_sweep(rest, cell)
        if head == "search":  # %kvscope search --space ... --slo ... (kvscope.magic.search)
            from kvscope.magic.search import magic_search

            return magic_search(rest, cell)
        if head == "simulate":  # %kvscope simulate --step-model step.json ... (kvscope.magic.simulate)
            from kvscope.magic.simulate import magic_simulate

            return magic_simulate(rest, cell)
        if head in ("show", "release"):  # %kvscope show / %kvscope release (kvscope.magic.kept)
            if cell is not None:
                raise UsageError(f"%%kvscope {head} takes no cell: use the line magic, %kvscope {head}")
            from kvscope.magic.kept import magic_release, magic_show

            return (magic_show if head == "show" else magic_release)(rest)
        if head == "watch":  # %kvscope watch http://127.0.0.1:8000 ... (kvscope.magic.watch)
            if cell is not None:
                raise UsageError("%%kvscope watch takes no cell: use the line magic, %kvscope watch URL ...")
            from kvscope.magic.watch import magic_watch

            return magic_watch(rest)
        try:
            args = parse_line(line)
        except HelpShown:
            return None
        return launch(build_run(args, cell), args)

    kvscope.__doc__ = build_parser().format_help()  # what %kvscope? shows


def build_run(args: argparse.Namespace, cell: str | None = None) -> LiveRun:
    """A ``LiveRun`` (not started) from parsed options; every check that can fail early runs here."""
    if cell is not None and not cell.strip():
        raise UsageError("the %%kvscope cell is empty: write one prompt per line, or use %kvscope")
    try:
        setup = prepare(RunSpec.from_args(args, cell=cell))
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    # the model loaded by an earlier run with these settings is reused (runs/setup/engine_cache.py)
    return LiveRun(EngineLease(ENGINES, setup), setup.workload, **setup.run_options(), dashboard=not args.quiet,
                   dashboard_options={"refresh_hz": args.refresh, "rollover": args.rollover})


def load_ipython_extension(ipython) -> None:
    """Register the magics; in a notebook kernel also load BokehJS inline (offline-safe), which the
    dashboard's ``BokehModel`` widgets need in the page."""
    from kvscope.magic.history import HISTORY

    ipython.register_magics(KVScopeMagics)
    if HISTORY.pre_run_cell not in ipython.events.callbacks["pre_run_cell"]:
        ipython.events.register("pre_run_cell", HISTORY.pre_run_cell)  # which cell runs (history.py)
    if getattr(ipython, "kernel", None) is not None:
        from kvscope.widgets.bokehjs import ensure_bokehjs

        ensure_bokehjs()


def unload_ipython_extension(ipython) -> None:
    from kvscope.magic.history import HISTORY

    if HISTORY.pre_run_cell in ipython.events.callbacks["pre_run_cell"]:
        ipython.events.unregister("pre_run_cell", HISTORY.pre_run_cell)
    magics = ipython.magics_manager.magics
    for kind in ("line", "cell"):
        magics[kind].pop("kvscope", None)
