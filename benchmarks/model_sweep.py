"""Every causal-LM type of the installed transformers through ``Engine(model)``, against transformers'
own greedy ``generate``: identical, refused (with the reason ``Engine()`` gave) or not buildable.

Each type is built as a tiny random float32 model (``kvscope.models.zoo``: widths 64, heads of 16, sliding
windows and attention chunks of 16 tokens, seeded init), in this process. transformers generates for
each prompt alone, with the model's own attention implementation and a plain greedy config; the engine
runs all prompts together: batched, chunked prefill (24-token budget), 4-token pages with a shared
24-token prefix served from the prefix cache, and a pool of 40 pages, small enough that requests are
preempted and recomputed; max_model_len 512 (the model's positions if fewer). Prompts reach past the
windows, so sliding layers really slide.

    python benchmarks/model_sweep.py                         # all types, one line each, then the counts
    python benchmarks/model_sweep.py --markdown docs/models.md
    python benchmarks/model_sweep.py --types gemma2,gpt_oss  # or --subset quick (QUICK_TYPES, ~10 s)

CI runs all of it (tests/benchmarks/test_model_sweep.py): about 1.5 minutes on two cores.

Exit status 1 if any type differs from transformers (MISMATCH) or fails with anything but a clear
refusal at ``Engine()`` (FAILED), else 0.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kvscope import Engine, SamplingParams
from kvscope.engine.config import max_positions
from kvscope.engine.worker.attention import UnsupportedModelError
from kvscope.models.zoo import VOCAB, BuildError, causal_lm_types, tiny_model

MAX_TOKENS = 10
MAX_MODEL_LEN = 512
ENGINE = dict(block_size=4, num_blocks=40, max_num_batched_tokens=24, max_num_seqs=16, telemetry=False)
# A quick look (not what CI runs: CI runs every type): one of each thing the engine must get right, full GQA and
# MHA, learned positions, sliding windows (all layers, and hybrids with full layers), softcapping, sinks,
# chunked attention, MLA (value heads of another size), MQA, two attention calls per layer, a decoder of
# the BERT family; and refusals: attention outside the interface, recurrent layers, bidirectional masks.
QUICK_TYPES = (
    "llama", "gpt2", "qwen3", "mistral", "gemma2", "gemma3_text", "gpt_oss", "cohere2", "ministral", "olmo3",
    "llama4_text", "deepseek_v3", "gpt_bigcode", "diffllama", "bert", "bloom", "falcon_mamba", "jamba",
    "qwen3_next", "modernbert-decoder",
)  # fmt: skip
RESULTS = ("identical", "refused", "not buildable", "MISMATCH", "FAILED")


@dataclass(slots=True)
class Outcome:
    model_type: str
    result: str  # one of RESULTS
    detail: str = ""  # the reason, or what the engine exercised
    seconds: float = 0.0


def prompts(seed: int = 0) -> list[list[int]]:
    """6 prompts of 1..36 tokens and 4 that share a 24-token prefix (ids 3..VOCAB-1)."""
    rng = random.Random(seed)
    out = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 36))] for _ in range(6)]
    prefix = [rng.randrange(3, VOCAB) for _ in range(24)]
    return out + [prefix + [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 10))] for _ in range(4)]


def reference(model, prompt: list[int]) -> list[int]:
    """transformers' greedy generate for one prompt alone, no EOS, no logits processors."""
    from transformers import GenerationConfig

    saved = model.generation_config  # generate fills unset fields from it: an EOS there would stop early
    model.generation_config = GenerationConfig(max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)
    try:
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt]))
    finally:
        model.generation_config = saved
    return out[0, len(prompt) :].tolist()


def features(engine: Engine) -> str:
    """What the model's layers made the engine do, from the probe's per-layer specs."""
    layers = engine.spec.layers
    parts = [f"{len(layers)} KV layers"]
    windows = sorted({x.sliding_window for x in layers if x.sliding_window})
    if windows:
        parts.append(f"window {'/'.join(map(str, windows))} on {sum(1 for x in layers if x.sliding_window)}")
    if any(x.attention_chunk for x in layers):
        parts.append(f"chunked on {sum(1 for x in layers if x.attention_chunk)}")
    if any(x.softcap for x in layers):
        parts.append("softcap")
    if any(x.sinks for x in layers):
        parts.append("sinks")
    if any(x.head_dim_v for x in layers):
        parts.append(f"K/V head sizes {layers[0].head_dim}/{layers[0].value_dim}")
    if len({(x.num_kv_heads, x.head_dim, x.value_dim) for x in layers}) > 1:
        parts.append("layers of different shapes")
    heads = {(x.num_heads, x.num_kv_heads) for x in layers}
    parts.append(", ".join(f"{q}q/{kv}kv heads" for q, kv in sorted(heads)))
    groups = engine.kv_config
    if groups.num_groups > 1:
        parts.append(f"{groups.num_groups} KV block groups")
    if windows and not groups.frees_blocks:
        parts.append("windows kept whole (layers of different page shapes)")
    return "; ".join(parts)


