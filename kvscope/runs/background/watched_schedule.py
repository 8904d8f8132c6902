"""The schedule a watched vLLM ran, recovered by replaying its workload through the simulator under vLLM's rules,
and its steps aligned with the server's iteration lines (``kvscope.sim.align``): what ``kvscope calibrate`` fits
on for a watched run, so that the step model gets the context features too.

The replay is ``kvscope simulate --replay RUN --engine vllm`` with the server's settings
(``kvscope.runs.setup.watched_replay``), timed by the server's own steps (``RecordedPace``: the k-th simulated step
lasts as long as the k-th watched one, so the arrivals fall between the same steps), past them by a fit on the
watched counts. Where the batches still differ, those steps stay unmatched and, past ``MIN_MATCHED``, the
alignment fails and calibrate fits on the counts alone.
"""

from __future__ import annotations

from kvscope.options.parser import OptionError
from kvscope.runs.background.live import LiveRun
from kvscope.runs.result.run import Run
from kvscope.runs.setup.simulated import SimSpec, prepare_simulation
from kvscope.runs.setup.spec import RunSpec
from kvscope.sim.admission import measure as measure_admission
from kvscope.sim.align import MIN_MATCHED, Alignment, RecordedPace, align_steps, recorded_periods, with_periods
from kvscope.sim.build import VLLM_CPU_DEFAULTS, with_engine_rules

MAX_SIM_S = 600.0


def replayed_schedule(run: Run, path: str, model: str) -> Run:
    """The watched run at ``path`` replayed under vLLM's rules (``model``: the served model's folder, or ``tiny``
    for the folder the watch recorded)."""
    setup = prepare_simulation(RunSpec(model=model), SimSpec(replay=path))
    # the server's own step times, in order (kvscope.sim.align.RecordedPace); the counts' fit past them
    setup.step_model = RecordedPace(recorded_periods(run.records), setup.step_model)
    setup.config = with_engine_rules(setup.config, "vllm", set(VLLM_CPU_DEFAULTS))
    delay = measure_admission(run.requests)  # the server's own delay, so arrivals fall between the same steps
    setup.admission_s = delay.seconds if delay is not None else 0.0
    # every step's batch, not the last window's: the alignment pairs them from the first (MAX_SIM_S bounds them)
    setup.window_steps = max(setup.window_steps, 2 * len(run.records) + 64)
    live = LiveRun(setup.make_engine, setup.workload, **setup.run_options(), dashboard=False)
    try:
        live.start().wait(MAX_SIM_S)
    except TimeoutError:
        live.stop()
        live.wait()
        raise ValueError(f"the replay of {path} did not end in {MAX_SIM_S:.0f} s") from None
    except Exception as exc:
        raise ValueError(f"the replay of {path} failed: {exc}") from None
    return live.run


def aligned_steps(run: Run, path: str, model: str) -> Alignment:
    """The watched run's steps aligned with its replay's (``kvscope.sim.align``); ``ValueError`` (or
    ``OptionError``) if it cannot be replayed."""
    return align_steps(run.records, replayed_schedule(run, path, model).records)


def calibration_steps(run: Run, path: str, model: str) -> tuple[list, dict | None, str | None]:
    """What ``kvscope calibrate`` fits on: a kvscope run's own records; a watched vLLM's steps aligned with its
    replay's batches, or its steps' counts alone when the alignment fails (with why). Returns the records, the
    alignment's report (``None`` for a kvscope run) and a line for the terminal."""
    if "watch" not in run.meta:
        return run.records, None, None
    try:
        alignment = aligned_steps(run, path, model)
    except (ValueError, OptionError) as exc:
        return with_periods(run.records), {"ok": False, "reason": str(exc)}, (
            f"alignment: not possible ({exc}); fitted on the iteration lines' counts alone (no context features)")
    report = alignment.to_json()
    if not alignment.ok:
        return with_periods(run.records), report, (
            f"alignment: only {alignment.matched} of {alignment.watched_steps} steps matched the replay's batches "
            f"(below {MIN_MATCHED:.0%}); fitted on the iteration lines' counts alone (no context features)")
    return alignment.records, report, (
        f"alignment: {alignment.matched} of {alignment.watched_steps} steps matched the replay's batches under "
        "vLLM's rules; fitted with their context features")
