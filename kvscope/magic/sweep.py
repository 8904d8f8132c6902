"""``%kvscope sweep ...``: a sweep from a notebook cell (``kvscope.runs.background.sweep``), shown live.

The line takes the options of ``kvscope sweep`` (one run option given a comma-separated list) plus the
notebook's own: ``--html`` / ``--csv`` (files written when the sweep ends), ``--wait``, ``-q`` and ``-o``
(return the ``Sweep``, a ``Comparison`` that fills in as runs finish). Like ``%kvscope``, it returns at
once: the runs go on a background thread while the cell shows the status, the table filling in and the
current run's dashboard.
"""

from __future__ import annotations

from IPython.core.error import UsageError

from kvscope.magic.base import HelpShown, MagicParser
from kvscope.options.run import MAGIC, OptionError, out_path
from kvscope.options.simulate import add_simulate_options
from kvscope.options.sweep import add_sweep_options
from kvscope.runs.background.sweep import Sweep, plan_from_args

DESCRIPTION = """\
Run the same seeded workload once per value of one run option and compare the runs, live. Every
option of %kvscope that takes a value also takes a comma-separated list; exactly one gets two or more.

Examples::

  %kvscope sweep --block-size 8,16,32,64 --requests 32 --num-blocks 256
  cmp = %kvscope sweep --prefix-caching on,off --shared-prefix 64 --html pc.html -o
  cmp.wait().table"""


def build_parser() -> MagicParser:
    parser = MagicParser("%kvscope sweep", DESCRIPTION)
    add_sweep_options(parser, MAGIC)
    add_simulate_options(parser, switch=True)
    out = parser.add_argument_group("outputs and display")
    out.add_argument("--html", type=out_path, default=None, metavar="PATH", help="write the comparison at the end")
    out.add_argument("--csv", type=out_path, default=None, metavar="PATH", help="write the summary as CSV at the end")
    out.add_argument("--wait", "-w", action="store_true", help="block until every run is over")
    out.add_argument("-q", "--quiet", action="store_true", help="no live display")
    out.add_argument("-o", "--return-sweep", action="store_true",
                     help="return the sweep (a Comparison filling in): cmp = %%kvscope sweep ... -o")
    return parser


def magic_sweep(line: str, cell: str | None = None) -> Sweep | None:
    """What ``%kvscope sweep LINE`` does (``%%kvscope sweep``: the cell's lines are the prompts);
    ``UsageError`` for a bad line, before anything starts."""
    if cell is not None and not cell.strip():
        raise UsageError("the %%kvscope sweep cell is empty: write one prompt per line, or use %kvscope sweep")
    try:
        args = build_parser().parse_line(line)
        plan = plan_from_args(args, cell)
    except HelpShown:
        return None
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    sweep = Sweep(plan, dashboard=not args.quiet, html=args.html, csv=args.csv).start()
    if not args.quiet:
        from IPython.display import display

        display(sweep)
    if args.wait:
        try:
            sweep.wait()
        except KeyboardInterrupt:
            print(f"interrupted: {sweep.status_text}")
        if not args.quiet:
            written = "".join(f"; {kind}: {path}" for kind, path in sweep.written.items())
            print(sweep.status_text + written)
    return sweep if args.return_sweep else None
