"""The parser base of ``%kvscope``, ``%kvscope sweep`` and ``%kvscope watch``: refusals are one
``UsageError`` line (IPython's error for a bad magic line), and ``--help`` prints the help and raises
``HelpShown`` instead of leaving the kernel."""

from __future__ import annotations

import argparse
import shlex

from IPython.core.error import UsageError

from kvscope.options.parser import OptionError, OptionParser


class HelpShown(Exception):
    """``--help`` printed the help; there is nothing to run."""


class MagicParser(OptionParser):
    """A magic's parser: refusals are ``OptionError``s, and ``--help`` prints without leaving the kernel."""

    def __init__(self, prog: str, description: str, **kwargs) -> None:
        super().__init__(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                         **kwargs)

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            print(message, end="")
        raise HelpShown

    def parse_line(self, line: str) -> argparse.Namespace:
        """The options of a magic's line, split the POSIX way (quotes hold spaces); ``UsageError`` with the
        reason, ``HelpShown`` after ``--help``."""
        try:
            argv = shlex.split(line)
        except ValueError as exc:  # an unclosed quote
            raise UsageError(f"cannot split the options: {exc} (quote a value with spaces, like "
                             f"--prompts \"my file.txt\")") from None
        try:
            return self.parse_args(argv)
        except OptionError as exc:
            raise UsageError(str(exc)) from None


def launch(run, args: argparse.Namespace):
    """Start a ``LiveRun`` made from a magic's line: show its dashboard (unless ``-q``), block with ``--wait``,
    return it with ``-o`` (``%kvscope`` and ``%kvscope simulate`` alike)."""
    from kvscope.magic.history import HISTORY

    run.start()
    HISTORY.started(run)  # %kvscope show displays it again; older dashboards say a newer run exists
    if not args.quiet:
        from IPython.display import display

        display(run)
        HISTORY.displayed(run)
    if args.wait:
        _wait(run, args.quiet)
    return run if args.return_run else None


def _wait(run, quiet: bool) -> None:
    try:
        run.wait()
    except KeyboardInterrupt:
        written = "".join(f"; {kind}: {path}" for kind, path in run.files.written.items())
        print(f"interrupted: the run was stopped after {run.step} steps{written}")
        return
    except ValueError as exc:
        if run.engine is None:  # the model or the configuration was refused: nothing ran
            raise UsageError(str(exc)) from None
        raise
    if quiet:
        return
    s = run.summary() if run.records else {}
    line = f"{run.status_text}: {run.num_submitted} requests, {run.step} steps"
    if s.get("output_tokens_per_s") == s.get("output_tokens_per_s") and "output_tokens_per_s" in s:
        line += f", {s['output_tokens_per_s']:.1f} output tokens/s"
    for kind, path in run.files.written.items():
        line += f"; {kind}: {path}"
    for kind, why in run.files.errors.items():
        line += f"; could not write {kind}: {why}"
    failed = [o.error for o in run.outputs if o.finish_reason == "error"]
    if failed:
        line += f"; {len(failed)} request{'s' * (len(failed) > 1)} failed (first: {failed[0]})"
    print(line)
