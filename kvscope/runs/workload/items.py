"""Workloads: what requests a run submits.

Shared by the ``%kvscope`` magic, the ``kvscope run`` command line and the benchmarks, so nothing here
knows about IPython or the engine's internals: a workload is a list of ``WorkItem`` (a prompt, as text
or token ids, and its ``SamplingParams``).

- ``synthetic_workload``: seeded random token-id prompts with lengths drawn from ranges, optionally all
  starting with one shared prefix (to exercise prefix caching). Output lengths are exact because the
  requests ignore EOS, the usual choice for benchmarks.
- ``read_prompts``: one prompt per line (``\\n`` or ``\\r\\n``) of a UTF-8 text file, a pipe or a FIFO, with
  errors that say what is wrong and on which line.
- ``prompts_workload``: text prompts with output lengths drawn from a range; EOS ends them.
- ``with_arrivals``: arrival times for a workload (Poisson at a rate, or gamma-distributed gaps for bursty
  traffic), so a run submits each request at its time and TTFT includes queueing, as in serving.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import overload

from kvscope.engine.generate import chat_prompt_ids
from kvscope.engine.request import SamplingParams
from kvscope.options.values import arrival as check_arrival
from kvscope.options.values import parse_range  # also importable from here, as the benchmarks do
from kvscope.runs.workload.draws import Draws


@dataclass(slots=True)
class WorkItem:
    """One request to submit: ``engine.add_request(item.prompt, item.params)``."""

    prompt: str | list[int]
    params: SamplingParams
    source: str = ""  # where it came from, for error messages: "line 3 of prompts.txt"
    arrival_s: float = 0.0  # when it is submitted, in seconds from the start of the run (``with_arrivals``)
    chat: bool = False  # a user message: put through the model's chat template, if it has one
    shown: str | None = None  # what reports show as its prompt (a chat's user message, not the whole template)

    @property
    def num_prompt_tokens(self) -> int | None:
        """Known for token-id prompts; ``None`` for text until a tokenizer has seen it."""
        return None if isinstance(self.prompt, str) else len(self.prompt)

    def prompt_for(self, tokenizer) -> str | list[int]:
        """What to submit: the prompt, through the chat template when it is a chat message and the model has one."""
        if not self.chat or not getattr(tokenizer, "chat_template", None):
            return self.prompt
        return chat_prompt_ids(tokenizer, [{"role": "user", "content": self.prompt}])


def _per_request_params(base: SamplingParams, max_tokens: int, index: int, ignore_eos: bool) -> SamplingParams:
    """A copy of ``base`` for request ``index``: its own length, and its own seed when one is set
    (seed + index), so sampled requests differ from each other and the run is still reproducible."""
    seed = None if base.seed is None else base.seed + index
    if seed is not None and seed >= 2**64:  # past torch's 64 bits: wrap around
        seed -= 2**64
    if type(base) is not SamplingParams:  # a subclass: replace keeps its own fields too
        return replace(base, max_tokens=max_tokens, seed=seed, ignore_eos=ignore_eos)
    # replace(base, ...) with the fields written out (checked alike): replace's generic walk over them cost
    # as much as the checks, per request (tests/runs/test_workload.py keeps the list whole)
    return SamplingParams(max_tokens=max_tokens, temperature=base.temperature, top_k=base.top_k, top_p=base.top_p,
                          seed=seed, stop_token_ids=base.stop_token_ids, ignore_eos=ignore_eos)


def _arrived(item: WorkItem, arrival_s: float) -> WorkItem:
    """``replace(item, arrival_s=arrival_s)``, the fields written out for a ``WorkItem`` (as above)."""
    if type(item) is not WorkItem:
        return replace(item, arrival_s=arrival_s)
    return WorkItem(item.prompt, item.params, item.source, arrival_s, item.chat, item.shown)


def synthetic_workload(num_requests: int, *args, **kwargs) -> list[WorkItem]:
    """``num_requests`` random token-id prompts, reproducible from ``seed``: ``iter_synthetic_workload``'s
    items as a list (the same arguments)."""
    return list(iter_synthetic_workload(num_requests, *args, **kwargs))


def iter_synthetic_workload(
    num_requests: int,
    prompt_len: tuple[int, int] = (16, 64),
    output_len: tuple[int, int] = (16, 64),
    *,
    vocab_size: int,
    shared_prefix_len: int = 0,
    seed: int = 0,
    params: SamplingParams | None = None,
    exclude_ids: Iterable[int] = (),
) -> Iterator[WorkItem]:
    """Seeded random token-id prompts, one at a time (a simulation of 10**6 requests holds only those not
    yet finished; ``synthetic_workload`` makes the same items as a list).

    Each prompt is ``shared_prefix_len`` common tokens followed by a length drawn uniformly from
    ``prompt_len``; each output length is drawn from ``output_len`` and reached exactly (EOS ignored).
    ``exclude_ids`` (special tokens such as EOS or padding) never appear in a prompt. The arguments are
    checked at the call, not at the first item."""
    if num_requests < 1:
        raise ValueError(f"num_requests={num_requests} must be at least 1")
    if shared_prefix_len < 0:
        raise ValueError(f"shared_prefix_len={shared_prefix_len} must be >= 0")
    prompt_len = parse_range(prompt_len, "prompt length")
    output_len = parse_range(output_len, "output length")
    excluded = set(exclude_ids)
    allowed = [t for t in range(vocab_size) if t not in excluded]
    if not allowed:
        raise ValueError(f"no token ids left to draw prompts from (vocab_size={vocab_size})")

    def items() -> Iterator[WorkItem]:
        rng = Draws(seed, allowed)  # random.Random(seed)'s very draws, the tokens made in bulk (runs/draws.py)
        prefix = rng.choices(shared_prefix_len)
        base = params or SamplingParams()
        for i in range(num_requests):
            tokens = rng.choices(rng.randint(*prompt_len))  # a new list: no copy needed without a prefix
            yield WorkItem(prefix + tokens if prefix else tokens,
                           _per_request_params(base, rng.randint(*output_len), i, True))

    return items()


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a text file, one per line; blank lines are skipped, lines are not stripped
    otherwise. Raises ``ValueError`` for a missing, unreadable, non-UTF-8 or prompt-less file."""
    return [prompt for _, prompt in read_prompt_lines(path)]


