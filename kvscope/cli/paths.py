"""The command line's inputs and outputs, checked before any work: ``input_run`` (a saved run to read) and
``check_output`` (a file to write: ``kvscope.utils.files.check_output_path``, and never one of the inputs,
by identity: links and other spellings count). Errors are ``CLIError``s (exit 2)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from kvscope.cli.parser import CLIError
from kvscope.utils.files import check_output_path, same_file


def input_run(text: str) -> Path:
    """A saved run's file (a trace or metrics file) that exists; ``CLIError`` naming it if not."""
    path = Path(text).expanduser()
    if not path.is_file():
        why = "is a folder" if path.is_dir() else "does not exist"
        raise CLIError(f"{text!r} {why}; give a .trace.json or .metrics.jsonl written by kvscope")
    return path


def check_output(text: str | os.PathLike, kind: str = "", flag: str = "", inputs: Iterable[Path] = (),
                 label: str = "") -> Path:
    """A path the command may write: its folder exists and takes files, it is no folder or device, and no
    input (``kind``, ``label``, ``flag``: how the messages name it and the option to change)."""
    try:
        path = check_output_path(text, kind=kind, label=label, flag=flag)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    for source in inputs:
        if same_file(path, source):
            raise CLIError(f"the {kind} path {str(text)!r} is the input {str(source)!r}; writing it would destroy "
                           f"that run: choose another {flag} path")
    return path


def different(output: Path, csv: Path) -> None:
    """``-o`` and ``--csv`` must be two files."""
    if same_file(output, csv) or output.resolve() == csv.resolve():
        raise CLIError("-o and --csv name the same file; give them different paths")
