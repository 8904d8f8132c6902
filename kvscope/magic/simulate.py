"""``%kvscope simulate ...``: a simulation (``kvscope simulate``) live in a notebook, with the same dashboard
as ``%kvscope`` (marked SIMULATED). The line takes ``kvscope simulate``'s options (the run options plus
``--step-model`` / ``--gpu`` / ``--replay`` / ``--dtype`` / ``--static``) and the notebook's own (``--wait``,
``-q``, ``-o``, ``--refresh``, ``--rollover``); a ``%%kvscope simulate`` cell's lines are the prompts."""

from __future__ import annotations

from IPython.core.error import UsageError

from kvscope.magic.base import HelpShown, MagicParser, launch
from kvscope.options.run import MAGIC, OptionError, add_run_options
from kvscope.options.simulate import add_simulate_options, simulate_fields
from kvscope.runs.background.live import LiveRun
from kvscope.runs.setup.simulated import SimSpec, prepare_simulation
from kvscope.runs.setup.spec import RunSpec

DESCRIPTION = """\
Simulate a run live: kvscope's own scheduler and KV cache on a virtual clock, the model replaced by a
step-time model (no weights, no forward pass).

Examples::

  %kvscope simulate --step-model step.json --requests 500 --rate 20 --block-size 32
  run = %kvscope simulate --gpu a100-40gb --model llama-7b --max-model-len 2048 -n 2000 --rate 10 -o"""


def build_parser() -> MagicParser:
    parser = MagicParser("%kvscope simulate", DESCRIPTION)
    add_simulate_options(parser)
    add_run_options(parser, MAGIC)
    return parser


def magic_simulate(line: str, cell: str | None = None) -> LiveRun | None:
    """What ``%kvscope simulate LINE`` does; ``UsageError`` for a bad line, before anything starts."""
    try:
        args = build_parser().parse_line(line)
    except HelpShown:
        return None
    if cell is not None and not cell.strip():
        raise UsageError("the %%kvscope simulate cell is empty: write one prompt per line, or use %kvscope simulate")
    try:
        setup = prepare_simulation(RunSpec.from_args(args, cell=cell), SimSpec(**simulate_fields(args)))
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    if not args.quiet:
        for note in setup.notes:  # a replay: the run's settings it starts from, and what the what-if changed
            print(note)
    run = LiveRun(setup.make_engine, setup.workload, **setup.run_options(), dashboard=not args.quiet,
                  dashboard_options={"refresh_hz": args.refresh, "rollover": args.rollover})
    return launch(run, args)
