"""``Command``: one ``kvscope`` subcommand, declared as data in the shape of vLLM's ``CLISubcommand``: its
``name``, a one-line ``help``, the ``description`` and ``epilog`` of its ``--help``, ``add_options(parser)``
that declares its options, and ``run(args)`` that does the work and returns the exit code (failures are
``CLIError``s). Each command module ends with one (``COMMAND``); ``kvscope.cli.main.COMMANDS`` lists them, in
the order ``kvscope --help`` shows them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    help: str
    description: str
    add_options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: str | None = None

    def add_parser(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        """The command's parser, named and helped as declared (epilogs keep their line breaks)."""
        parser = subparsers.add_parser(self.name, help=self.help, description=self.description, epilog=self.epilog,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_options(parser)
        return parser
