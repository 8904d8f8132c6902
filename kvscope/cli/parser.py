"""The command line's error and parser: ``CLIError`` (a one-line failure with an exit code) and ``Parser``,
whose usage errors are ``CLIError``s with exit code 2.

The run options themselves are declared once, in ``kvscope.options``, for ``kvscope run`` and ``%kvscope``
alike; each command's parser is a ``Parser`` (``kvscope.cli.main.build_parser``).
"""

from __future__ import annotations

from kvscope.options.parser import OptionParser


class CLIError(Exception):
    """A failure to report in one line; ``code`` 2 for usage errors, 1 for runtime failures."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class Parser(OptionParser):
    """Reports a usage error as one line naming the problem and where help is, exit code 2."""

    def error(self, message: str):
        raise CLIError(self.refusal(message), code=2)
