"""Is a fitted step model good enough to simulate with? ``judge_fit`` reads ``kvscope calibrate``'s fit report
(``kvscope.sim.calibrate.fit_report``) and says so, why not, and what to do next; ``coefficient_units`` names what
each coefficient is a cost of.

The judgement compares the fit's error on held-out steps with what the run allows:

- *jitter*: how much two consecutive decode-only steps with the same batch differ (their work differs by one
  context token per request, so their difference is the machine's noise, not the model's). Where the fit's
  error is near the jitter, the line is as good as these step times allow, and a busy machine (other work, a
  laptop on battery) is what to fix, not the fit.
- *spread*: how much the step times vary at all (median absolute deviation from their median, relative). An
  error near the spread means the features explain little of the variation.
- too few steps to judge (held-out steps below ``MIN_HELD_OUT``), or steps so short (``SHORT_STEP_S``) that
  Python's per-step overhead, not the model's work, is what was measured.

Thresholds (``GOOD``, ``USABLE``) are relative errors of the held-out steps: the median says how well one
step's time (ITL) is predicted; the total says how well a run's duration (throughput) is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GOOD = {"median": 0.15, "p90": 0.40, "total": 0.10}  # good enough to simulate with
USABLE = {"median": 0.50, "p90": math.inf, "total": 0.10}  # durations and throughput, not per-step latency
MIN_HELD_OUT = 10  # held-out steps below this: too few to judge
SHORT_STEP_S = 1e-3  # a mean step below this measures Python's overhead more than the model's work
NOISY_JITTER = 0.15  # consecutive like steps differing by more than this: a busy machine

UNITS = {  # what each coefficient is a cost of (seconds each)
    "prefill_tokens": "per prefill token",
    "decode_tokens": "per decode token",
    "num_seqs": "per request in the batch",
    "context_tokens": "per context token read (all requests)",
    "prefill_attention": "per prefill token x its context token (a prefill's quadratic attention)",
    "blocks": "per KV block in the batch's tables",
    "decode_context": "per context token of a decoding request",
}


def coefficient_units(coef: Mapping[str, float]) -> list[str]:
    """Each non-zero coefficient with its unit: "12.3 us per prefill token" (ns where below 0.1 us)."""
    out = []
    for name, value in coef.items():
        if value < 1e-12:  # below a thousandth of a nanosecond: nothing at any size a run has
            continue
        us = value * 1e6
        shown = f"{us:.3g} us" if us >= 0.1 else f"{us * 1e3:.3g} ns"
        out.append(f"{shown} {UNITS.get(name, 'per ' + name)}")
    return out


@dataclass(slots=True)
class Verdict:
    """``level``: "good", "usable" or "not good enough"; ``reasons`` why not good; ``advice`` what to do."""

    level: str
    reasons: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)

    @property
    def good_enough(self) -> bool:
        return self.level != "not good enough"


def _pct(value: float) -> str:
    return f"{value:.0%}" if value >= 0.1 else f"{value:.1%}"


def judge_fit(fit: Mapping[str, Any]) -> Verdict:
    """The verdict on a fit report (``LinearStepModel.fit``); missing or non-finite numbers count as unknown."""
    def num(key: str) -> float | None:
        value = fit.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    median, p90, total = num("held_out_median_abs_error"), num("held_out_p90_abs_error"), num("held_out_total_error")
    held, mean_step = num("held_out_steps") or 0, num("mean_step_s")
    jitter, spread = num("jitter"), num("spread")
    if median is None or p90 is None or total is None:
        return Verdict("not good enough", ["the fit has no error figures (an older or edited file)"],
                       ["calibrate again with this kvscope version"])
    errors = {"median": median, "p90": p90, "total": abs(total)}
    if all(errors[k] <= GOOD[k] for k in GOOD):
        level = "good"
    elif all(errors[k] <= USABLE[k] for k in USABLE):
        level = "usable"
    else:
        level = "not good enough"
    reasons, advice = [], []
    if held < MIN_HELD_OUT:
        reasons.append(f"too few steps to judge: {held:.0f} held out (at least {MIN_HELD_OUT} wanted)")
        advice.append("record a longer run (more requests, longer outputs: -n 128 --output-len 64-128)")
        level = "not good enough"
    if mean_step is not None and mean_step < SHORT_STEP_S:
        reasons.append(f"steps too short: {mean_step * 1e3:.2f} ms on average, so per-step overhead and the "
                       "timer, not the model's work, were measured")
        advice.append("record with a bigger model or batch (--max-num-seqs, more requests at once)")
    if jitter is not None and jitter > NOISY_JITTER:
        near = median <= 1.5 * jitter
        reasons.append(f"a busy machine: consecutive like steps differ by {_pct(jitter)} (median), so no line can "
                       "predict a step better than that" + (f"; the fit's error ({_pct(median)}) is about that "
                                                            "noise" if near else ""))
        advice.append("record on an idle machine (close other work; `uptime` load below the number of cores), "
                      "or run more requests so the noise averages out in totals")
    if spread is not None and spread > 0 and median >= 0.8 * spread and (jitter is None or median > 1.5 * jitter):
        reasons.append(f"the features explain little: the fit's error ({_pct(median)}) is near the step times' own "
                       f"spread ({_pct(spread)})")
        advice.append("record a run whose steps vary in work (prompts of different lengths, --rate so batches "
                      "grow and shrink)")
    if level != "good" and not reasons:
        reasons.append(f"errors above what a good fit has (median {_pct(median)} vs {_pct(GOOD['median'])}, p90 "
                       f"{_pct(p90)} vs {_pct(GOOD['p90'])}, total {total:+.1%} vs ±{GOOD['total']:.0%})")
        advice.append("record a longer run on an idle machine and calibrate again")
    return Verdict(level, reasons, advice)


def describe_verdict(verdict: Verdict, run: str, output: str) -> list[str]:
    """The verdict as lines for the terminal, ending with the next command."""
    if verdict.level == "good":
        head = "verdict: good enough to simulate with (per-step times and run durations)"
    elif verdict.level == "usable":
        head = ("verdict: usable for run durations and throughput, not for per-step latency (ITL, TTFT of one "
                "request)")
    else:
        head = "verdict: not good enough to simulate with yet"
    lines = [head]
    lines += [f"  why: {r}" for r in verdict.reasons]
    lines += [f"  do: {a}" for a in dict.fromkeys(verdict.advice)]
    if verdict.good_enough:
        lines.append(f"next: kvscope simulate --step-model {output} --replay {run} --out replay "
                     f"&& kvscope compare {run} replay.metrics.jsonl")
    else:
        lines.append(f"next: record again with your model and engine options, e.g. kvscope run -n 128 --output-len "
                     f"64-128 --out calib && kvscope calibrate calib.metrics.jsonl -o {output}")
    return lines
