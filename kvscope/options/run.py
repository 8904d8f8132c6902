"""The run options of ``kvscope run`` and ``%kvscope``, declared once: names, types, defaults, checks, help.

Both faces build their parser from ``RUN_OPTIONS`` (``add_run_options(parser, CLI)`` /
``add_run_options(parser, MAGIC)``), so a command line and a notebook cell that read alike parse alike and
refuse a bad value with the same line. Everything here refuses with ``OptionError``; the command line
turns it into ``CLIError`` (exit 2) and the magic into IPython's ``UsageError``.

Stdlib only at import (``kvscope --help`` and ``%kvscope?`` load no torch); the value parsers that reuse
the engine's own readers (``size``, ``length_range``) import them when called.
``kvscope/launch.py`` turns the parsed options into an engine config, sampling parameters and a workload.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.utils.files import not_a_file, unwritable

CLI, MAGIC = "cli", "magic"  # the two faces
BOTH = (CLI, MAGIC)


class OptionError(argparse.ArgumentTypeError, ValueError):
    """A run option refused, in one line naming the problem. An ``ArgumentTypeError`` too, so argparse
    reports the text as it is when a parser below is an option's ``type``."""


class OptionParser(argparse.ArgumentParser):
    """An argparse parser that refuses a bad command line with one ``OptionError`` line naming the problem
    and where the help is (each face catches it or overrides ``error``). No abbreviated options: ``--out``
    would be ``--output-len`` in the magic, which has no ``--out`` (found by fuzzing both faces)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def refusal(self, message: str) -> str:
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)  # one line, whatever argv holds
        if message.endswith("expected one argument"):
            message += " (a value that starts with '-' is read as an option; negative sizes are not allowed)"
        return f"{message} (see '{self.prog} --help')"

    def error(self, message: str):
        raise OptionError(self.refusal(message))


# ---- value parsers (argparse ``type``s) ------------------------------------------------------------------
# Numbers are bounded here, where one line can name them, not deep inside (a seed torch cannot take, a size
# that overflows to infinity, a delay threading cannot wait for, a workload too big to build).
INT64_MAX = 2**63 - 1
SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits
MAX_REQUESTS = 100_000
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


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text):,} characters)"


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
    from kvscope.engine.config import parse_bytes  # here: config brings torch, which --help does not need

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


def length_range(text: str) -> tuple[int, int]:
    """'32' -> (32, 32), '16-64' -> (16, 64)."""
    from kvscope.runs.workload import parse_range

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
    regular file (not a folder, a device such as /dev/null, a FIFO)."""
    path = Path(text).expanduser()
    if not path.parent.is_dir():
        raise OptionError(f"the folder of {_shown(text)} does not exist")
    what = not_a_file(path)
    if what == "a folder":
        raise OptionError(f"{_shown(text)} is a folder; give a file name")
    if what is not None:
        raise OptionError(f"{_shown(text)} is {what}, not a regular file; give a file name (kvscope writes only "
                          "regular files)")
    why = unwritable(path)
    if why is not None:
        raise OptionError(f"cannot write {_shown(text)} ({why}); choose another folder")
    return path


# ---- the options ---------------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class OptionSpec:
    """One option as ``parser.add_argument`` takes it, with the argument group and the faces that have it."""

    flags: tuple[str, ...]
    group: str
    help: str  # argparse help: a literal % is written %%
    type: Callable[[str], Any] | None = None
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    action: str | None = None
    const: Any = None
    dest: str | None = None
    faces: tuple[str, ...] = BOTH

    @property
    def name(self) -> str:
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])

    def add_to(self, parser: argparse._ActionsContainer) -> argparse.Action:
        kwargs = {"type": self.type, "metavar": self.metavar, "choices": self.choices, "action": self.action,
                  "const": self.const, "dest": self.dest}
        return parser.add_argument(*self.flags, default=self.default, help=self.help,
                                   **{k: v for k, v in kwargs.items() if v is not None})


