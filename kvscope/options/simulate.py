"""The options a simulation adds to the run options (``kvscope simulate`` and ``%kvscope simulate``),
declared once: what stands in for the model's forward pass, and what it replays."""

from __future__ import annotations

import argparse

from kvscope.options.parser import OptionError
from kvscope.options.values import out_path, probability
from kvscope.planning.gpus import GPUS

GPU_NAMES = ", ".join(GPUS)


def add_simulate_options(parser: argparse.ArgumentParser, switch: bool = False) -> None:
    """The simulation options; ``switch``: also ``--simulate`` (a sweep simulates its runs only when asked)."""
    sim = parser.add_argument_group("simulation")
    if switch:
        sim.add_argument("--simulate", action="store_true", help="simulate each run (kvscope simulate) instead of "
                         "running the model: a sweep in seconds; needs --step-model, --gpu or --replay")
    sim.add_argument("--step-model", metavar="FILE", help="step times from a model fitted by `kvscope calibrate`")
    sim.add_argument("--gpu", metavar="NAME", help="step times from a roofline of this GPU's data sheet "
                     f"({GPU_NAMES}); its memory minus the weights and a 4 GiB activation reserve is the KV pool "
                     "unless given")
    sim.add_argument("--replay", metavar="RUN", type=out_path, help="submit a recorded run's requests (prompts, "
                     "output lengths, arrival times; --rate re-times them) and take its model shape and engine "
                     "settings (pool, block size, batch limits, prefix caching: the engine options given override "
                     "them, the what-if, and the output says what changed from the run); without --step-model or "
                     "--gpu, calibrate on that run itself")
    sim.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), help="KV and weight dtype (default: "
                     "bfloat16 with --gpu, else float32 as kvscope run on a CPU)")
    sim.add_argument("--acceptance-rate", type=probability, metavar="P", help="with --speculative: each draft is "
                     "accepted with probability P, until the first rejection (measured: a run's spec_acceptance_rate "
                     "is the share of draft tokens accepted)")
    sim.add_argument("--kv-bandwidth", type=bandwidth, metavar="GB/S", help="with --pd: the KV transfer "
                     "bandwidth between instances in GB/s (10^9 bytes/s; default 25, a 200 Gb/s NIC; NVLink "
                     "is ~450: kvscope.pd.sim_engine.SimLink's default)")
    sim.add_argument("--kv-latency", type=latency, metavar="SECONDS", help="with --pd: fixed time added to "
                     "every KV transfer (default 0.0001 s: SimLink's)")
    sim.add_argument("--static", action="store_true", help="static reservation instead of paging: each running "
                     "request holds max_model_len slots, so fewer run at once")
    sim.add_argument("--engine", choices=("kvscope", "vllm"), default="kvscope",
                     help="whose scheduling rules: kvscope's own (default), or vLLM 0.32's (the whole sequence must "
                     "fit to be admitted, ...: docs/vllm_scheduling.md) with its CPU defaults where not given "
                     "(--max-num-batched-tokens 2048, --max-num-seqs 128, --block-size 128; a replay keeps its "
                     "run's)")


def simulate_fields(args: argparse.Namespace) -> dict:
    """``SimSpec``'s fields from parsed options (``kvscope.runs.setup.simulated.SimSpec(**simulate_fields(args))``)."""
    return {"step_model": args.step_model, "gpu": args.gpu, "replay": str(args.replay) if args.replay else None,
            "dtype": args.dtype, "static": args.static, "acceptance_rate": args.acceptance_rate,
            "kv_bandwidth": args.kv_bandwidth, "kv_latency": args.kv_latency,
            "engine": getattr(args, "engine", "kvscope")}


def bandwidth(text: str) -> float:
    """``--kv-bandwidth``: GB/s, above 0 and at most 100,000."""
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"--kv-bandwidth {text!r} is not a number of GB/s (e.g. 25)") from None
    if not 0 < value <= 1e5:  # also refuses NaN and infinity
        raise OptionError(f"--kv-bandwidth {text!r} must be above 0 and at most 100000 GB/s")
    return value


def latency(text: str) -> float:
    """``--kv-latency``: seconds, from 0 to 10."""
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"--kv-latency {text!r} is not a number of seconds (e.g. 0.0001)") from None
    if not 0 <= value <= 10:
        raise OptionError(f"--kv-latency {text!r} must be between 0 and 10 seconds")
    return value
