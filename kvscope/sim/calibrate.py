"""``kvscope calibrate``: fit a ``LinearStepModel`` on a recorded run's own steps.

Each step that computed tokens is one sample: its features (``StepFeatures.of_record``) and its period,
``t_start`` of the next step minus its own when the engine went straight on (requests were still running
or waiting after it), else its duration. A watched vLLM's steps count too when its plugin lines carry the
iteration's details (``--enable-logging-iteration-details``: tokens, requests and ``elapsed_ms``; no context
lengths, so those features stay unfitted), each step's period then being its own duration. Per phase (steps
with a prefill chunk; decode-only steps), the coefficients are non-negative least squares (a cost per token is
never negative) solved by an active set over numpy's ``lstsq``; ordinary, not relative, least squares, so the
line gets the *mean* right (a run's duration); the scatter around it (``ratio_quantiles``) gets the median
right (ITL). Every fifth step is held out and the fit is judged on those: per-step relative error of the line
(median, p90) and the error of their total. Features that never vary in a phase get no coefficient, and say
so; nor does ``blocks`` (``NOT_SEPARABLE``).

The prefill phase's fixed cost is at least the decode phase's (fitted first): a step with a prefill chunk does
a decode step's fixed work and more. Free, NNLS let the mixed steps' decode tokens stand in for it (in a
calibration run most mixed steps carry many decodes), and then under-predicted mixed steps with few decodes:
``benchmarks/simulate.py``, smollm2, the small pool's duration -6.8% -> -3.0% on the same recorded runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvscope.sim.step_model import LinearStepModel, PhaseFit
from kvscope.sim.verdict import coefficient_units, describe_verdict, judge_fit
from kvscope.telemetry.records import StepRecord
from kvscope.telemetry.step_features import FEATURE_NAMES, PHASES, StepFeatures

HOLD_OUT_EVERY = 5
MIN_STEPS = 10
NUM_QUANTILES = 41
# One run has one block size, so ``blocks`` is its context / block_size rounded up: a fit cannot tell their costs
# apart, and a coefficient on blocks mispredicts another block size (benchmarks/simulate.py, smollm2: ITL p50
# -11.5% at block size 32 with it). It is left unfitted, like a feature that never varies.
NOT_SEPARABLE = ("blocks",)


def step_samples(records: Sequence[StepRecord], block_size: int,
                 untimed: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features ``[N, F]`` and periods ``[N]`` (seconds) of the steps that computed tokens in a time above 0
    (a step of no length cannot be timed: its step number goes into ``untimed``)."""
    rows, periods = [], []
    for i, r in enumerate(records):
        if not r.scheduled and not (r.num_tokens and r.duration_ns > 0):
            continue  # a state record (nothing ran), or a watched step without its iteration's time
        period = r.duration_ns
        nxt = records[i + 1] if i + 1 < len(records) else None
        if r.scheduled and nxt is not None and nxt.scheduled and (r.num_running or r.num_waiting) \
                and nxt.t_start_ns >= r.t_end_ns:
            period = nxt.t_start_ns - r.t_start_ns
        if period <= 0:
            if untimed is not None:
                untimed.append(r.step)
            continue
        rows.append(StepFeatures.of_record(r, block_size).values())
        periods.append(period / 1e9)
    return np.asarray(rows, dtype=np.float64).reshape(-1, len(FEATURE_NAMES)), np.asarray(periods)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||a x - b|| with x >= 0 (an active set: solve, drop the most negative column, repeat)."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def fit_phase(x: np.ndarray, y: np.ndarray, min_intercept: float = 0.0) -> tuple[PhaseFit, list[str]]:
    """One phase's line (NNLS with an intercept of at least ``min_intercept``) and scatter; the features it
    could not fit."""
    if len(y) == 0:
        return PhaseFit(min_intercept, {}), list(FEATURE_NAMES)
    varying = [j for j in range(x.shape[1]) if np.ptp(x[:, j]) > 0 and FEATURE_NAMES[j] not in NOT_SEPARABLE]
    sol = nnls(np.column_stack([np.ones(len(y)), x[:, varying]]), y - min_intercept)  # the excess is >= 0
    phase = PhaseFit(min_intercept + float(sol[0]), {FEATURE_NAMES[j]: float(c) for j, c in zip(varying, sol[1:])})
    line = np.array([phase.line(StepFeatures(*map(int, row))) for row in x])
    ratios = y / np.maximum(line, 1e-9)
    phase.ratio_quantiles = [float(q) for q in np.quantile(ratios, np.linspace(0, 1, NUM_QUANTILES))]
    return phase, [FEATURE_NAMES[j] for j in range(x.shape[1]) if j not in varying]