WORKLOAD = "workload (default: 16 synthetic requests)"
SAMPLING, ENGINE, OUTPUTS = "sampling", "engine", "outputs and display"
RUN_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(("--model", "-m"), WORKLOAD, "'tiny' (random, instant), 'smollm2' (real, ~15 s to load), a local "
               "folder or a cached Hugging Face id (default: tiny)", default="tiny"),
    OptionSpec(("--requests", "-n"), WORKLOAD, "number of synthetic requests (random token ids; default 16)",
               type=num_requests),
    OptionSpec(("--prompts", "-p"), WORKLOAD, "UTF-8 text file with one prompt per line (in %%%%kvscope: the "
               "cell's lines)", metavar="FILE"),
    OptionSpec(("--prompt-len",), WORKLOAD, "synthetic prompt length in tokens, drawn uniformly (default 32-256)",
               type=length_range, default=(32, 256), metavar="LO[-HI]"),
    OptionSpec(("--output-len", "--max-new-tokens"), WORKLOAD, "output tokens per request, drawn uniformly "
               "(default 32-128 for synthetic requests, 64 for prompts, which may also stop at EOS)",
               type=length_range, metavar="LO[-HI]"),
    OptionSpec(("--shared-prefix",), WORKLOAD, "tokens of one common prefix at the start of every synthetic "
               "prompt (prefix caching)", type=tokens, default=0, metavar="TOKENS"),
    OptionSpec(("--ignore-eos",), WORKLOAD, "never stop a prompt's output at EOS", default=False,
               action="store_true"),
    OptionSpec(("--temperature", "-t"), SAMPLING, "0 = greedy (default)", type=float, default=0.0),
    OptionSpec(("--top-k",), SAMPLING, "keep the k most likely tokens (0 = off)", type=int64, default=0),
    OptionSpec(("--top-p",), SAMPLING, "nucleus sampling mass (1 = off)", type=float, default=1.0),
    OptionSpec(("--seed",), SAMPLING, "seed of the synthetic workload and of sampling, 0 to 2**64 - 1 (default 0)",
               type=seed,
               default=0),
    OptionSpec(("--block-size",), ENGINE, "tokens per KV block (power of 2; default 16)", type=block_size,
               default=16),
    OptionSpec(("--num-blocks",), ENGINE, "KV blocks in the pool", type=positive_int),
    OptionSpec(("--kv-memory",), ENGINE, "KV pool budget instead of --num-blocks, e.g. 64MiB", type=size,
               metavar="SIZE"),
    OptionSpec(("--max-num-batched-tokens",), ENGINE, "token budget per step (default 1024)", type=positive_int),
    OptionSpec(("--max-num-seqs",), ENGINE, "most requests running at once (default 64)", type=positive_int),
    OptionSpec(("--max-model-len",), ENGINE, "longest sequence (default: the model's)", type=positive_int),
    OptionSpec(("--prefix-caching",), ENGINE, "automatic prefix caching (default on)", default="on",
               choices=("on", "off")),
    OptionSpec(("--no-prefix-caching",), ENGINE, "the same as --prefix-caching off", action="store_const",
               const="off", dest="prefix_caching"),
    OptionSpec(("--speculative",), ENGINE, "speculative decoding: ngram:K (prompt lookup: K draft tokens per "
               "step, from n-grams of 5 tokens; ngram:K:MIN-MAX for other lengths) or draft:MODEL:K (a draft "
               "model with the target's vocabulary); default off", type=speculative, metavar="SPEC"),
    OptionSpec(("--profile",), ENGINE, "capture STEPS steps with torch.profiler, after one warm-up step (kernel "
               "time by category)", type=nonneg_int, default=0, metavar="STEPS"),
    OptionSpec(("--step-delay",), ENGINE, "sleep between steps, to watch a fast model (e.g. 0.02)", type=seconds,
               default=0.0, metavar="SECONDS"),
    OptionSpec(("--out",), OUTPUTS, "write PREFIX.html, PREFIX.trace.json and PREFIX.metrics.jsonl (default "
               "kvscope-run); a folder (or a path ending in /): the files go inside it, as "
               "FOLDER/kvscope-run.*", default="kvscope-run", metavar="PREFIX", faces=(CLI,)),
    OptionSpec(("--trace",), OUTPUTS, "write a Perfetto / Chrome trace JSON at the end (kvscope run: instead "
               "of PREFIX.trace.json)", type=out_path, metavar="PATH"),
    OptionSpec(("--metrics",), OUTPUTS, "write metrics JSON Lines at the end (kvscope run: instead of "
               "PREFIX.metrics.jsonl)", type=out_path, metavar="PATH"),
    OptionSpec(("--html",), OUTPUTS, "write a standalone HTML report at the end (kvscope run: instead of "
               "PREFIX.html)", type=out_path, metavar="PATH"),
    OptionSpec(("--refresh",), OUTPUTS, "dashboard updates per second (0.5-10; default 5)", type=refresh_rate,
               default=5.0, metavar="HZ", faces=(MAGIC,)),
    OptionSpec(("--rollover",), OUTPUTS, "steps kept in the dashboard's time series (default 2000)",
               type=positive_int, default=2000, metavar="STEPS", faces=(MAGIC,)),
    OptionSpec(("--wait", "-w"), OUTPUTS, "block until the run is over (Ctrl-C / interrupt stops it)",
               default=False, action="store_true", faces=(MAGIC,)),
    OptionSpec(("-q", "--quiet"), OUTPUTS, "no dashboard, progress bar or messages (kvscope run: print only the "
               "files written)", default=False, action="store_true"),
    OptionSpec(("-o", "--return-run"), OUTPUTS, "return the LiveRun (like %%timeit -o): run = %%kvscope -o ...",
               default=False, action="store_true", faces=(MAGIC,)),
)


def add_run_options(parser: argparse.ArgumentParser, face: str) -> None:
    """Add the run options ``face`` (``CLI`` or ``MAGIC``) has to ``parser``, in their argument groups."""
    if face not in BOTH:
        raise ValueError(f"face must be {CLI!r} or {MAGIC!r}, not {face!r}")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in RUN_OPTIONS:
        if face in spec.faces:
            if spec.group not in groups:
                groups[spec.group] = parser.add_argument_group(spec.group)
            spec.add_to(groups[spec.group])


def check_combinations(args: argparse.Namespace, *, cell: bool = False) -> None:
    """Refuse options that each parse but do not go together (``cell``: the prompts are a cell's lines)."""
    sources = [name for name, given in (("cell prompts", cell), ("--prompts", args.prompts),
                                        ("--requests", args.requests)) if given]
    if len(sources) > 1:
        raise OptionError(f"give requests one way only, not {' and '.join(sources)}")
    if args.num_blocks is not None and args.kv_memory is not None:
        raise OptionError("give --num-blocks or --kv-memory, not both")
