"""Writing files safely: ``atomic_write`` (readers never see half a file) and ``unwritable`` (why a
path could not be written, asked before a long run rather than after it).

Standard library only, so a face (the CLI, the magic) can check its paths without importing torch.

The temp file is created with ``os.open(..., 0o666)``, so the kernel applies the process umask exactly
as ``open()`` would; nothing here reads or changes the umask (``os.umask`` can only be read by setting
it, which races with other threads creating files).
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temp file next to ``path`` (a hidden name), open for writing: (fd, its path)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, _TEMP_FLAGS, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temp file name", str(path.parent))


def atomic_write(path: str | os.PathLike, write: Callable[[IO[str]], None]) -> Path:
    """Write via a temp file in the same folder, flush + fsync, then ``os.replace``: readers see the old
    file or the whole new one, never a half-written one. Creates missing parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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
    tmp.unlink()
    return None