def fit_step_model(records: Sequence[StepRecord], block_size: int, source: str = "") -> LinearStepModel:
    """The step model of a run; ``ValueError`` if it has too few steps to fit."""
    untimed: list[int] = []
    x, y = step_samples(records, block_size, untimed)
    if len(y) < MIN_STEPS:
        zero = (f"; {len(untimed)} of its steps have no length (start and end at the same time, e.g. step "
                f"{untimed[0]}: an edited file or a clock too coarse to time them), so they cannot be fitted"
                if untimed else "")
        raise ValueError(f"the run has {len(y)} timed steps that computed tokens; calibrating needs at least "
                         f"{MIN_STEPS} (run more requests or longer outputs; a watched vLLM must run with "
                         "--enable-logging-iteration-details and the kvscope plugin, whose step lines then carry each "
                         f"step's tokens and time){zero}")
    held = np.zeros(len(y), dtype=bool)
    held[HOLD_OUT_EVERY - 1 :: HOLD_OUT_EVERY] = True
    prefill = x[:, FEATURE_NAMES.index("prefill_tokens")] > 0
    phases, unfitted = {}, {}
    decode, mixed = ~prefill & ~held, prefill & ~held
    phases["decode"], unfitted["decode"] = fit_phase(x[decode], y[decode])
    # A step with a prefill chunk runs the same forward pass and loop as a decode step, and more: its fixed cost
    # is at least a decode step's (the module doc).
    phases["prefill"], unfitted["prefill"] = fit_phase(x[mixed], y[mixed], phases["decode"].intercept_s)
    model = LinearStepModel({name: phases[name] for name in PHASES}, source=source)
    model.fit = fit_report(model, x, y, held, unfitted)
    if untimed:
        model.fit["untimed_steps"] = len(untimed)
    return model


def fit_report(model: LinearStepModel, x: np.ndarray, y: np.ndarray, held: np.ndarray,
               unfitted: dict[str, list[str]]) -> dict[str, Any]:
    """How well the model's line predicts the held-out steps (relative errors) and all of them (in total)."""
    pred = np.array([model.expected(StepFeatures(*map(int, row))) for row in x])
    test = held if held.any() else ~held
    rel = np.abs(pred[test] - y[test]) / np.maximum(y[test], 1e-9)
    median = float(np.median(y))
    report = {
        "steps": len(y),
        "held_out_steps": int(test.sum()),
        "held_out_median_abs_error": float(np.median(rel)),
        "held_out_p90_abs_error": float(np.percentile(rel, 90)),
        "held_out_total_error": float(pred[test].sum() / max(float(y[test].sum()), 1e-12) - 1),
        "all_total_error": float(pred.sum() / max(float(y.sum()), 1e-12) - 1),
        "mean_step_s": float(y.mean()),
        # the step times' own variation, and the machine's noise (kvscope.sim.verdict reads both)
        "spread": float(np.median(np.abs(y - median)) / median) if median > 0 else None,
        "jitter": jitter(x, y),
        "features_not_varied": unfitted,
    }
    return {k: v if not isinstance(v, float) or np.isfinite(v) else None for k, v in report.items()}  # JSON


def jitter(x: np.ndarray, y: np.ndarray, min_pairs: int = 5) -> float | None:
    """The median relative difference of consecutive decode-only steps with the same batch (the same requests
    and decode tokens: their work differs by a context token each), i.e. the machine's step-to-step noise;
    ``None`` with fewer than ``min_pairs`` such pairs."""
    p, d, n = (FEATURE_NAMES.index(k) for k in ("prefill_tokens", "decode_tokens", "num_seqs"))
    like = (x[1:, p] == 0) & (x[:-1, p] == 0) & (x[1:, d] == x[:-1, d]) & (x[1:, n] == x[:-1, n])
    if int(like.sum()) < min_pairs:
        return None
    a, b = y[1:][like], y[:-1][like]
    return float(np.median(np.abs(a - b) / np.maximum((a + b) / 2, 1e-12)))


def describe_fit(model: LinearStepModel, run: str | None = None, output: str | None = None) -> str:
    """The fit as a few lines for the terminal: the step time per phase with each coefficient's unit, the
    held-out error beside the step times' noise, and the verdict (``kvscope.sim.verdict``) with the next
    command (when ``run`` and ``output`` are given)."""
    fit = model.fit

    def num(key: str) -> float:
        value = fit.get(key)
        return float(value) if isinstance(value, (int, float)) else float("nan")

    lines = [f"step model fitted on {fit.get('steps', '?')} steps of {model.source or 'the run'} "
             f"(mean step {num('mean_step_s') * 1e3:.2f} ms); the time of a step, per phase:"]
    for name, phase in model.phases.items():
        terms = coefficient_units(phase.coef)
        q = phase.ratio_quantiles
        lines.append(f"  {name:<8} {phase.intercept_s * 1e3:.3f} ms per step" + "".join(f" + {t}" for t in terms)
                     + (f"; scatter x{q[len(q) // 2]:.2f} median (x{q[len(q) // 10]:.2f}-x{q[-1 - len(q) // 10]:.2f})"
                        if q else ""))
    noise = [f"step times spread {num('spread'):.1%}" if fit.get("spread") is not None else "",
             f"consecutive like steps differ {num('jitter'):.1%}" if fit.get("jitter") is not None else ""]
    noise_text = "; ".join(n for n in noise if n)
    lines.append(f"held-out steps ({fit.get('held_out_steps', 0)}): median error "
                 f"{num('held_out_median_abs_error'):.1%}, p90 {num('held_out_p90_abs_error'):.1%}, "
                 f"total {num('held_out_total_error'):+.1%}" + (f" ({noise_text})" if noise_text else ""))
    admission = fit.get("admission")
    if isinstance(admission, dict) and admission.get("idle_arrivals"):
        lines.append(f"admission: {model.admission_s * 1e3:.2f} ms from arrival to the first schedule at an idle "
                     f"engine (median of {admission['idle_arrivals']} requests)")
    if fit.get("untimed_steps"):
        lines.append(f"left out: {fit['untimed_steps']} steps of no length (they cannot be timed)")
    if run is not None and output is not None:
        lines += describe_verdict(judge_fit(fit), run, output)
    return "\n".join(lines)
