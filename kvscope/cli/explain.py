"""``kvscope explain``: why prefix-cache lookups missed (``kvscope.explain``), three ways in.

- ``kvscope explain RUN``: a recorded run (its queued events carry the prompts' token ids);
- ``kvscope explain --prompts FILE --tokenizer MODEL_OR_DIR``: a workload, offline: the simulator's engine (the
  real scheduler and block pool, no model) runs the prompts under ``--block-size``, ``--num-blocks`` /
  ``--kv-memory`` and ``--max-num-seqs``, so evictions under that memory show;
- ``--engine vllm``: vLLM's rules for the same prompts sent one after another
  (``kvscope.explain.sharing.predict_vllm``).

It prints the tokens missed by cause and the top divergence points; ``--json OUT`` writes
``{"prefix_cache_queries", "prefix_cache_hits", "requests": [...]}`` (one row per request, in arrival order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from kvscope.cli.command import Command
from kvscope.cli.explain_report import explain_run, explain_vllm
from kvscope.cli.parser import CLIError
from kvscope.cli.paths import check_output
from kvscope.options.values import block_size, memory_size, out_path, positive_int


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", metavar="RUN", nargs="?", help="a kvscope run's metrics (.jsonl) or trace (.json)"
    )
    parser.add_argument("--prompts", metavar="FILE", help="a workload instead of a run: one prompt per line")
    parser.add_argument(
        "--tokenizer",
        metavar="MODEL_OR_DIR",
        help="the tokenizer of --prompts (a model folder, tiny, smollm2); shows a run's text too",
    )
    parser.add_argument(
        "--engine",
        choices=("kvscope", "vllm"),
        default="kvscope",
        help="kvscope: the engine's own scheduler and pool; vllm: vLLM's rules for the prompts sent "
        "one after another (its prefix_cache_queries_total / hits_total, predicted)",
    )
    parser.add_argument(
        "--block-size",
        type=block_size,
        metavar="N",
        help="tokens per block (default: the run's; 16 for --prompts)",
    )
    parser.add_argument(
        "--num-blocks", type=positive_int, metavar="N", help="KV pool size in blocks (--prompts)"
    )
    parser.add_argument(
        "--kv-memory", type=memory_size, metavar="M", help="KV pool size in bytes (--prompts)"
    )
    parser.add_argument(
        "--max-num-seqs", type=positive_int, metavar="N", help="requests running at once (--prompts)"
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        default=1,
        metavar="N",
        help="output tokens per request of --prompts (default 1)",
    )
    parser.add_argument("--top", type=positive_int, default=5, metavar="N", help="divergence points shown")
    parser.add_argument("--json", type=out_path, metavar="OUT", help="write the per-request rows as JSON")


def cmd_explain(args: argparse.Namespace) -> int:
    if (args.run is None) == (args.prompts is None):
        raise CLIError(
            "give a run (kvscope explain RUN) or a workload (--prompts FILE --tokenizer MODEL_OR_DIR)"
        )
    if args.prompts is not None and args.tokenizer is None:
        raise CLIError(
            "--prompts needs --tokenizer MODEL_OR_DIR: the tokens decide what the prefix cache shares"
        )
    if args.run is not None and (args.num_blocks or args.kv_memory or args.max_num_seqs):
        raise CLIError(
            "--num-blocks, --kv-memory and --max-num-seqs size an offline simulation: give them with "
            "--prompts (a recorded run had its own pool)"
        )
    if args.num_blocks and args.kv_memory:
        raise CLIError("give --num-blocks or --kv-memory, not both")
    inputs = [Path(p) for p in (args.run, args.prompts) if p]
    output = check_output(str(args.json), "JSON", "--json", inputs=inputs) if args.json else None
    tokenizer = _tokenizer(args.tokenizer) if args.tokenizer else None
    if args.engine == "vllm":
        doc, text = explain_vllm(_prompt_ids(args, tokenizer), args.block_size or 16, tokenizer, args.top)
    else:
        run = _load(args.run) if args.run else _simulate(args, tokenizer)
        if tokenizer is None and args.run:
            tokenizer, note = _run_tokenizer(run.meta.get("model"))
            if note:
                print(note, file=sys.stderr)
        doc, text = explain_run(run, tokenizer, args.top)
    print(text)
    if output is not None:
        from kvscope.utils.files import atomic_write

        body = json.dumps(doc, indent=1, allow_nan=False) + "\n"
        print(atomic_write(output, lambda f: f.write(body)))
    return 0


def _load(path: str):
    from kvscope.runs.result.run import load

    try:
        run = load(path)
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot read the run {path!r}: {exc}") from None
    if "watch" in run.meta:
        raise CLIError(
            "a watched vLLM run has no prompts (its records are scrapes of /metrics); explain the "
            "prompts offline instead: kvscope explain --prompts FILE --tokenizer MODEL --engine vllm"
        )
    return run


def _tokenizer(name: str) -> Any:
    """The tokenizer the user named (``--tokenizer``): tiny, smollm2 (embedded) or a local model folder, loaded
    with ``trust_remote_code=False`` and nothing downloaded; a ``CLIError`` saying plainly why otherwise."""
    from kvscope.runs.workload.sent import load_tokenizer

    custom = _custom_code(name)
    if custom:
        raise CLIError(f"--tokenizer {name!r}: its {custom} names its own Python code (auto_map); kvscope never "
                       "runs code from a model folder. Give tiny, smollm2 or a folder whose tokenizer is a standard "
                       "one (tokenizer.json)")
    try:
        return load_tokenizer(name)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


EMBEDDED_TOKENIZERS = ("tiny", "smollm2", "smollm2-135m")
MAX_PROMPT_CHARS = 512 << 10  # characters of one prompt of --prompts (about 128k tokens)


def _run_tokenizer(model: Any) -> tuple[Any, str | None]:
    """The tokenizer of a run's model (``meta["model"]``, a string from a file): only an embedded name is
    loaded; a path is never opened unless the user gives it as ``--tokenizer`` (the note says so)."""
    from kvscope.models.loader import TINY_ARCHS

    name = model.split(" ")[0] if isinstance(model, str) else ""
    if name in EMBEDDED_TOKENIZERS or name in (f"tiny-{a}" for a in TINY_ARCHS):
        try:
            return _tokenizer(name), None
        except CLIError as exc:
            return None, f"note: the run's tokenizer ({name}) did not load ({exc}); text shown where the run has it"
    if not name:
        return None, None
    return None, (f"note: the run's model is {str(model)[:200]!r}; kvscope loads no tokenizer from a path a file "
                  "names: give --tokenizer PATH to decode its tokens")


def _custom_code(name: str) -> str | None:
    """Which of a folder's config files names custom code (``auto_map``), if any (read capped, never run)."""
    for file in ("tokenizer_config.json", "config.json"):
        path = os.path.join(name, file)
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 22)
            doc = json.loads(data)
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(doc, dict) and doc.get("auto_map"):
            return file
    return None


