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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import unwritable

CLI, MAGIC = "cli", "magic"  # the two faces
BOTH = (CLI, MAGIC)


class OptionError(argparse.ArgumentTypeError, ValueError):
    """A run option refused, in one line naming the problem. An ``ArgumentTypeError`` too, so argparse
    reports the text as it is when a parser below is an option's ``type``."""


class OptionParser(argparse.ArgumentParser):
    """An argparse parser that refuses a bad command line with one ``OptionError`` line naming the problem
    and where the help is (each face catches it or overrides ``error``)."""

    def refusal(self, message: str) -> str:
        if message.endswith("expected one argument"):
            message += " (a value that starts with '-' is read as an option; negative sizes are not allowed)"
        return f"{message} (see '{self.prog} --help')"

    def error(self, message: str):
        raise OptionError(self.refusal(message))


# ---- value parsers (argparse ``type``s) ------------------------------------------------------------------
def positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        raise OptionError(f"{text!r} must be at least 1")
    return value


def nonneg_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise OptionError(f"{text!r} must be 0 or more")
    return value


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise OptionError(f"{text!r} is not a whole number") from None


def block_size(text: str) -> int:
    value = positive_int(text)
    if value & (value - 1) or value > 256:
        raise OptionError(f"{text!r} must be a power of two between 1 and 256, like 16")
    return value


def size(text: str) -> int:
    """A positive size: '40GiB', '512MB', '1.5G' or bytes (binary units: GB == GiB)."""
    from .config import parse_bytes  # here: config brings torch, which --help does not need

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def nonneg_size(text: str) -> int:
    if text.strip() in ("0", "0B", "0.0"):
        return 0
    return size(text)


def length_range(text: str) -> tuple[int, int]:
    """'32' -> (32, 32), '16-64' -> (16, 64)."""
    from .workload import parse_range

    try:
        return parse_range(text, "length range")
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def seconds(text: str) -> float:
    value = _number(text)
    if not 0 <= value < math.inf:  # also refuses NaN
        raise OptionError(f"{text!r} must be a number of seconds >= 0")
    return value


def refresh_rate(text: str) -> float:
    value = _number(text)
    if not 0.5 <= value <= 10:  # also refuses NaN
        raise OptionError(f"{text!r} must be between 0.5 and 10 updates per second")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise OptionError(f"{text!r} is not a number") from None


def out_path(text: str) -> Path:
    """A file the run can write at the end: its folder exists and takes new files, and it is no folder."""
    path = Path(text).expanduser()
    if not path.parent.is_dir():
        raise OptionError(f"the folder of {text!r} does not exist")
    if path.is_dir():
        raise OptionError(f"{text!r} is a folder; give a file name")
    why = unwritable(path)
    if why is not None:
        raise OptionError(f"cannot write {text!r} ({why}); choose another folder")
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
               type=positive_int),
    OptionSpec(("--prompts", "-p"), WORKLOAD, "UTF-8 text file with one prompt per line (in %%%%kvscope: the "
               "cell's lines)", metavar="FILE"),
    OptionSpec(("--prompt-len",), WORKLOAD, "synthetic prompt length in tokens, drawn uniformly (default 32-256)",
               type=length_range, default=(32, 256), metavar="LO[-HI]"),
    OptionSpec(("--output-len", "--max-new-tokens"), WORKLOAD, "output tokens per request, drawn uniformly "
               "(default 32-128 for synthetic requests, 64 for prompts, which may also stop at EOS)",
               type=length_range, metavar="LO[-HI]"),
    OptionSpec(("--shared-prefix",), WORKLOAD, "tokens of one common prefix at the start of every synthetic "
               "prompt (prefix caching)", type=nonneg_int, default=0, metavar="TOKENS"),
    OptionSpec(("--ignore-eos",), WORKLOAD, "never stop a prompt's output at EOS", default=False,
               action="store_true"),
    OptionSpec(("--temperature", "-t"), SAMPLING, "0 = greedy (default)", type=float, default=0.0),
    OptionSpec(("--top-k",), SAMPLING, "keep the k most likely tokens (0 = off)", type=int, default=0),
    OptionSpec(("--top-p",), SAMPLING, "nucleus sampling mass (1 = off)", type=float, default=1.0),
    OptionSpec(("--seed",), SAMPLING, "seed of the synthetic workload and of sampling (default 0)", type=int,
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
    OptionSpec(("--profile",), ENGINE, "capture STEPS steps with torch.profiler, after one warm-up step (kernel "
               "time by category)", type=nonneg_int, default=0, metavar="STEPS"),
    OptionSpec(("--step-delay",), ENGINE, "sleep between steps, to watch a fast model (e.g. 0.02)", type=seconds,
               default=0.0, metavar="SECONDS"),
    OptionSpec(("--out",), OUTPUTS, "write PREFIX.html, PREFIX.trace.json and PREFIX.metrics.jsonl (default "
               "kvscope-run)", default="kvscope-run", metavar="PREFIX", faces=(CLI,)),
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
