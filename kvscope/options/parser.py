"""``OptionError`` (a run option refused, in one line) and ``OptionParser`` (an argparse parser that refuses
with one), the base of every face's parser: the command line's (``kvscope.cli.parser``) and the magic's
(``kvscope.magic.base``). Standard library only."""

from __future__ import annotations

import argparse


class OptionError(argparse.ArgumentTypeError, ValueError):
    """A run option refused, in one line naming the problem. An ``ArgumentTypeError`` too, so argparse
    reports the text as it is when a parser below is an option's ``type``."""


class OptionParser(argparse.ArgumentParser):
    """An argparse parser that refuses a bad command line with one ``OptionError`` line naming the problem
    and where the help is (each face catches it or overrides ``error``). No abbreviated options: ``--out``
    would be ``--output-len`` in the magic, which has no ``--out`` (found by fuzzing both faces)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def refusal(self, message: str) -> str:
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)  # one line, whatever argv holds
        if message.endswith("expected one argument"):
            message += " (a value that starts with '-' is read as an option; negative sizes are not allowed)"
        return f"{message} (see '{self.prog} --help')"

    def error(self, message: str):
        raise OptionError(self.refusal(message))
