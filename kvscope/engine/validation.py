"""Checks at the edge: the values a caller hands the engine, refused at once with the field's name.

Wrong types raise ``TypeError`` ("temperature='0.5' must be a real number, not str"), wrong values
``ValueError``; both name the field and what it takes. Integers are Python or NumPy integers, never
``bool`` (``max_tokens=True`` is a slip, not a 1); real numbers are ints or floats, finite. Prompts are
a string, or token ids: a list / tuple of integers, or a 1-D integer ``np.ndarray`` / ``torch.Tensor``.
Nothing here imports NumPy: arrays are recognised by their ``ndim`` and ``dtype``.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Literal, Protocol, TypeGuard, overload

import torch

UINT64_MAX = (1 << 64) - 1  # seeds are unsigned 64-bit, what torch.Generator.manual_seed keeps


def _type(value: Any) -> str:
    return type(value).__name__


def _show(value: Any) -> str:
    """``repr(value)``, cut short for a huge number (a 400-digit int would fill the message)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:12]}...({len(text)} characters)"


@overload
def check_int(name: str, value: Any, lo: int, hi: int | None = None, *, optional: Literal[False] = False,
              must: str = "") -> int: ...


@overload
def check_int(name: str, value: Any, lo: int, hi: int | None = None, *, optional: bool,
              must: str = "") -> int | None: ...


def check_int(name: str, value: Any, lo: int, hi: int | None = None, *, optional: bool = False,
              must: str = "") -> int | None:
    """``value`` as an ``int`` in ``[lo, hi]`` (``None`` passes when ``optional``). ``must``: what the
    message says it must be (default "an integer of at least LO" / "an integer between LO and HI")."""
    if type(value) is int and value >= lo and (hi is None or value <= hi):
        return value  # the common case, first: an exact int in range (no message to format)
    if value is None and optional:
        return None
    must = must or (f"an integer between {lo} and {hi}" if hi is not None else f"an integer of at least {lo}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}={_show(value)} must be {must}, not {_type(value)}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name}={_show(value)} must be {must}")
    return value


def check_real(name: str, value: Any, lo: float, hi: float = math.inf, *, lo_open: bool = False,
               must: str = "") -> float:
    """``value`` as a finite ``float`` in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``)."""
    if type(value) is float and math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi:
        return value  # the common case, first: an exact float in range (no message to format)
    if not must:
        if math.isinf(hi):
            must = f"a finite number {'>' if lo_open else '>='} {lo:g}"
        else:
            must = f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={_show(value)} must be {must}, not {_type(value)}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond any float
        raise ValueError(f"{name}={_show(value)} must be {must}") from None
    if not (math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi):
        raise ValueError(f"{name}={value!r} must be {must}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if value is True or value is False:
        return value
    if not isinstance(value, bool) and not (type(value).__module__ == "numpy" and _type(value) in ("bool", "bool_")):
        raise TypeError(f"{name}={value!r} must be True or False, not {_type(value)}")
    return bool(value)


class _Array(Protocol):
    """A NumPy array or a torch tensor, as far as the checks read one."""

    ndim: int
    shape: Any
    dtype: Any

    def tolist(self) -> Any: ...


def _is_array(value: object) -> TypeGuard[_Array]:
    return hasattr(value, "ndim") and hasattr(value, "dtype") and hasattr(value, "tolist")


def _array_ids(name: str, array: Any) -> list[int]:
    """A 1-D integer NumPy array or torch tensor as a list of ints."""
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D token ids; got an array of shape {tuple(array.shape)} "
                         "(pass one row, or a list of 1-D prompts)")
    dtype = array.dtype
    if isinstance(dtype, torch.dtype):
        integral = not dtype.is_floating_point and not dtype.is_complex and dtype is not torch.bool
    else:
        integral = getattr(dtype, "kind", "") in "iu"
    if not integral:
        raise TypeError(f"{name} must hold integer token ids; got an array of {dtype}")
    return [int(t) for t in array.tolist()]