def run_type(model_type: str) -> Outcome:
    start = time.perf_counter()
    outcome = _run_type(model_type)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _run_type(model_type: str) -> Outcome:
    try:
        model = tiny_model(model_type)
    except BuildError as exc:
        return Outcome(model_type, "not buildable", str(exc))
    batch = prompts()
    try:
        refs = [reference(model, p) for p in batch]
    except Exception as exc:
        return Outcome(model_type, "not buildable", f"transformers' generate fails: {_short(exc)}")
    text = model.config.get_text_config()
    try:  # the prompts need 50 positions; a shorter max_model_len than the model's is what users pass too
        engine = Engine(model, max_model_len=min(MAX_MODEL_LEN, max_positions(text)), **ENGINE)
        if engine.kv_config.num_groups > 1:  # a hybrid's block id holds a page in only 1/groups of its layers:
            engine = Engine(model, max_model_len=engine.max_model_len,  # the same memory as the others
                            **{**ENGINE, "num_blocks": ENGINE["num_blocks"] * engine.kv_config.num_groups})
    except UnsupportedModelError as exc:
        return Outcome(model_type, "refused", exc.reason)
    except Exception as exc:
        return Outcome(model_type, "FAILED", f"at Engine(): {_short(exc)}")
    try:
        outs = engine.generate(batch, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    except Exception as exc:
        return Outcome(model_type, "FAILED", f"after Engine() accepted it: {_short(exc)}")
    wrong = [i for i, (o, r) in enumerate(zip(outs, refs)) if o.token_ids != r]
    if wrong:
        return Outcome(model_type, "MISMATCH", f"prompts {wrong} differ from transformers ({features(engine)})")
    preempted = sum(o.num_preemptions for o in outs)
    cached = sum(o.num_cached_tokens for o in outs)
    freed = engine.pool.num_window_freed_blocks
    return Outcome(model_type, "identical", f"{features(engine)}; preemptions: {preempted}, cached tokens: {cached}"
                   + (f", blocks freed by the window: {freed}" if freed else ""))


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:240] if text else ''}"


def markdown(outcomes: list[Outcome], command: str) -> str:
    import transformers

    counts = Counter(o.result for o in outcomes)
    lines = [
        "# Models: every causal LM in transformers, through the engine",
        "",
        f"Made by `{command}` with transformers {transformers.__version__} and torch {torch.__version__}: every "
        "model type with a causal-LM class, built as a tiny random float32 model (`kvscope.models.zoo`), run by "
        "`Engine(model)` against transformers' own greedy `generate` (each prompt alone). The engine runs ten "
        "prompts batched, with chunked prefill, a shared prefix from the prefix cache and a pool small enough "
        "to preempt (`max_model_len` 512); prompts are longer than the models' sliding windows and attention "
        "chunks (16 tokens). Sliding-window layers give their blocks back once they leave the window, while the "
        "request runs; a hybrid (full and sliding layers) gets vLLM-style KV block groups, and its pool as many "
        "times 40 blocks as it has groups (a block then holds a page in only its group's layers: the same memory).",
        "",
        "- **identical**: every output token equals transformers'; the details say what the probe measured "
        "(KV layers, windows, chunks, sinks, softcaps, head shapes) and what the run exercised.",
        "- **refused**: `Engine(model)` raised `UnsupportedModelError` with this reason before accepting any "
        "request (the model's attention implementation is restored).",
        "- **not buildable**: a tiny random model of the type cannot be made from its default config, or "
        "transformers' own `generate` fails on it.",
        "",
        "Totals: " + ", ".join(f"{counts.get(r, 0)} {r}" for r in RESULTS) + f" ({len(outcomes)} types).",
        "",
        "CI runs the whole sweep (`tests/benchmarks/test_model_sweep.py`, about 1.5 minutes on two cores): it "
        "fails on any MISMATCH or FAILED, and, with the transformers this table was made with, on any type "
        "whose result differs from the table.",
        "",
        "Refusals by reason:",
        "",
        *[f"- {n} x {reason}" for reason, n in _refusal_kinds(outcomes).most_common()],
        "",
        "| model type | result | details |",
        "| --- | --- | --- |",
    ]
    for o in outcomes:
        lines.append(f"| `{o.model_type}` | {o.result} | {o.detail.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _refusal_kinds(outcomes: list[Outcome]) -> Counter:
    """Refusal reasons without the layer they name ("attention call 3 (X, layer_idx=3) passes ...")."""
    return Counter(re.sub(r"^attention call \d+ \([^)]*\):? ", "", o.detail) for o in outcomes if o.result == "refused")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", help="comma-separated model types (default: all registered ones)")
    parser.add_argument("--subset", choices=["quick"], help="one type per attention feature (QUICK_TYPES)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    registered = causal_lm_types()
    types = registered if not (args.types or args.subset) else (
        list(QUICK_TYPES) if args.subset else [t.strip() for t in args.types.split(",") if t.strip()])  # fmt: skip
    unknown = sorted(set(types) - set(registered))
    if unknown:
        parser.error(f"not causal-LM types of this transformers: {', '.join(unknown)}")
    outcomes = []
    for model_type in types:
        outcome = run_type(model_type)
        outcomes.append(outcome)
        print(f"{model_type:28s} {outcome.result:14s} {outcome.seconds:5.1f}s  {outcome.detail}", flush=True)
    counts = Counter(o.result for o in outcomes)
    print("totals: " + ", ".join(f"{counts.get(r, 0)} {r}" for r in RESULTS) + f" of {len(outcomes)} types")
    if args.markdown:
        command = "python benchmarks/model_sweep.py --markdown " + str(args.markdown)
        args.markdown.write_text(markdown(outcomes, command))
    return 1 if counts.get("MISMATCH") or counts.get("FAILED") else 0


if __name__ == "__main__":
    sys.exit(main())
