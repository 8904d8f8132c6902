"""The run options of ``kvscope run`` and ``%kvscope``, declared once: names, types, defaults, checks, help.

Both faces build their parser from ``RUN_OPTIONS`` (``add_run_options(parser, CLI)`` /
``add_run_options(parser, MAGIC)``), so a command line and a notebook cell that read alike parse alike and
refuse a bad value with the same line. Everything here refuses with ``OptionError``; the command line
turns it into ``CLIError`` (exit 2) and the magic into IPython's ``UsageError``.

Standard library only (``kvscope --help`` and ``%kvscope?`` load no torch). The value parsers are in
``values.py`` (and importable from here); ``kvscope.runs.setup.spec.RunSpec.from_args`` turns the parsed options
into the run's one typed spec.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvscope.options.parser import OptionError, OptionParser
from kvscope.options.values import (
    INT64_MAX,
    MAX_REQUESTS,
    MAX_STEP_DELAY,
    MAX_TOKENS,
    SEED_MAX,
    SPECULATIVE_FORMS,
    arrival,
    block_size,
    int64,
    length_range,
    nonneg_int,
    nonneg_size,
    num_requests,
    out_path,
    positive_int,
    rate,
    refresh_rate,
    seconds,
    seed,
    size,
    speculative,
    tokens,
)

__all__ = ["BOTH", "CLI", "INT64_MAX", "MAGIC", "MAX_REQUESTS", "MAX_STEP_DELAY", "MAX_TOKENS", "RUN_OPTIONS",
           "SEED_MAX", "SPECULATIVE_FORMS", "OptionError", "OptionParser", "OptionSpec", "add_run_options",
           "block_size", "capture_slow", "int64", "length_range", "nonneg_int", "nonneg_size", "num_requests",
           "out_path", "pd_layout", "positive_int", "refresh_rate", "seconds", "seed", "size", "speculative",
           "tokens"]

CLI, MAGIC = "cli", "magic"  # the two faces
BOTH = (CLI, MAGIC)
_PD_LAYOUT = re.compile(r"^([1-9]|1[0-6])P([1-9]|1[0-6])D$", re.IGNORECASE)


def pd_layout(text: str) -> str | None:
    """Prefill/decode disaggregation: ``off`` or ``<n>P<m>D`` (1-16 each: ``1P1D``, ``2P1D``) -> the layout
    (``kvscope.pd.PDLayout`` reads it; ``None``: colocated)."""
    value = text.strip()
    if value.lower() in ("off", "none", ""):
        return None
    if not _PD_LAYOUT.match(value):
        raise OptionError(f"--pd {value!r}: write <n>P<m>D with n and m from 1 to 16 (prefill and decode "
                          "instances), like 1P1D or 2P1D, or off")
    return value.upper()


MAX_CAPTURE_STEPS, MAX_CAPTURE_WINDOWS = 1000, 64
# Profiled steps in all (STEPS x WINDOWS): each keeps its kernel events in memory and in the trace (~60 KB per
# step on the CPU), so a run's capture stays under ~60 MB (docs/reliability.md); 1000:64 once grew to 3.2 GB.
MAX_CAPTURE_TOTAL = 1000
DEFAULT_CAPTURE_WINDOWS = 4  # kvscope.telemetry.slow_capture.MAX_WINDOWS (options import no telemetry)


def capture_slow(text: str) -> tuple[int, int] | None:
    """``--capture-slow STEPS[:WINDOWS]`` -> (steps per window, most windows; default 4), ``None`` for off / 0."""
    value = text.strip().lower()
    if value in ("off", "none", "0"):
        return None
    steps, _, windows = value.partition(":")
    try:
        n = int(steps)  # without WINDOWS: the default, fewer where the steps in all would pass the bound
        w = int(windows) if windows else max(1, min(DEFAULT_CAPTURE_WINDOWS, MAX_CAPTURE_TOTAL // max(n, 1)))
    except ValueError:
        n = w = -1
    if not (1 <= n <= MAX_CAPTURE_STEPS and 1 <= w <= MAX_CAPTURE_WINDOWS):
        raise OptionError(f"{text.strip()!r}: write STEPS or STEPS:WINDOWS (like 5 or 5:2), STEPS "
                          f"profiled after each slow step from 1 to {MAX_CAPTURE_STEPS}, at most WINDOWS windows from "
                          f"1 to {MAX_CAPTURE_WINDOWS} (default {DEFAULT_CAPTURE_WINDOWS}), or off")
    if n * w > MAX_CAPTURE_TOTAL:
        raise OptionError(f"{text.strip()!r}: {n} steps x {w} windows is {n * w:,} profiled steps; at most "
                          f"{MAX_CAPTURE_TOTAL:,} in all (each keeps its kernel events in memory and in the trace)")
    return n, w


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
    OptionSpec(("--model", "-m"), WORKLOAD, "'tiny' (random, instant), 'smollm2' (real, ~20 s to load on two "
               "CPU cores), a local folder or a cached Hugging Face id (default: tiny)", default="tiny"),
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
    OptionSpec(("--rate",), WORKLOAD, "arrivals: submit requests at this many per second (Poisson unless "
               "--arrival), so TTFT includes queueing; default: all at once", type=rate, metavar="REQ/S"),
    OptionSpec(("--arrival",), WORKLOAD, "the arrival process of --rate: poisson (default) or gamma:CV for "
               "bursty traffic (CV > 1)", type=arrival, default="poisson", metavar="PROCESS"),
    OptionSpec(("--no-chat-template",), WORKLOAD, "send each prompt as it is; by default a model with a chat "
               "template (an instruct model, like smollm2) gets each prompt as a user message in it, as vLLM's chat "
               "API does", action="store_false", dest="chat_template", default=True),
    OptionSpec(("--ignore-eos",), WORKLOAD, "never stop a prompt's output at EOS", default=False,
               action="store_true"),
    OptionSpec(("--temperature", "-t"), SAMPLING, "0 = greedy (default)", type=float, default=0.0),
    OptionSpec(("--top-k",), SAMPLING, "keep the k most likely tokens (0 = off)", type=int64, default=0),
    OptionSpec(("--top-p",), SAMPLING, "nucleus sampling mass (1 = off)", type=float, default=1.0),
    OptionSpec(("--seed",), SAMPLING, "seed of the synthetic workload and of sampling, 0 to 2**64 - 1 (default 0)",
               type=seed,
               default=0),
    OptionSpec(("--block-size",), ENGINE, "tokens per KV block (power of 2; default 16)", type=block_size),
    OptionSpec(("--num-blocks",), ENGINE, "KV blocks in the pool", type=positive_int),
    OptionSpec(("--kv-memory",), ENGINE, "KV pool budget instead of --num-blocks, e.g. 64MiB", type=size,
               metavar="SIZE"),
    OptionSpec(("--max-num-batched-tokens",), ENGINE, "token budget per step (default 1024)", type=positive_int),
    OptionSpec(("--max-num-seqs",), ENGINE, "most requests running at once (default 64)", type=positive_int),
    OptionSpec(("--max-model-len",), ENGINE, "longest sequence (default: the model's)", type=positive_int),
    OptionSpec(("--prefix-caching",), ENGINE, "automatic prefix caching (default on)", choices=("on", "off")),
    OptionSpec(("--no-prefix-caching",), ENGINE, "the same as --prefix-caching off", action="store_const",
               const="off", dest="prefix_caching"),
    OptionSpec(("--speculative",), ENGINE, "speculative decoding: ngram:K (prompt lookup: K draft tokens per "
               "step, from n-grams of 5 tokens; ngram:K:MIN-MAX for other lengths) or draft:MODEL:K (a draft "
               "model with the target's vocabulary); default off", type=speculative, metavar="SPEC"),
    OptionSpec(("--pd",), ENGINE, "prefill/decode disaggregation: <n>P<m>D (e.g. 1P1D), each instance an engine "
               "in its own process, KV blocks handed over by a connector; default off (colocated)", type=pd_layout,
               metavar="LAYOUT"),
    OptionSpec(("--profile",), ENGINE, "capture STEPS steps with torch.profiler, after one warm-up step (kernel "
               "time by category)", type=nonneg_int, default=0, metavar="STEPS"),
    OptionSpec(("--capture-slow",), ENGINE, "whenever a step is slow (at least 2x the run's own step-time model "
               "and 1 ms over it, after 16 steps), capture the next STEPS steps with torch.profiler, at most WINDOWS "
               "times (default 4); the run's meta and report say which steps, the trace holds their kernels",
               type=capture_slow, metavar="STEPS[:WINDOWS]"),
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
