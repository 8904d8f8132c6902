"""``%kvscope watch URL ...``: a running vLLM server (or a fleet) watched live from a notebook cell.

The line takes the options of ``kvscope watch`` (``kvscope.options.watch``) plus the notebook's own:
``--wait`` (block until the watch ends: ``--duration``, or the kernel's interrupt; a watch that fails
then fails the cell with its one line), ``-q`` (no dashboard)
and ``-o`` (return the ``WatchRun``). Like ``%kvscope`` it returns at once: the watch polls on a background
thread while the dashboard updates. A server that does not answer shows as the dashboard's error state
("failed: cannot reach ..."); a bad option raises ``UsageError`` before anything starts.
"""

from __future__ import annotations

from IPython.core.error import UsageError

from kvscope.magic.base import HelpShown, MagicParser
from kvscope.options.watch import add_watch_options, watch_kwargs
from kvscope.runs.background.status import Outputs
from kvscope.runs.background.watch import WatchRun
from kvscope.utils.files import check_outputs

DESCRIPTION = """\
Watch running vLLM servers live: KV cache usage, the prefix tree of cached blocks, latency
distributions, one lane per engine; the same files as a kvscope run.

Examples::

  %kvscope watch http://127.0.0.1:8000 --kv-events tcp://127.0.0.1:5557
  w = %kvscope watch http://127.0.0.1:8000 --plugin-log /tmp/steps.jsonl --html watch.html -o
  w.stop(); w.summary()"""


def build_parser() -> MagicParser:
    parser = MagicParser("%kvscope watch", DESCRIPTION)
    add_watch_options(parser)
    out = parser.add_argument_group("display")
    out.add_argument("--wait", "-w", action="store_true", help="block until the watch ends (--duration, or interrupt)")
    out.add_argument("-q", "--quiet", action="store_true", help="no live dashboard")
    out.add_argument("-o", "--return-run", action="store_true", help="return the watch: w = %%kvscope watch ... -o")
    return parser


def magic_watch(line: str) -> WatchRun | None:
    """What ``%kvscope watch LINE`` does; ``UsageError`` for a bad line, before anything starts."""
    try:
        args = build_parser().parse_line(line)
        check_outputs({f"--plugin-log {p}": p for p in args.plugin_log},
                      {"--trace": args.trace, "--metrics": args.metrics, "--html": args.html})
        run = WatchRun(**watch_kwargs(args), outputs=Outputs(trace=args.trace, metrics=args.metrics, html=args.html),
                       dashboard=not args.quiet)
    except HelpShown:
        return None
    except ValueError as exc:  # a bad combination (an output that is a plugin log, ...)
        raise UsageError(str(exc)) from None
    run.start()
    if not args.quiet:
        from IPython.display import display

        display(run)
    if args.wait:
        try:
            run.wait()
        except KeyboardInterrupt:
            pass
        except Exception as exc:  # the watch failed (its dashboard says so too): the cell fails, like %kvscope's
            raise UsageError(str(exc)) from None
        written = "".join(f"; {kind}: {path}" for kind, path in run.files.written.items())
        print(run.status_text + written)
    return run if args.return_run else None
