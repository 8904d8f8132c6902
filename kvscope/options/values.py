"""The value parsers of the options (argparse ``type``s): whole numbers, sizes, length ranges, seconds,
speculative decoding, output paths. Each refuses with one ``OptionError`` line naming the value.

Numbers are bounded here, where one line can name them, not deep inside (a seed torch cannot take, a size
that overflows to infinity, a delay threading cannot wait for, a workload too big to build). Standard
library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvscope.options.parser import OptionError
from kvscope.utils.files import check_output_path
from kvscope.utils.units import parse_bytes

INT64_MAX = 2**63 - 1
SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits
MAX_REQUESTS = 1_000_000  # a simulation of 10**6 requests is bounded in memory (docs/reliability.md)
MAX_TOKENS = 2**24  # a length of 16,777,216 tokens: beyond any model's context
MAX_STEP_DELAY = 60.0


def positive_int(text: str, limit: int = INT64_MAX) -> int:
    value = _whole_number(text, limit)
    if value < 1:
        raise OptionError(f"{_shown(text)} must be at least 1")
    return value


def nonneg_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise OptionError(f"{_shown(text)} must be 0 or more")
    return value


def num_requests(text: str) -> int:
    return positive_int(text, MAX_REQUESTS)


def tokens(text: str) -> int:
    """A token count >= 0 (a shared prefix)."""
    value = nonneg_int(text)
    if value > MAX_TOKENS:
        raise OptionError(f"{_shown(text)} is more than {MAX_TOKENS:,} tokens")
    return value


def int64(text: str) -> int:
    """Any whole number within 64 bits; the range is checked where the value is used (``top_k``)."""
    return _whole_number(text, INT64_MAX, what="invalid int value")


def seed(text: str) -> int:
    value = _whole_number(text, SEED_MAX, what="invalid int value")
    if value < 0:
        raise OptionError(f"{_shown(text)} must be 0 or more (a seed is 0 to 2**64 - 1)")
    return value


def _shown(text: str, limit: int = 40) -> str:
    """``text`` as an error message names it: whole up to ``limit`` characters, else its start and its length."""
    return repr(text) if len(text) <= limit else f"{text[:20]!r}... ({len(text):,} characters)"


PATH_SHOWN_MAX = 300  # a path is named whole in an error (the user must see which one), unless absurdly long


def _whole_number(text: str, limit: int = INT64_MAX, what: str = "") -> int:
    """``int(text)`` within ``-limit..limit``; ``what``: the refusal's wording for a non-number."""
    digits = text.strip().lstrip("+-").replace("_", "")
    if digits.isdigit() and len(digits.lstrip("0")) > len(str(limit)):  # before int(): it refuses 4,300+ digits
        raise OptionError(f"{_shown(text)} is too large (at most {limit:,})")
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{what}: {_shown(text)}" if what else f"{_shown(text)} is not a whole number") from None
    if abs(value) > limit:
        raise OptionError(f"{_shown(text)} is too large (at most {limit:,})")
    return value


def block_size(text: str) -> int:
    value = positive_int(text)
    if value & (value - 1) or value > 256:
        raise OptionError(f"{_shown(text)} must be a power of two between 1 and 256, like 16")
    return value


