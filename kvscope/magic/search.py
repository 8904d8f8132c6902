"""``%kvscope search ...``: ``kvscope search`` in a notebook. The line takes the same options (``--space``, ``--slo``,
the workload, ``--gpu`` / ``--step-model``, ``--ray [ADDRESS]``, ``--workers``) plus ``--csv PATH`` and
``--html PATH`` (its run reports in ``PATH.runs/``: ``--reports front|all|none``); a progress bar fills in as
configurations finish, and the value is a ``SearchResult`` (its table shows as HTML; ``.table()`` a DataFrame,
``.serve_line()``, ``.save_html(path)``)."""

from __future__ import annotations

from IPython.core.error import UsageError

from kvscope.magic.base import HelpShown, MagicParser
from kvscope.options.run import MAGIC, OptionError, add_run_options
from kvscope.options.search import add_search_options, refused_run_options
from kvscope.options.simulate import add_simulate_options, simulate_fields
from kvscope.runs.setup.simulated import SimSpec
from kvscope.runs.setup.spec import OutputSpec, RunSpec
from kvscope.search.executors import RayMissing
from kvscope.search.session import SearchResult, prepare_search

DESCRIPTION = """\
Search configurations for the best goodput under a latency SLO, by simulation.

Examples::

  r = %kvscope search --space "max_num_seqs=32,128 replicas=1,2" --slo ttft_p99=0.5,itl_p99=0.05 --gpu a100 -n 500
  %kvscope search --space "block_size=16,32 pd=none,1P1D" --slo ttft_p90=1 --gpu h100 --model llama-7b --ray"""


def build_parser() -> MagicParser:
    parser = MagicParser("%kvscope search", DESCRIPTION)
    add_search_options(parser)
    add_simulate_options(parser)
    add_run_options(parser, MAGIC)
    parser.add_argument("--csv", metavar="PATH", help="write the table here too")
    return parser


def magic_search(line: str, cell: str | None = None) -> SearchResult | None:
    """What ``%kvscope search LINE`` does; ``UsageError`` for a bad line, before anything starts."""
    try:
        args = build_parser().parse_line(line)
    except HelpShown:
        return None
    if cell is not None:
        raise UsageError("%%kvscope search takes no cell: give --requests N (or --prompts FILE, --replay RUN)")
    given = [f for f in refused_run_options(args) if f != "--html"]
    if given:
        raise UsageError(f"%kvscope search sets the rate itself: leave out {', '.join(given)}")
    if args.reports != "front" and not args.html:
        raise UsageError(f"--reports {args.reports} chooses the run reports the page links: give --html PAGE.html too")
    try:
        search = prepare_search(args, RunSpec.from_args(args, outputs=OutputSpec()), SimSpec(**simulate_fields(args)))
    except (ValueError, OptionError) as exc:
        raise UsageError(str(exc)) from None
    from tqdm.auto import tqdm

    bar = tqdm(total=len(search.space), unit="config", desc="search", disable=args.quiet)
    try:
        result = search.run(lambda outcome: bar.update(1))
    except RayMissing as exc:
        raise UsageError(str(exc)) from None
    finally:
        bar.close()
    if args.csv:
        result.csv(args.csv)
    if args.html:
        result.save_html(args.html, args.reports)
    return result
