"""``kvscope calibrate RUN -o step.json``: fit a step-time model on a recorded run's own steps and print
how well it predicts the steps it was not fitted on (``kvscope.sim.calibrate``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError
from kvscope.cli.paths import check_output
from kvscope.options.values import out_path


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="a run's metrics (.metrics.jsonl) or trace (.trace.json); a watched "
                        "vLLM's too, if it ran with --enable-logging-iteration-details and the kvscope plugin")
    parser.add_argument("-o", "--output", metavar="FILE", type=out_path, required=True,
                        help="where to write the step model (JSON), for `kvscope simulate --step-model FILE`")
    parser.add_argument("--model", default="tiny", metavar="DIR", help="a watched vLLM: the folder of the model it "
                        "served (default: the folder the watch recorded), to replay its workload and align the steps")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the file written")


def cmd_calibrate(args: argparse.Namespace) -> int:
    from kvscope.runs.background.watched_schedule import calibration_steps
    from kvscope.runs.result.run import load
    from kvscope.sim.admission import MIN_IDLE_ARRIVALS
    from kvscope.sim.admission import measure as measure_admission
    from kvscope.sim.calibrate import describe_fit, fit_step_model

    output = check_output(str(args.output), "step model", "-o", inputs=[Path(args.run)], label="the run")
    try:
        run = load(args.run)
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot read the run {args.run!r}: {exc}") from None
    block = run.meta.get("block_size", 16)
    if "watch" in run.meta and not block:  # a watched vLLM's steps are counts only: no block arithmetic
        block = 16
    if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= 256 or block & (block - 1):
        raise CLIError(f"cannot calibrate on {args.run}: its header (the run's metadata) has block_size={block!r}, "
                       "which must be a power of two from 1 to 256; the file is damaged or edited: record the run "
                       "again with `kvscope run ... --out NAME`")
    try:
        records, alignment, note = calibration_steps(run, str(args.run), args.model)  # a watched vLLM: aligned
        model = fit_step_model(records, block, str(args.run))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if alignment is not None:
        model.fit["alignment"] = alignment
    delay = measure_admission(run.requests)  # before a request's first step at an idle engine
    model.admission_s = delay.seconds if delay is not None else 0.0
    model.fit["admission"] = delay.to_json() if delay is not None else {
        "admission_s": 0.0, "note": f"fewer than {MIN_IDLE_ARRIVALS} requests arrived at an idle engine: not measured"}
    path = model.save(output)
    if not args.quiet:
        print(describe_fit(model, str(args.run), str(output)) + (f"\n{note}" if note else ""))
        print()
    print(path)
    return 0


COMMAND = Command(
    name="calibrate",
    help="fit a step-time model on a recorded run, for kvscope simulate",
    description="Fit the step time of a recorded kvscope run as a function of what each step computed "
                "(prefill and decode tokens, sequences, context read by attention, blocks), per phase, and "
                "print the error on held-out steps.",
    epilog="example:\n  kvscope run --requests 64 --out real\n  kvscope calibrate real.metrics.jsonl -o step.json\n"
           "  kvscope simulate --step-model step.json --requests 256 --rate 50",
    add_options=_add_options,
    run=cmd_calibrate,
)