def size(text: str) -> int:
    """A positive size: '40GiB', '512MB', '1.5G' or bytes (binary units: GB == GiB), below 8 EiB."""
    if len(text) > 100:
        raise OptionError(f"cannot read {_shown(text)} as a size; write it like '40GiB', '512MiB' or a byte count")
    whole = re.fullmatch(r"\s*([0-9]+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    try:
        if whole and int(whole.group(1)):  # exact: through a float, 2**53 + 1 bytes would lose its 1
            value = int(whole.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[whole.group(2)]
        else:
            value = parse_bytes(text)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    except OverflowError:  # '1e400GiB', 400 digits: infinity
        value = INT64_MAX + 1
    if value > INT64_MAX:
        raise OptionError(f"size {_shown(text)} is too large (at most 8 EiB; the machine has far less)")
    if value < 1:  # '.1': a positive number, but no byte (found by fuzzing)
        raise OptionError(f"size {_shown(text)} is less than one byte")
    return value


def nonneg_size(text: str) -> int:
    if text.strip() in ("0", "0B", "0.0"):
        return 0
    return size(text)


BARE_SIZE_MIN = 1 << 20  # a bare byte count below 1 MiB for a GPU, weights or a reserve is a unit left out


def memory_size(text: str) -> int:
    """``size`` of a device's memory or a model's weights: a bare number below 1 MiB ('--gpu-mem 40') is
    refused as a unit left out ("did you mean 40GiB?"); a unit or a larger byte count is taken as given."""
    return _with_unit(text, size(text))


def nonneg_memory_size(text: str) -> int:
    """``memory_size`` that also takes 0."""
    value = nonneg_size(text)
    return _with_unit(text, value) if value else 0


def _with_unit(text: str, value: int) -> int:
    bare = text.strip()
    if value < BARE_SIZE_MIN and re.fullmatch(r"[0-9]*\.?[0-9]+", bare):
        raise OptionError(f"{_shown(text)} would be {value} byte{'' if value == 1 else 's'}: did you mean "
                          f"{bare}GiB? Write the unit ({bare}GiB, {bare}MiB) or a byte count of at least 1 MiB")
    return value


def parse_range(text: str | int | Sequence[int], name: str = "range") -> tuple[int, int]:
    """``"32"`` -> (32, 32); ``"16-64"`` or ``"16:64"`` -> (16, 64); ``(a, b)`` passes through checked."""
    if isinstance(text, int):
        lo = hi = text
    elif isinstance(text, str):
        parts = text.strip().replace(":", "-").split("-")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{name} {text!r} must be a number or LO-HI, like 32 or 16-64") from None
        if len(values) == 1:
            lo = hi = values[0]
        elif len(values) == 2:
            lo, hi = values
        else:
            raise ValueError(f"{name} {text!r} must be a number or LO-HI, like 32 or 16-64")
    else:
        lo, hi = (int(v) for v in text)
    if lo < 1:
        raise ValueError(f"{name} {text!r}: lengths must be at least 1")
    if hi < lo:
        raise ValueError(f"{name} {text!r}: the upper end {hi} is below the lower end {lo}")
    return lo, hi


def length_range(text: str) -> tuple[int, int]:
    """'32' -> (32, 32), '16-64' -> (16, 64)."""
    if len(text) > 100:
        raise OptionError(f"length range {_shown(text)} must be a number or LO-HI, like 32 or 16-64")
    try:
        lo, hi = parse_range(text, "length range")
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    if hi > MAX_TOKENS:
        raise OptionError(f"length range {_shown(text)}: {hi:,} is more than {MAX_TOKENS:,} tokens")
    return lo, hi


def seconds(text: str) -> float:
    value = _number(text)
    if not 0 <= value < math.inf:  # also refuses NaN
        raise OptionError(f"{_shown(text)} must be a number of seconds >= 0")
    if value > MAX_STEP_DELAY:
        raise OptionError(f"{_shown(text)} is more than {MAX_STEP_DELAY:g} seconds")
    return value


def refresh_rate(text: str) -> float:
    value = _number(text)
    if not 0.5 <= value <= 10:  # also refuses NaN
        raise OptionError(f"{_shown(text)} must be between 0.5 and 10 updates per second")
    return value


SPECULATIVE_FORMS = "off, ngram:K, ngram:K:MIN-MAX or draft:MODEL:K"


def speculative(text: str) -> dict[str, Any] | None:
    """Speculative decoding: ``off``; ``ngram:K`` (prompt lookup, K drafts per step) with ``:MIN-MAX`` or
    ``:N`` the n-gram lengths matched (vLLM's prompt_lookup_min / max); ``draft:MODEL:K`` (a draft model
    with the target's vocabulary) -> the engine's ``speculative_config`` dict (``None``: off)."""
    value = text.strip()
    if value.lower() in ("off", "none", ""):
        return None
    method, _, rest = value.partition(":")
    parts = rest.split(":") if method == "ngram" else rest.rsplit(":", 1)
    if method == "ngram" and 1 <= len(parts) <= 2:
        config: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": _drafts(parts[0], text)}
        if len(parts) == 2:
            lo, _, hi = parts[1].partition("-")
            config["prompt_lookup_min"] = _drafts(lo, text, "MIN")
            config["prompt_lookup_max"] = _drafts(hi or lo, text, "MAX")
        return config
    if method in ("draft", "draft_model") and len(parts) == 2 and parts[0].strip():
        return {"method": "draft_model", "model": parts[0].strip(), "num_speculative_tokens": _drafts(parts[1], text)}
    raise OptionError(f"speculative decoding {_shown(text)}: write it as {SPECULATIVE_FORMS}, like ngram:4 or "
                      "draft:tiny:3")


def _drafts(part: str, text: str, what: str = "K") -> int:
    if not part.strip().isdigit() or int(part) < 1 or len(part.strip()) > 4:
        raise OptionError(f"speculative decoding {_shown(text)}: {what} must be a whole number from 1 "
                          f"({SPECULATIVE_FORMS})")
    return int(part)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise OptionError(f"{_shown(text)} is not a number") from None


def out_path(text: str) -> Path:
    """A file the run can write at the end: its folder exists and takes new files, and it is absent or a
    regular file (not a folder, a device such as /dev/null, a FIFO): ``kvscope.utils.files.check_output_path``."""
    try:
        return check_output_path(text, shown=_shown(text, PATH_SHOWN_MAX))
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def rate(text: str) -> float:
    """``--rate``: requests per second, > 0 and finite."""
    value = _number(text)
    if not 0 < value < math.inf:  # also refuses NaN
        raise OptionError(f"{_shown(text)} must be a positive number of requests per second (e.g. 4 or 0.5)")
    return value


def arrival(text: str) -> str:
    """``--arrival``: ``poisson``, or ``gamma:CV`` (the gaps' coefficient of variation, in (0, 100])."""
    kind, _, cv = text.strip().lower().partition(":")
    if kind == "poisson" and not cv:
        return "poisson"
    if kind == "gamma":
        try:
            value = float(cv)
        except ValueError:
            value = math.nan
        if 0 < value <= 100:
            return f"gamma:{value:g}"
    raise OptionError(f"{_shown(text)} must be 'poisson' or 'gamma:CV' with CV in (0, 100] (1 is Poisson; "
                      "above 1 is burstier)")


def probability(text: str) -> float:
    """A probability in [0, 1] (``--acceptance-rate``)."""
    value = _number(text)
    if not 0 <= value <= 1:  # also refuses NaN
        raise OptionError(f"{_shown(text)} must be a probability between 0 and 1 (e.g. 0.7)")
    return value
