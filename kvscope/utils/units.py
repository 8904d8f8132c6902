"""Byte sizes, read and printed: ``parse_bytes`` ('40GiB' -> bytes) and ``fmt_bytes`` (bytes -> '40 GiB').

Binary units for both spellings (``GB`` == ``GiB`` == 2**30 bytes), as the course's worked examples use
them. Standard library only: the capacity planner, the option parsers and the host checks use it without
torch.
"""

from __future__ import annotations

import re

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
_UNITS = {"": 1, "B": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}


def parse_bytes(text: str | int | float) -> int:
    """'40GiB', '512MB', '1.5G', 1024 -> bytes. Binary units for both spellings (GB == GiB)."""
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*", text.upper())
    if match is None:
        raise ValueError(f"cannot read {text!r} as a size; write it like '40GiB', '512MiB' or a byte count")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return int(value)


def fmt_bytes(n: float) -> str:
    """1024-based, up to 3 significant digits: 524288 -> '512 KiB', 23622320128 -> '22 GiB'."""
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            text = f"{n:.0f}" if unit == "B" or n == int(n) or n >= 100 else f"{n:.3g}"
            return f"{sign}{text} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
