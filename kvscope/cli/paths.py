"""The command line's inputs and outputs, checked before any work: ``input_run`` (a saved run to read),
``check_output`` (a file to write: ``kvscope.utils.files.check_output_path``, and never one of the inputs,
by identity: links and other spellings count) and ``output_folder`` (an output's own folder, made if it is
the only one missing). Errors are ``CLIError``s (exit 2)."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Iterable
from contextlib import suppress
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


def output_folder(folder: Path, flag: str, quiet: bool = False) -> None:
    """Make an output's folder (``runs`` of ``--out runs/a``) if it is missing and its own parent exists,
    saying so on stderr unless ``quiet``: only that one folder, never a chain of them (a typo such as
    ``--out rnus/x/a`` must not leave folders behind), removed at exit if still empty (the run was refused).
    ``CLIError`` naming the folder otherwise."""
    if folder.is_dir():
        return
    shown = str(folder)
    if folder.exists():
        raise CLIError(f"{shown!r} in {flag} is a file, not a folder; choose another {flag} path")
    if not folder.parent.is_dir():
        raise CLIError(f"the folder of {flag} {shown!r} does not exist, nor does {str(folder.parent)!r}: kvscope "
                       f"makes only an output's own folder; create the others or choose another {flag} path")
    try:
        folder.mkdir()
    except FileExistsError:  # made meanwhile by another process: fine if it is a folder
        if not folder.is_dir():
            raise CLIError(f"{shown!r} in {flag} is a file, not a folder; choose another {flag} path") from None
    except OSError as exc:
        raise CLIError(f"cannot create the folder {shown!r} for {flag} ({exc.strerror or exc}); "
                       f"create it or choose another {flag} path") from None
    atexit.register(_remove_if_empty, folder)  # a run refused after this check leaves nothing behind
    if not quiet:
        print(f"kvscope: created the folder {shown!r} for {flag}", file=sys.stderr, flush=True)


def _remove_if_empty(folder: Path) -> None:
    with suppress(OSError):  # not empty (the run wrote its files), or gone
        folder.rmdir()
