"""Tailing the plugin's JSONL (the line format is ``plugin_format.py``'s): new complete lines as dicts.

The file may not exist yet (the server has not started), may grow while it is read (a line cut in
the middle waits for its end), and may start again (truncated or replaced: read from its start).
A line that is not a JSON object is counted in ``num_malformed`` and skipped; so is one longer than
``MAX_LINE`` bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MAX_LINE = 1 << 20


class PluginLog:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.num_lines = 0
        self.num_malformed = 0
        self._pos = 0
        self._inode: tuple[int, int] | None = None
        self._partial = b""

    def read(self, max_bytes: int = 8 << 20) -> list[dict[str, Any]]:
        """The objects of the lines completed since the last call (at most about ``max_bytes`` read)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        ident = (st.st_dev, st.st_ino)
        if ident != self._inode or st.st_size < self._pos:  # a new file, or truncated: from its start
            self._inode, self._pos, self._partial = ident, 0, b""
        if st.st_size == self._pos:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read(max_bytes)
        except OSError:
            return []
        self._pos += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > MAX_LINE:
            self._partial = b""
            self.num_malformed += 1
        out = []
        for line in lines:
            if not line.strip():
                continue
            self.num_lines += 1
            obj = _parse(line)
            if obj is None:
                self.num_malformed += 1
            else:
                out.append(obj)
        return out


def _parse(line: bytes) -> dict[str, Any] | None:
    if len(line) > MAX_LINE:
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("type"), str) else None
