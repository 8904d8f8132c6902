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
