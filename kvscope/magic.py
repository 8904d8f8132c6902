"""``%kvscope`` / ``%%kvscope``: start a live run from a notebook cell.

``%load_ext kvscope`` registers the magic and loads BokehJS into the page (inline, works offline).
The magic parses its arguments (``IPython.core.magic_arguments``, so ``%kvscope?`` shows them all),
checks everything it can before anything starts (a bad argument raises ``UsageError`` with the
reason), then starts a ``LiveRun`` and returns at once: the engine steps in a background thread and
the dashboard updates while the notebook stays usable (widget messages and button clicks are only
delivered while the kernel is idle). ``--wait`` blocks until the run is over instead.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, argument_group, magic_arguments, parse_argstring

from .cli_args import length_range, positive_int, size
from .config import EngineConfig
from .live import LiveRun, Outputs
from .request import SamplingParams
from .telemetry.export import unwritable
from .workload import (
    WorkItem,
    numbered_prompts,
    prompts_workload,
    read_prompt_lines,
    synthetic_workload,
)


def _out_path(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder of {text!r} does not exist")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name")
    why = unwritable(path)
    if why is not None:
        raise argparse.ArgumentTypeError(f"cannot write {text!r} ({why}); choose another folder")
    return path


@magics_class
class KVScopeMagics(Magics):
    @magic_arguments()
    @argument_group("Workload (default: 16 synthetic requests)")
    @argument("--model", "-m", default="tiny",
              help="model: 'tiny' (random, instant), 'smollm2' (real, ~15 s to load), a local folder "
                   "or a cached Hugging Face id (default: tiny)")
    @argument("--requests", "-n", type=positive_int, default=None,
              help="number of synthetic requests (random token ids; default 16)")
    @argument("--prompts", "-p", default=None, metavar="FILE",
              help="UTF-8 text file with one prompt per line (in %%%%kvscope: the cell's lines)")
    @argument("--prompt-len", type=length_range, default=(32, 256), metavar="LO[-HI]",
              help="synthetic prompt length in tokens, drawn uniformly (default 32-256)")
    @argument("--output-len", "--max-new-tokens", type=length_range, default=None, metavar="LO[-HI]",
              help="output tokens per request, drawn uniformly (default 32-128 for synthetic requests, "
                   "64 for prompts, which may also stop at EOS)")
    @argument("--shared-prefix", type=int, default=0, metavar="TOKENS",
              help="tokens of one common prefix at the start of every synthetic prompt (prefix caching)")
    @argument("--ignore-eos", action="store_true", help="never stop a prompt's output at EOS")
    @argument_group("Sampling")
    @argument("--temperature", "-t", type=float, default=0.0, help="0 = greedy (default)")
    @argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    @argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    @argument("--seed", type=int, default=0, help="seed of the synthetic workload and of sampling (default 0)")
    @argument_group("Engine")
    @argument("--block-size", type=positive_int, default=16, help="tokens per KV block (power of 2; default 16)")
    @argument("--num-blocks", type=positive_int, default=None, help="KV blocks in the pool")
    @argument("--kv-memory", type=size, default=None, metavar="SIZE",
              help="KV pool budget instead of --num-blocks, e.g. 64MiB")
    @argument("--max-num-batched-tokens", type=positive_int, default=None,
              help="token budget per step (default 1024)")
    @argument("--max-num-seqs", type=positive_int, default=None, help="most requests running at once (default 64)")
    @argument("--max-model-len", type=positive_int, default=None, help="longest sequence (default: the model's)")
    @argument("--prefix-caching", choices=("on", "off"), default="on", help="automatic prefix caching (default on)")
    @argument("--profile", type=int, default=0, metavar="STEPS",
              help="capture STEPS steps with torch.profiler, after one warm-up step (kernel time by category)")
    @argument("--step-delay", type=float, default=0.0, metavar="SECONDS",
              help="sleep between steps, to watch a fast model (e.g. 0.02)")
    @argument_group("Outputs and display")
    @argument("--trace", type=_out_path, default=None, metavar="PATH",
              help="write a Perfetto / Chrome trace JSON at the end")
    @argument("--metrics", type=_out_path, default=None, metavar="PATH", help="write metrics JSON Lines at the end")
    @argument("--html", type=_out_path, default=None, metavar="PATH",
              help="write a standalone HTML report at the end")
    @argument("--refresh", type=float, default=5.0, metavar="HZ", help="dashboard updates per second (1-10; default 5)")
    @argument("--rollover", type=positive_int, default=2000, metavar="STEPS",
              help="steps kept in the dashboard's time series (default 2000)")
    @argument("--wait", "-w", action="store_true", help="block until the run is over (Ctrl-C / interrupt stops it)")
    @argument("-q", "--quiet", action="store_true", help="no dashboard and no messages")
    @argument("-o", "--return-run", action="store_true",
              help="return the LiveRun (like %%timeit -o): run = %%kvscope -o ...")
    @line_cell_magic
    def kvscope(self, line: str, cell: str | None = None):
        """Run a model on the kvscope engine in the background and watch it live.

        Examples::

          %kvscope --requests 32 --output-len 64 --num-blocks 256
          run = %kvscope --model smollm2 --prompts prompts.txt --html report.html -o
          %%kvscope --model smollm2 --wait
          Explain the KV cache in one sentence.
          Write a haiku about GPUs.

        The returned run (``-o``) has ``wait()``, ``stop()``, ``pause()``, ``resume()``, ``outputs``,
        ``steps`` and ``requests`` DataFrames, ``summary()``, ``save_trace()``, ``save_metrics()`` and
        ``save_html()``, and shows the dashboard when displayed.
        """
        args = parse_argstring(self.kvscope, line)
        run = build_run(args, cell)
        run.start()
        if not args.quiet:
            from IPython.display import display

            display(run)
        if args.wait:
            _wait(run, args.quiet)
        return run if args.return_run else None


def _check(args: argparse.Namespace, cell: str | None) -> None:
    if cell is not None and not cell.strip():
        raise UsageError("the %%kvscope cell is empty: write one prompt per line, or use %kvscope")
    sources = [name for name, given in (("cell prompts", cell is not None), ("--prompts", args.prompts),
                                        ("--requests", args.requests)) if given]
    if len(sources) > 1:
        raise UsageError(f"give requests one way only, not {' and '.join(sources)}")
    if args.num_blocks is not None and args.kv_memory is not None:
        raise UsageError("give --num-blocks or --kv-memory, not both")
    if args.shared_prefix < 0:
        raise UsageError("--shared-prefix must be >= 0")
    if args.profile < 0:
        raise UsageError("--profile must be >= 0 steps")
    if not 0 <= args.step_delay < math.inf:  # also refuses NaN
        raise UsageError("--step-delay must be a number of seconds >= 0")
    if not 0.5 <= args.refresh <= 10:
        raise UsageError("--refresh must be between 0.5 and 10 updates per second")
    from .cli_args import CLIError
    from .cli_run import check_model

    try:
        check_model(args.model)  # unknown names and missing folders, before anything starts
    except CLIError as exc:
        raise UsageError(str(exc)) from None


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine's configuration from the arguments (``UsageError`` with the reason if invalid)."""
    given = {"block_size": args.block_size, "num_blocks": args.num_blocks, "kv_cache_memory": args.kv_memory,
             "max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs,
             "max_model_len": args.max_model_len, "enable_prefix_caching": args.prefix_caching == "on"}
    try:
        return EngineConfig(**{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def workload(args: argparse.Namespace, cell: str | None, params: SamplingParams):
    """Work items, or a function of the engine that makes them (synthetic prompts need its vocabulary)."""
    if cell is not None or args.prompts:
        try:
            lines = numbered_prompts(cell) if cell is not None else read_prompt_lines(args.prompts)
            where = "the cell" if cell is not None else Path(args.prompts).name
            return prompts_workload([p for _, p in lines], args.output_len or (64, 64), seed=args.seed,
                                    params=params, ignore_eos=args.ignore_eos,
                                    sources=[f"line {n} of {where}" for n, _ in lines])
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def synthetic(engine) -> list[WorkItem]:
        special = set(engine.eos_token_ids)
        if engine.tokenizer is not None:
            special |= set(engine.tokenizer.all_special_ids)
        return synthetic_workload(args.requests or 16, args.prompt_len, args.output_len or (32, 128),
                                  vocab_size=engine.spec.vocab_size, shared_prefix_len=args.shared_prefix,
                                  seed=args.seed, params=params, exclude_ids=special)

    return synthetic


def build_run(args: argparse.Namespace, cell: str | None = None) -> LiveRun:
    """A ``LiveRun`` (not started) from parsed arguments; every check that can fail early runs here."""
    _check(args, cell)
    config = engine_config(args)
    params = sampling_params(args)
    items = workload(args, cell, params)
    model = args.model.strip()

    def make_engine():
        from .engine import Engine

        return Engine(model, config=config)

    outputs = Outputs(trace=args.trace, metrics=args.metrics, html=args.html)
    return LiveRun(make_engine, items, outputs=outputs, step_delay=args.step_delay, profile_steps=args.profile,
                   dashboard=not args.quiet,
                   dashboard_options={"refresh_hz": args.refresh, "rollover": args.rollover})


def _wait(run: LiveRun, quiet: bool) -> None:
    try:
        run.wait()
    except KeyboardInterrupt:
        written = "".join(f"; {kind}: {path}" for kind, path in run.files.written.items())
        print(f"interrupted: the run was stopped after {run.step} steps{written}")
        return
    except ValueError as exc:
        if run.engine is None:  # the model or the configuration was refused: nothing ran
            raise UsageError(str(exc)) from None
        raise
    if quiet:
        return
    s = run.summary() if run.records else {}
    line = f"{run.status}: {len(run.workload)} requests, {run.step} steps"
    if s.get("output_tokens_per_s") == s.get("output_tokens_per_s") and "output_tokens_per_s" in s:
        line += f", {s['output_tokens_per_s']:.1f} output tokens/s"
    for kind, path in run.files.written.items():
        line += f"; {kind}: {path}"
    for kind, why in run.files.errors.items():
        line += f"; could not write {kind}: {why}"
    failed = [o.error for o in run.outputs if o.finish_reason == "error"]
    if failed:
        line += f"; {len(failed)} request{'s' * (len(failed) > 1)} failed (first: {failed[0]})"
    print(line)


def load_ipython_extension(ipython) -> None:
    """Register the magics; in a notebook kernel also load BokehJS inline (offline-safe), which the
    dashboard's ``BokehModel`` widgets need in the page."""
    ipython.register_magics(KVScopeMagics)
    if getattr(ipython, "kernel", None) is not None:
        from .widgets.dashboard import ensure_bokehjs

        ensure_bokehjs()


def unload_ipython_extension(ipython) -> None:
    magics = ipython.magics_manager.magics
    for kind in ("line", "cell"):
        magics[kind].pop("kvscope", None)
