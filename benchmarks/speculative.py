"""Speculative decoding: off, n-gram and a draft model, at growing batch sizes, on two workloads.

    python benchmarks/speculative.py                   # SmolLM2, batches 1, 4, 16, 64
    python benchmarks/speculative.py --quick           # a tiny random model (the smoke test runs this)
    python benchmarks/speculative.py --batch-sizes 1,4 --workloads extractive --json out.json

Workloads: *extractive* (the instruction "copy this passage", so the answer copies from the prompt:
what prompt lookup is for), *open* (open-ended questions: little to copy) and *random* (random token
ids; greedy decoding of a small model on such prompts soon repeats itself, and lookup finds the
repeats). Every request makes
``--output-len`` tokens, greedy, EOS ignored. Systems: ``off``; ``ngram`` (``--ngram``, prompt lookup);
``draft`` (the target's first ``--draft-layers`` layers with its own norm and head: an early-exit draft
sharing the target's weights and vocabulary; ``--draft-model NAME`` for another model). For each
(workload, batch size) every system runs the same requests, ``--rounds`` times in rotating order, on
an empty prefix cache; tokens/s is output tokens over the run's wall time (prefill included), its
median over rounds; acceptance is read from the run's telemetry (vLLM's definitions). Greedy outputs
must be identical with and without speculation; the script says so per row, and exits 1 otherwise.
The last lines are ``RATIO`` lines: each system's tokens/s over ``off`` per workload and batch size.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from harness import (
    add_omp_wait_option,
    build_model,
    machine_line,
    median,
    set_omp_wait,
    special_token_ids,
    table,
)

from kvscope import Engine, SamplingParams
from kvscope.engine.spec_decode.draft_model import early_exit_draft
from kvscope.models.loader import load_model
from kvscope.runs.result.run import Run

QUICK = dict(model="llama-quick", batch_sizes="1,4", output_len=8, rounds=1, draft_layers=1)

# Sentences to build passages from (seeded shuffles): plain prose that a small instruct model copies.
SENTENCES = (
    "The river rises in the northern hills and reaches the sea after four hundred kilometres.",
    "Most of the town's houses were built of grey stone between 1850 and 1910.",
    "A ferry crosses the bay twice a day in summer and once a day in winter.",
    "The library keeps its oldest maps in a cool room under the main hall.",
    "Farmers in the valley grow apples, pears and a little barley.",
    "The bridge was closed for repairs in March and opened again in October.",
    "Visitors can climb the tower for a view of the harbour and the islands.",
    "The school has three hundred pupils and a small garden behind the gym.",
    "Heavy rain in the autumn often floods the road along the lake.",
    "The museum shows tools, boats and clothes from the fishing villages.",
    "A new railway line links the port with the capital in two hours.",
    "The market opens at six on Saturdays and closes at noon.",
    "Local musicians play in the square on the first Friday of every month.",
    "The old mill by the waterfall now makes electricity for two hundred homes.",
    "Snow closes the mountain pass for about three months every year.",
    "The island has one doctor, one shop and a post office that opens twice a week.",
)


QUESTIONS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give three tips for learning to play the guitar.",
    "What should I pack for a week of hiking in the mountains?",
    "Describe how a bicycle works.",
    "Write a poem about the first snow of winter.",
    "Why do cats purr?",
    "Plan a simple vegetarian dinner for four people.",
    "What are the pros and cons of working from home?",
    "Explain what a computer's memory is for.",
    "Write a letter thanking a teacher.",
    "How do bees make honey?",
    "Suggest names for a small bakery and say why.",
    "What is the difference between weather and climate?",
    "Tell me about the history of the bicycle.",
    "How can I sleep better?",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, llama-quick, a folder")
    p.add_argument("--batch-sizes", default="1,4,16,64", help="requests running at once, comma-separated")
    p.add_argument("--workloads", default="extractive,open,random", help="extractive, open, random (comma-separated)")
    p.add_argument("--output-len", type=int, default=64, help="tokens per request (EOS ignored)")
    p.add_argument("--ngram", default="4:2-5", help="K:MIN-MAX of the n-gram system (k drafts, lookup lengths)")
    p.add_argument("--draft-k", type=int, default=3, help="drafts per step of the draft system")
    p.add_argument("--draft-layers", type=int, default=8, help="layers of the early-exit draft")
    p.add_argument("--draft-model", default=None, help="a draft model name instead of the early-exit draft")
    p.add_argument("--systems", default="off,ngram,draft", help="which systems run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--quick", action="store_true", help="a tiny model and two small batches (smoke test)")
    add_omp_wait_option(p)
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def extractive_prompts(tokenizer, n: int, seed: int, vocab: int, special: set[int]) -> list[list[int]]:
    """Chat prompts asking to copy a passage of 6 shuffled sentences; without a tokenizer, random ids
    laid out the same way (a passage, then the passage's start again, so lookup has something)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        if tokenizer is None:
            passage = [rng.randrange(3, vocab) for _ in range(96)]
            prompts.append(passage + passage[:8])
            continue
        passage = " ".join(rng.sample(SENTENCES, 6))
        ask = f"Copy the following passage word for word, and write nothing else.\n\n{passage}"
        prompts.append(chat(tokenizer, ask))
    return prompts


def chat(tokenizer, text: str) -> list[int]:
    """``text`` as a user turn of the tokenizer's chat template (plain text without one)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = ids if isinstance(ids, list) else ids["input_ids"]  # transformers 5: a BatchEncoding
    else:
        ids = tokenizer.encode(text + "\n\n")
    return [int(t) for t in ids]


def open_prompts(tokenizer, n: int, seed: int, vocab: int, special: set[int]) -> list[list[int]]:
    """Open-ended questions (cycled); random ids without a tokenizer."""
    if tokenizer is None:
        return random_prompts(n, seed + 7, vocab, special)
    return [chat(tokenizer, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]


def random_prompts(n: int, seed: int, vocab: int, special: set[int]) -> list[list[int]]:
    rng = random.Random(seed + 1)
    return [[t for t in (rng.randrange(3, vocab) for _ in range(rng.randint(96, 160))) if t not in special] or [3]
            for _ in range(n)]


def make_engine(model, tokenizer, system: str, args, max_seqs: int) -> Engine:
    kwargs = dict(max_num_seqs=max_seqs, max_num_batched_tokens=2048, max_model_len=2048)
    if system == "ngram":
        k, _, lookup = args.ngram.partition(":")
        lo, _, hi = (lookup or "5").partition("-")
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": int(k),
                                        "prompt_lookup_min": int(lo), "prompt_lookup_max": int(hi or lo)}
    elif system == "draft":
        if args.draft_model:
            draft = args.draft_model
        else:
            draft = early_exit_draft(model, args.draft_layers)
        kwargs["speculative_config"] = {"method": "draft_model", "model": draft,
                                        "num_speculative_tokens": args.draft_k}
    return Engine(model, tokenizer=tokenizer, **kwargs)


def run_once(engine: Engine, prompts: list[list[int]], output_len: int) -> tuple[float, list[list[int]], dict]:
    engine.pool.reset_prefix_cache()
    if engine.recorder is not None:
        engine.recorder.clear()
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    outputs = engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    summary = Run(*engine.recorder.snapshot()).summary() if engine.recorder is not None else {}
    return wall, [o.token_ids for o in outputs], summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_omp_wait(args.omp_wait)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model in ("smollm2", "tiny") or not args.model.startswith("llama-"):
        model, tokenizer, label = load_model(args.model, dtype=torch.float32)
    else:
        (model, label), tokenizer = build_model(args.model, args.seed), None
    vocab = model.config.get_text_config().vocab_size
    special = special_token_ids(model)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    systems = args.systems.split(",")
    biggest = max(batch_sizes)
    print(f"# speculative decoding: {label}\n{machine_line()}")
    print(f"systems: {', '.join(systems)} (ngram {args.ngram}, draft k={args.draft_k} "
          f"{args.draft_model or f'early exit after {args.draft_layers} layers'}); output {args.output_len} tokens\n")
    engines = {s: make_engine(model, tokenizer, s, args, biggest) for s in systems}
    workloads = {
        "extractive": extractive_prompts(tokenizer, biggest, args.seed, vocab, special),
        "open": open_prompts(tokenizer, biggest, args.seed, vocab, special),
        "random": random_prompts(biggest, args.seed, vocab, special),
    }
    rows, results, ratios, mismatches = [], [], [], 0
    for name in args.workloads.split(","):
        for b in batch_sizes:
            prompts = workloads[name][:b]
            for engine in engines.values():  # warm-up: first calls allocate and pick kernels
                engine.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True))
            walls = {s: [] for s in systems}
            tokens, summaries = {}, {}
            for r in range(args.rounds):
                for s in systems[r % len(systems):] + systems[:r % len(systems)]:
                    wall, toks, summary = run_once(engines[s], prompts, args.output_len)
                    walls[s].append(wall)
                    tokens[s], summaries[s] = toks, summary
            base = b * args.output_len / median(walls["off"]) if "off" in walls else float("nan")
            for s in systems:
                tok_s = b * args.output_len / median(walls[s])
                same = tokens[s] == tokens.get("off", tokens[s])
                mismatches += not same
                acc = summaries[s].get("spec_acceptance_rate", float("nan"))
                length = summaries[s].get("spec_mean_acceptance_length", float("nan"))
                rows.append([name, str(b), s, f"{tok_s:.1f}", f"{tok_s / base:.2f}x",
                             "-" if acc != acc else f"{acc:.0%}", "-" if length != length else f"{length:.2f}",
                             "yes" if same else "NO"])
                results.append(dict(workload=name, batch=b, system=s, tokens_per_s=tok_s, walls_s=walls[s],
                                    acceptance_rate=acc, mean_acceptance_length=length, identical=same))
                if s != "off":
                    ratios.append(f"RATIO {s}/off {name} batch={b} = {tok_s / base:.2f}x")
                print(f"  {name} batch {b} {s}: {tok_s:.1f} tok/s", file=sys.stderr, flush=True)  # progress
    print(table(["workload", "batch", "system", "tok/s", "vs off", "acceptance", "mean acc. length",
                 "same tokens"], rows))
    if args.json:
        args.json.write_text(json.dumps(dict(model=label, args=vars(args) | {"json": str(args.json)},
                                             results=results), indent=1, default=str))
    print()
    print("\n".join(ratios))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