def _prompt_ids(args: argparse.Namespace, tokenizer: Any) -> list[list[int]]:
    """The prompts' token ids: a run's recorded prompts, or the file's lines tokenized as vLLM and kvscope
    tokenize a completion prompt (``add_special_tokens=True``)."""
    if args.run:
        from kvscope.runs.workload.recorded import replay_workload

        try:
            return [list(item.prompt) for item in replay_workload(_load(args.run))]
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    from kvscope.runs.workload.items import read_prompts

    try:
        lines = read_prompts(args.prompts)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    for n, line in enumerate(lines, 1):  # before the tokenizer: a 40 MB line aborts inside it (GBs, SIGABRT)
        if len(line) > MAX_PROMPT_CHARS:
            raise CLIError(f"{args.prompts}: prompt {n} has {len(line):,} characters, more than the "
                           f"{MAX_PROMPT_CHARS:,} kvscope explain tokenizes (about 128k tokens: longer than a "
                           "model's context); shorten it or split the file")
    return [list(tokenizer.encode(line)) for line in lines]


def _simulate(args: argparse.Namespace, tokenizer: Any):
    from kvscope.cli.explain_offline import simulate_prompts

    try:
        return simulate_prompts(
            _prompt_ids(args, tokenizer),
            args.tokenizer,
            block_size=args.block_size or 16,
            num_blocks=args.num_blocks,
            kv_memory=args.kv_memory,
            max_num_seqs=args.max_num_seqs,
            max_tokens=args.max_tokens,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None


COMMAND = Command(
    name="explain",
    help="why prefix-cache lookups missed: by cause, with the token where prompts diverge",
    description="Explain a run's prefix-cache misses per request (evicted, in_flight, cache_off, window) against "
    "what a cache that never evicts and never waits would have served, and where each prompt "
    "diverged from the earlier one it shares the most with. Without a run, simulate a prompts file "
    "on the engine's own scheduler and block pool (no model), or predict vLLM's counters.",
    epilog="examples:\n  kvscope explain run.metrics.jsonl --json why.json\n"
    "  kvscope explain --prompts prompts.txt --tokenizer smollm2 --num-blocks 64\n"
    "  kvscope explain --prompts prompts.txt --tokenizer DIR --engine vllm --block-size 32",
    add_options=_add_options,
    run=cmd_explain,
)