MAX_PROMPTS_FILE_BYTES = 256 << 20  # 256 MiB of prompts: far beyond a run's worth


def read_prompt_lines(path: str | Path, blank: list[int] | None = None) -> list[tuple[int, str]]:
    """``read_prompts`` with each prompt's line number (from 1). Any readable file works: a regular file,
    a pipe or FIFO (``/dev/stdin``, ``<(...)``), read once to the end. ``blank``, if given, receives the
    numbers of the blank lines skipped (``blank_lines``), so the caller can say so."""
    path = Path(path).expanduser()
    shown = str(path)
    try:
        with open(path, "rb") as f:  # bytes: no newline translation, so line numbers are the file's own
            data = f.read(MAX_PROMPTS_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"prompts file {shown!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"prompts file {shown!r} is a folder; give a text file with one prompt per line") from None
    except OSError as exc:
        raise ValueError(f"cannot read prompts file {shown!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_PROMPTS_FILE_BYTES:
        raise ValueError(f"prompts file {shown!r} is larger than {MAX_PROMPTS_FILE_BYTES >> 20} MiB; "
                         "give fewer prompts")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"prompts file {shown!r} is not UTF-8 text (byte {exc.start} cannot be decoded) on line {line}; "
            "save it as UTF-8 with one prompt per line"
        ) from None
    prompts = numbered_prompts(text)
    if not prompts:
        raise ValueError(f"prompts file {shown!r} has no prompts: write one prompt per line")
    if blank is not None:
        blank.extend(blank_lines(text))
    return prompts


def blank_lines(text: str) -> list[int]:
    """The numbers (from 1) of the blank lines ``numbered_prompts`` skips (a final newline ends the last
    line: it starts no blank one)."""
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [n for n, line in enumerate(lines, 1) if not line.strip()]


def prompts_from_text(text: str) -> list[str]:
    """Non-blank lines of ``text`` (a ``%%kvscope`` cell body, a prompts file), BOM and CR removed."""
    return [prompt for _, prompt in numbered_prompts(text)]


def numbered_prompts(text: str) -> list[tuple[int, str]]:
    """``prompts_from_text`` with each prompt's line number (from 1). Lines end at ``\\n`` (or ``\\r\\n``)
    only: other characters ``str.splitlines`` breaks at (``\\r``, ``\\x0b``, ``\\x1c``, ``\\u2028``, ...)
    stay inside their prompt, so a line of the file is one prompt and error messages name the right line."""
    lines = text.removeprefix("\ufeff").split("\n")
    return [(n, line.removesuffix("\r")) for n, line in enumerate(lines, 1) if line.strip()]


def prompts_workload(
    prompts: Sequence[str | list[int]],
    output_len: tuple[int, int] = (64, 64),
    *,
    seed: int = 0,
    params: SamplingParams | None = None,
    ignore_eos: bool = False,
    sources: Sequence[str] | None = None,
    chat: bool = False,
) -> list[WorkItem]:
    """One request per prompt, output length drawn from ``output_len`` (seeded); EOS ends a request
    early unless ``ignore_eos``. ``sources`` names where each prompt came from (error messages); ``chat``:
    each is a user message for the model's chat template (an instruct model's)."""
    if not prompts:
        raise ValueError("no prompts given")
    output_len = parse_range(output_len, "output length")
    rng = random.Random(seed)
    base = params or SamplingParams()
    sources = sources or [""] * len(prompts)
    return [
        WorkItem(prompt, _per_request_params(base, rng.randint(*output_len), i, ignore_eos), source,
                 chat=chat and isinstance(prompt, str))
        for i, (prompt, source) in enumerate(zip(prompts, sources))
    ]


def parse_arrival(text: str) -> float:
    """``--arrival``: ``poisson`` (CV 1) or ``gamma:CV``; returns the coefficient of variation of the gaps."""
    name = check_arrival(text)  # an OptionError (a ValueError) naming the forms
    return 1.0 if name == "poisson" else float(name.removeprefix("gamma:"))


def iter_arrival_times(rate: float, cv: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Arrival times (seconds from 0, the first at 0): gaps with mean ``1 / rate`` and coefficient of
    variation ``cv`` (exponential for ``cv == 1``: a Poisson process; gamma with shape ``1 / cv**2``)."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate={rate!r} must be a positive number of requests per second")
    rng = random.Random(seed ^ 0x5EED)
    shape = 1.0 / (cv * cv)
    t = 0.0
    while True:
        yield t
        t += rng.expovariate(rate) if cv == 1.0 else rng.gammavariate(shape, 1.0 / (rate * shape))


def arrival_times(n: int, rate: float, cv: float = 1.0, seed: int = 0) -> list[float]:
    """The first ``n`` of ``iter_arrival_times``."""
    times = iter_arrival_times(rate, cv, seed)
    return [next(times) for _ in range(n)]


@overload
def with_arrivals(items: list[WorkItem], rate: float | None, arrival: str = "poisson",
                  seed: int = 0) -> list[WorkItem]: ...


@overload
def with_arrivals(items: Iterable[WorkItem], rate: float | None, arrival: str = "poisson",
                  seed: int = 0) -> Iterable[WorkItem]: ...


def with_arrivals(items: Iterable[WorkItem], rate: float | None, arrival: str = "poisson",
                  seed: int = 0) -> Iterable[WorkItem]:
    """``items`` with arrival times at ``rate`` requests/s (``None``: all at once, unchanged); a list for a
    list, an iterator for an iterator."""
    if rate is None:
        return items
    times = iter_arrival_times(rate, parse_arrival(arrival), seed)
    timed = (_arrived(item, t) for item, t in zip(items, times))
    return list(timed) if isinstance(items, Sequence) else timed
