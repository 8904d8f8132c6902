"""Argument parsing for the command line: the parser class, value types, and the run options.

The run options carry the same names, defaults and meanings as the ``%kvscope`` magic's (see
``kvscope/magic.py``; ``tests/test_cli.py`` checks that every magic option exists here), and the parsed
namespace is turned into an engine config, sampling parameters and a workload by the magic's own
functions, so a command line and a notebook cell that read alike run alike.
"""

from __future__ import annotations

import argparse


class CLIError(Exception):
    """A failure to report in one line; ``code`` 2 for usage errors, 1 for runtime failures."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """Reports a usage error as one line naming the problem and where help is, exit code 2."""

    def error(self, message: str):
        if message.endswith("expected one argument"):
            message += " (a value that starts with '-' is read as an option; negative sizes are not allowed)"
        raise CLIError(f"{message} (see '{self.prog} --help')", code=2)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def block_size(text: str) -> int:
    value = positive_int(text)
    if value & (value - 1) or value > 256:
        raise argparse.ArgumentTypeError(f"{text!r} must be a power of two between 1 and 256, like 16")
    return value


def size(text: str) -> int:
    """A positive size: '40GiB', '512MB', '1.5G' or bytes (binary units: GB == GiB)."""
    from .config import parse_bytes  # imported here: it brings torch, which --help does not need

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def nonneg_size(text: str) -> int:
    if text.strip() in ("0", "0B", "0.0"):
        return 0
    return size(text)


def length_range(text: str) -> tuple[int, int]:
    from .workload import parse_range

    try:
        return parse_range(text, "length range")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``kvscope run`` (and the names the magic uses for the same things)."""
    w = p.add_argument_group("workload (default: 16 synthetic requests)")
    w.add_argument("--model", "-m", default="tiny",
                   help="'tiny' (random, instant), 'smollm2' (real, ~15 s to load), a local folder or a cached "
                        "Hugging Face id (default: tiny)")
    w.add_argument("--requests", "-n", type=positive_int, default=None,
                   help="number of synthetic requests (random token ids; default 16)")
    w.add_argument("--prompts", "-p", default=None, metavar="FILE",
                   help="UTF-8 text file with one prompt per line")
    w.add_argument("--prompt-len", type=length_range, default=(32, 256), metavar="LO[-HI]",
                   help="synthetic prompt length in tokens, drawn uniformly (default 32-256)")
    w.add_argument("--output-len", "--max-new-tokens", type=length_range, default=None, metavar="LO[-HI]",
                   help="output tokens per request, drawn uniformly (default 32-128 for synthetic requests, "
                        "64 for prompts, which may also stop at EOS)")
    w.add_argument("--shared-prefix", type=nonneg_int, default=0, metavar="TOKENS",
                   help="tokens of one common prefix at the start of every synthetic prompt (prefix caching)")
    w.add_argument("--ignore-eos", action="store_true", help="never stop a prompt's output at EOS")
    s = p.add_argument_group("sampling")
    s.add_argument("--temperature", "-t", type=float, default=0.0, help="0 = greedy (default)")
    s.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    s.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload and of sampling (default 0)")
    e = p.add_argument_group("engine")
    e.add_argument("--block-size", type=block_size, default=16, help="tokens per KV block (power of 2; default 16)")
    e.add_argument("--num-blocks", type=positive_int, default=None, help="KV blocks in the pool")
    e.add_argument("--kv-memory", type=size, default=None, metavar="SIZE",
                   help="KV pool budget instead of --num-blocks, e.g. 64MiB")
    e.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="token budget per step (default 1024)")
    e.add_argument("--max-num-seqs", type=positive_int, default=None, help="most requests running at once (default 64)")
    e.add_argument("--max-model-len", type=positive_int, default=None, help="longest sequence (default: the model's)")
    e.add_argument("--prefix-caching", choices=("on", "off"), default="on", help="automatic prefix caching (default on)")
    e.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_const", const="off",
                   help="the same as --prefix-caching off")
    e.add_argument("--profile", type=nonneg_int, default=0, metavar="STEPS",
                   help="capture the first STEPS steps with torch.profiler (kernel time by category)")
    e.add_argument("--step-delay", type=float, default=0.0, metavar="SECONDS",
                   help="sleep between steps (slows the run down; for watching)")
    o = p.add_argument_group("outputs")
    o.add_argument("--out", default="kvscope-run", metavar="PREFIX",
                   help="write PREFIX.html, PREFIX.trace.json and PREFIX.metrics.jsonl (default kvscope-run)")
    o.add_argument("--trace", default=None, metavar="PATH", help="Perfetto / Chrome trace JSON (overrides --out)")
    o.add_argument("--metrics", default=None, metavar="PATH", help="metrics JSON Lines (overrides --out)")
    o.add_argument("--html", default=None, metavar="PATH", help="standalone HTML report (overrides --out)")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress bar or table; print the files written")