def token_ids(value: Any, name: str = "the prompt", *, text_ok: bool = True, set_ok: bool = False) -> list[int]:
    """Token ids from a list / tuple of integers or a 1-D integer array (a set too, with ``set_ok``).
    Floats, bools, bytes and strings inside are refused, never truncated or split. ``text_ok`` only
    changes the message: strings are the caller's to tokenize."""
    if type(value) is not list:  # an exact list, the common case, is no array and is taken
        if _is_array(value):
            return _array_ids(name, value)
        sequences = (list, tuple, range, set, frozenset) if set_ok else (list, tuple, range)
        if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, sequences):
            takes = "a string or token ids" if text_ok else "token ids"
            hint = ": decode bytes to str first" if isinstance(value, bytes) and text_ok else ""
            label = f"{name}={_show(value)}" if name.isidentifier() else name
            raise TypeError(f"{label} must be {takes} (a list of ints, or a 1-D integer array), "
                            f"not {_type(value)}{hint}")
    ids = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if operator.countOf(map(type, ids), int) == len(ids):  # the common case, all exact ints (counted in C)
        return ids
    out = []
    for i, t in enumerate(ids):
        if isinstance(t, (bool, float, str, bytes)):
            raise TypeError(f"{name} must hold integer token ids; item {i} is {t!r} ({_type(t)})")
        try:
            out.append(operator.index(t))  # numpy integers, 0-d integer tensors
        except TypeError:
            raise TypeError(f"{name} must hold integer token ids; item {i} is {t!r} ({_type(t)})") from None
    return out


def prompt_ids(prompt: Any, tokenizer: Any, vocab_size: int, max_model_len: int) -> tuple[list[int], str | None]:
    """A prompt's token ids and its text (None when given as token ids), checked against the vocabulary
    and ``max_model_len``: ``TypeError`` / ``ValueError`` naming the problem."""
    text = None
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("this engine has no tokenizer: pass prompts as lists of token ids")
        text = prompt
        ids = tokenizer.encode(prompt) if prompt else []
    else:
        ids = token_ids(prompt)
    if not ids:
        raise ValueError("the prompt is empty: give at least one token")
    if vocab_size and not (min(ids) >= 0 and max(ids) < vocab_size):  # ints by now: min/max run in C
        raise ValueError(f"the prompt has token ids outside the vocabulary [0, {vocab_size})")
    if len(ids) >= max_model_len:
        raise ValueError(
            f"the prompt has {len(ids)} tokens but the model allows at most {max_model_len - 1} "
            f"(max_model_len={max_model_len}, one position is needed for the output): shorten it"
        )
    return ids, text


def is_one_prompt(prompts: Any) -> bool:
    """Whether ``generate`` / ``stream`` got one prompt (a string, 1-D token ids) rather than a list of them."""
    if isinstance(prompts, str):
        return True
    if _is_array(prompts):
        if prompts.ndim != 1:
            raise ValueError(f"prompts is an array of shape {tuple(prompts.shape)}: pass one 1-D prompt, or "
                             "a list of them (list(array) for one prompt per row)")
        return True
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, (list, tuple, range)):
        raise TypeError(f"prompts must be a string, token ids, or a list of those; not {_type(prompts)}")
    if not prompts:
        return False
    first = prompts[0]  # a number (even a wrong one, refused later) starts a list of token ids
    return isinstance(first, numbers.Number) or (_is_array(first) and first.ndim == 0)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to run on (``None``: CUDA if there is one, else the CPU); ``ValueError`` in one line
    for a device this process cannot run a model on (``meta``, CUDA without a GPU, another backend)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r}: no CUDA device is usable here "
                             "(torch.cuda.is_available() is False); use device='cpu'")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device={str(device)!r}: this machine has {count} CUDA device(s), "
                             f"cuda:0 to cuda:{count - 1}")
        return dev
    why = "meta tensors hold no data" if dev.type == "meta" else f"'{dev.type}' is not supported"
    raise ValueError(f"device={str(device)!r} cannot run a model ({why}); kvscope runs on 'cpu' or 'cuda'")


def parse_device(value: Any) -> str | torch.device | None:
    """``EngineConfig.device``'s check: ``None``, or a device name / ``torch.device`` torch can parse."""
    if value is None or isinstance(value, torch.device):
        return value
    if not isinstance(value, str):
        raise TypeError(f"device={value!r} must be a device name such as 'cpu' or 'cuda:0', not {_type(value)}")
    try:
        torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"device={value!r} is not a device name ('cpu', 'cuda', 'cuda:1', ...)") from None
    return value
