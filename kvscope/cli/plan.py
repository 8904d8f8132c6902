"""``kvscope plan``: KV capacity planning from a model's shape (``kvscope.planning.planner``): bytes per token,
and how many requests fit with static reservation and with paged blocks. Imports no torch."""

from __future__ import annotations

import argparse
import dataclasses
import os

from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError
from kvscope.options.run import block_size, positive_int
from kvscope.options.values import memory_size, nonneg_memory_size
from kvscope.planning.planner import DEFAULT_RESERVE, make_plan, render
from kvscope.planning.shapes import KNOWN_MODELS, ModelShape, known_shape, shape_from_config

EPILOG_PLAN = """\
the formula (what the KV cache holds for every token of every running request):
  KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element
  KV budget          = GPU memory - weights - reserve (activations, CUDA context)
  static reservation: every request reserves --max-len slots up front
      max requests   = floor(budget / (max_len x bytes per token))
  paged allocation:   a request holds only the blocks it fills, ceil(avg_len / block_size) of them
      max requests   = floor(budget / (ceil(avg_len / block_size) x block_size x bytes per token))
  sliding-window layers (--sliding-window W): static keeps min(max_len, W) slots there, paged at most
      ceil(W / block_size) + 1 blocks (blocks that leave the window go back to the pool)
  Sizes are binary: 40GB == 40GiB == 40 x 2^30 bytes.
  Defaults (the course's, and kvscope simulate --gpu / --static's): weights = billions of parameters x bytes,
  as GiB, a known model counted by its size class (llama-7b: 7B x 2 B = 14 GiB); reserve 4 GiB; --max-len
  2048 (or the model's maximum if below).

examples:
  the course's worked example (7B Llama, fp16, 40 GB GPU, 14 GB weights, 4 GB reserve, 2048 max, 512 average):
    kvscope plan --model llama-7b --gpu-mem 40GiB
    -> 512 KiB per token; 22 requests with static reservation, 88 with paging (4.0x)
  your own shape:   kvscope plan --layers 32 --kv-heads 8 --head-dim 128 --dtype bf16 --gpu-mem 80GiB --weights 16GiB
  a local model:    kvscope plan --model ./my-model --gpu-mem 24GiB --json
known models: """

def _add_options(parser: argparse.ArgumentParser) -> None:
    shape = parser.add_argument_group("model (a name or folder, or the three sizes; sizes override the model's)")
    shape.add_argument("--model", "-m", default=None, help="a known name (see below) or a folder with config.json")
    shape.add_argument("--layers", type=positive_int, default=None, help="decoder layers")
    shape.add_argument("--kv-heads", type=positive_int, default=None,
                       help="key/value heads per layer (= attention heads unless the model uses GQA/MQA)")
    shape.add_argument("--head-dim", type=positive_int, default=None, help="size of one head")
    shape.add_argument("--sliding-window", type=positive_int, default=None, metavar="W",
                       help="tokens a sliding-window layer reads (Mistral, Gemma 2/3, gpt-oss)")
    shape.add_argument("--sliding-layers", type=positive_int, default=None, metavar="N",
                       help="how many layers have that window (default: all)")
    shape.add_argument("--dtype", default="fp16", choices=("fp32", "fp16", "bf16", "fp8"),
                       help="KV (and weights) element type (default fp16)")
    mem = parser.add_argument_group("memory")
    mem.add_argument("--gpu-mem", type=memory_size, default=None, metavar="SIZE", help="GPU memory, e.g. 40GiB or 80GB")
    mem.add_argument("--weights", type=nonneg_memory_size, default=None, metavar="SIZE",
                     help="weights size (default: billions of parameters x dtype bytes as GiB, a known model by its "
                     "size class: llama-7b in fp16 is 14GiB)")
    mem.add_argument("--reserve", type=nonneg_memory_size, default=DEFAULT_RESERVE, metavar="SIZE",
                     help="activations and runtime reserve (default 4GiB)")
    lens = parser.add_argument_group("lengths")
    lens.add_argument("--max-len", type=positive_int, default=None, help="maximum sequence length, what a static "
                      "reservation holds per request (default 2048, or the model's maximum if below)")
    lens.add_argument("--avg-len", type=positive_int, default=512,
                      help="average tokens per request, prompt + output (default 512)")
    lens.add_argument("--block-size", type=block_size, default=16, help="tokens per KV block (default 16)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def cmd_plan(args: argparse.Namespace) -> int:
    shape = plan_shape(args)
    try:
        plan = make_plan(shape, dtype=args.dtype, gpu_mem=args.gpu_mem, weights=args.weights, reserve=args.reserve,
                         max_len=args.max_len, avg_len=args.avg_len, block_size=args.block_size)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        print(plan.to_json())
        return 0
    print(render(plan, shape.note))
    if shape.max_position_embeddings and plan.max_len > shape.max_position_embeddings:
        print(f"note: --max-len {plan.max_len} is beyond what {shape.name} supports "
              f"({shape.max_position_embeddings} positions)")
    return 0


def plan_shape(args: argparse.Namespace) -> ModelShape:
    """The model's shape from ``--model`` and the sizes given (which override the model's)."""
    given = {"num_layers": args.layers, "num_kv_heads": args.kv_heads, "head_dim": args.head_dim}
    if args.model is None:
        missing = [f"--{k}" for k, v in (("layers", args.layers), ("kv-heads", args.kv_heads),
                                          ("head-dim", args.head_dim)) if v is None]
        if missing:
            raise CLIError(f"give --model NAME|FOLDER or all of --layers, --kv-heads, --head-dim "
                           f"(missing {', '.join(missing)})")
        shape = ModelShape("custom", args.layers, args.kv_heads, args.head_dim)
    else:
        shape = _model_shape(args.model)
        for key, value in given.items():
            if value is not None:
                setattr(shape, key, value)
    if args.sliding_window is not None:
        shape.sliding_window = args.sliding_window
        shape.num_sliding_layers = args.sliding_layers or shape.num_sliding_layers or shape.num_layers
    elif args.sliding_layers is not None:
        if not shape.sliding_window:
            raise CLIError("--sliding-layers needs --sliding-window W (the model has no window)")
        shape.num_sliding_layers = args.sliding_layers
    return shape


def _model_shape(name: str) -> ModelShape:
    shape = known_shape(name)
    if shape is not None:
        return dataclasses.replace(shape)  # a copy we may change
    if os.path.exists(name):
        try:
            return shape_from_config(name)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    raise CLIError(f"unknown model {name!r}: not a known name ({', '.join(KNOWN_MODELS)}) nor a folder with "
                   "config.json; or give --layers, --kv-heads and --head-dim")


COMMAND = Command(
    name="plan",
    help="KV capacity planning: bytes per token, max concurrency static vs paged",
    description="How many requests fit in GPU memory when every request reserves its "
                "maximum length up front (static) and when the KV cache is paged.",
    epilog=EPILOG_PLAN + ", ".join(KNOWN_MODELS),
    add_options=_add_options,
    run=cmd_plan,
)
