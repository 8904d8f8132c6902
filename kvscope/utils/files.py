"""Writing files safely: ``atomic_write`` (readers never see half a file), ``unwritable`` (why a path could
not be written, asked before a long run rather than after it), ``check_output_path`` (the one check of a
path a command will write: every face and option uses it) and ``check_outputs`` (no output is an input,
another output, a folder or a device).

Standard library only, so a face (the CLI, the magic) can check its paths without importing torch.

The temp file is created with ``os.open(..., 0o666)``, so the kernel applies the process umask exactly
as ``open()`` would; nothing here reads or changes the umask (``os.umask`` can only be read by setting
it, which races with other threads creating files). Temp files still being written when the interpreter
exits (a daemon thread cut off by a second Ctrl-C) are removed at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_PENDING: set[str] = set()  # temp files created and not yet renamed or removed
_exiting = False
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


class OutputPathError(ValueError):
    """An output path refused before any work (``check_outputs``), in one line naming it."""


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temp file next to ``path`` (a hidden name), open for writing: (fd, its path)."""
    if _exiting:
        raise OSError(errno.ECANCELED, "the interpreter is exiting", str(path))
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, _TEMP_FLAGS, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:  # named after the user's path: the temp file is ours
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        _PENDING.add(str(tmp))
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no free temp file name", str(path.parent))


def _remove(tmp: Path) -> None:
    _PENDING.discard(str(tmp))
    tmp.unlink(missing_ok=True)


@atexit.register
def _remove_pending() -> None:
    """At exit: remove the temp files of writes that never finished (their threads die with the process),
    and start no new one."""
    global _exiting
    _exiting = True
    for name in list(_PENDING):
        with contextlib.suppress(OSError):
            os.unlink(name)


def not_a_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists but is not a regular file ("a folder", "a character device", ...),
    else ``None`` (a regular file, a link to one, or nothing yet)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:  # cannot look (permissions, a loop of links): the write will say why
        return None
    return next((what for test, what in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def _refuse_non_file(path: Path) -> None:
    what = not_a_file(path)
    if what is not None:
        code = errno.EISDIR if what == "a folder" else errno.EINVAL
        raise OSError(code, f"is {what}, not a regular file; kvscope writes (and replaces) regular files only",
                      str(path))


def atomic_write(path: str | os.PathLike, write: Callable[[IO[str]], None]) -> Path:
    """Write via a temp file in the same folder, flush + fsync, then ``os.replace``: readers see the old
    file or the whole new one, never a half-written one. Creates missing parent folders. Refuses (``OSError``
    naming ``path``) a path that is a folder, a device, a FIFO or a socket: ``os.replace`` would put a
    regular file in its place (as root even over ``/dev/null``). Errors name ``path``, never the temp file."""
    path = Path(path)
    _refuse_non_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = _create_temp(path)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        _refuse_non_file(path)  # it may have become one while we wrote
        os.replace(tmp, path)
        _PENDING.discard(str(tmp))
    except BaseException as exc:
        if tmp is not None:
            _remove(tmp)
        if isinstance(exc, OSError) and tmp is not None and str(tmp) in (exc.filename, exc.filename2):
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    return path


def unwritable(path: str | os.PathLike) -> str | None:
    """Why ``atomic_write(path, ...)`` would fail to create its file (the folder is missing, read-only,
    not a folder), or ``None``: it tries what ``atomic_write`` does, a temp file in the same folder."""
    path = Path(path)
    try:
        fd, tmp = _create_temp(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    _remove(tmp)
    return None


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` are one file: the same device and inode when both exist (links, ``..``,
    other spellings, hard links), else the same path once links are resolved (two outputs not written yet)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # at least one does not exist (yet)
        pass
    if os.path.exists(a) or os.path.exists(b):
        return False
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


Paths = Mapping[str, "str | os.PathLike | None"] | Iterable[tuple[str, "str | os.PathLike | None"]]


def check_outputs(inputs: Paths, outputs: Paths) -> None:
    """Refuse, before any work, outputs that would destroy something: an output that is an input or another
    output (by identity, ``same_file``), or that exists and is no regular file (a folder, ``/dev/null``, a FIFO).
    Each path comes with what the messages call it (``"--html"``, ``"the trace"``), as a mapping or as
    (label, path) pairs (labels may repeat: ``[("--prompts", a), ("--prompts", b)]``); ``None`` paths are
    skipped. Raises ``OutputPathError`` (a ``ValueError``) in one line naming both paths."""
    inputs = list(inputs.items() if isinstance(inputs, Mapping) else inputs)
    outputs = outputs.items() if isinstance(outputs, Mapping) else outputs
    given = [(label, path) for label, path in outputs if path is not None]
    for i, (label, path) in enumerate(given):
        what = not_a_file(path)
        if what is not None:
            raise OutputPathError(f"{label} {str(path)!r} is {what}, not a regular file; give a file name "
                                  "(kvscope writes only regular files)")
        for in_label, source in inputs:
            if source is not None and same_file(path, source):
                raise OutputPathError(f"{label} {str(path)!r} is the same file as {in_label} {str(source)!r}; "
                                      "writing it would destroy that input: choose another path")
        for other_label, other in given[:i]:
            if same_file(path, other):
                raise OutputPathError(f"{other_label} {str(other)!r} and {label} {str(path)!r} are the same file; "
                                      "one would overwrite the other: give each output its own path")


def check_output_path(text: str | os.PathLike, *, kind: str = "", label: str = "", flag: str = "",
                      shown: str | None = None) -> Path:
    """The path (``~`` expanded) of a file a command will write, refused before any work (``OutputPathError``,
    one line) if it is a folder, a device or a FIFO, if its folder does not exist, or if no file can be
    created there. How the messages name it: ``kind`` ("trace": "the trace path 'x'" / "the trace file 'x'"),
    else ``label`` ("-o": "-o 'x'"), else the path alone; ``shown`` the path as written (default its repr);
    ``flag`` the option to change in the fix ("choose another -o path"; without it, "choose another folder")."""
    path = Path(text).expanduser()
    shown = shown or repr(str(text))
    named = f"the {kind} path {shown}" if kind else f"{label} {shown}" if label else shown
    what = not_a_file(path)
    if what == "a folder":
        raise OutputPathError(f"{named} is a folder; give a file name" + (f" for {flag}" if flag else ""))
    if what is not None:
        fix = f"choose another {flag} path" if flag else "give a file name (kvscope writes only regular files)"
        raise OutputPathError(f"{named} is {what}, not a regular file; {fix}")
    if not path.parent.is_dir():
        raise OutputPathError(f"the folder of {shown} does not exist"
                              + (f"; create it or choose another {flag} path" if flag else ""))
    why = unwritable(path)
    if why is not None:
        filed = f"the {kind} file {shown}" if kind else named
        raise OutputPathError(f"cannot write {filed} ({why}); choose another {f'{flag} path' if flag else 'folder'}")
    return path
