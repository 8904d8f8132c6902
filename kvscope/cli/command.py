"""``Command``: one ``kvscope`` subcommand, in the shape of vLLM's ``CLISubcommand``: a ``name``, a one-line
``help``, ``add_parser(subparsers)`` that declares its options, and ``run(args)`` that does the work and
returns the exit code (failures are ``CLIError``s). Each command module defines one (``COMMAND``);
``kvscope.cli.main.COMMANDS`` lists them, in the order ``kvscope --help`` shows them."""

from __future__ import annotations

import argparse


class Command:
    """One subcommand; subclasses set ``name`` and ``help`` and define ``add_parser`` and ``run``."""

    name: str = ""
    help: str = ""

    def add_parser(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        raise NotImplementedError

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError

    def subparser(self, subparsers: argparse._SubParsersAction, description: str,
                  epilog: str | None = None) -> argparse.ArgumentParser:
        """The command's parser, named and helped as the command says (epilogs keep their line breaks)."""
        return subparsers.add_parser(self.name, help=self.help, description=description, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
