"""The latency objective: ``--slo ttft_p99=0.5,itl_p99=0.05`` and the goodput fraction (``--goodput-fraction``).

Each term is ``METRIC_pQ=SECONDS`` with METRIC one of ``ttft`` (arrival to first token), ``itl`` (the request's
mean time between output tokens after the first, DistServe's TPOT: ``(e2e - ttft) / (output tokens - 1)``;
``tpot`` is the same) or ``e2e`` (arrival to last token), and Q one of 50, 90, 95, 99 (or 99.9). All three are
per request, so a request either meets a threshold or not.

A rate **meets the SLO** when both hold (``Verdict``):

- every term: its percentile over the requests is at most its threshold. The percentile is the nearest rank
  (``sorted[ceil(q N) - 1]``), so ``ttft_p99 <= T`` exactly when at most ``N - ceil(0.99 N)`` requests exceed T;
- at least ``fraction`` of the requests (DistServe's 90% by default) meet every threshold at once.

**Goodput** is the highest arrival rate that meets the SLO (``kvscope.search.goodput`` finds it by bisection).

**Early stop** (``Tally.lost``): a request that fails a threshold cannot un-fail it (a request still waiting for
its first token past the TTFT threshold, or unfinished past the E2E one, has already failed them), so once more
requests have failed a term than the term allows, or more have failed any term than the fraction allows, the
rate is lost whatever the rest do, and its simulation stops there. The rule is exact: stopping changes no
verdict, only the percentiles a lost rate reports (of the requests finished so far).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

METRICS = ("ttft", "itl", "e2e")
ALIASES = {"tpot": "itl"}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p99.9": 0.999}
SYNTAX = "METRIC_pQ=SECONDS,... with METRIC ttft, itl or e2e and Q 50, 90, 95, 99: e.g. ttft_p99=0.5,itl_p99=0.05"


@dataclass(frozen=True, slots=True)
class Term:
    """One bound: the ``quantile`` of ``metric`` at most ``seconds``."""

    metric: str
    quantile: float
    seconds: float
    name: str  # as written, normalised: "ttft_p99"

    def allowed(self, n: int) -> int:
        """How many of ``n`` requests may exceed the threshold (nearest-rank percentile)."""
        return n - math.ceil(round(self.quantile * n, 9))


@dataclass(frozen=True, slots=True)
class SLO:
    terms: tuple[Term, ...]
    fraction: float = 0.9  # of the requests that must meet every threshold (DistServe's goodput)

    @classmethod
    def parse(cls, text: str, fraction: float = 0.9) -> SLO:
        if not 0 < fraction <= 1:
            raise ValueError(f"--goodput-fraction {fraction!r} must be above 0 and at most 1 (e.g. 0.9)")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"the SLO is empty: give {SYNTAX}")
        terms: list[Term] = []
        for part in text.replace(" ", "").split(","):
            key, eq, value = part.partition("=")
            metric, _, q = key.lower().rpartition("_")
            metric = ALIASES.get(metric, metric)
            if not eq or metric not in METRICS or q not in QUANTILES:
                raise ValueError(f"SLO term {part!r} is not {SYNTAX}")
            try:
                seconds = float(value)
            except ValueError:
                raise ValueError(f"SLO term {part!r}: {value!r} is not a number of seconds") from None
            if not 0 < seconds < 1e6:
                raise ValueError(f"SLO term {part!r}: the threshold must be above 0 seconds")
            name = f"{metric}_{q}"
            if any(t.name == name for t in terms):
                raise ValueError(f"SLO term {name} is given twice")
            terms.append(Term(metric, QUANTILES[q], seconds, name))
        return cls(tuple(terms), fraction)

    def __str__(self) -> str:
        return ",".join(f"{t.name}={t.seconds:g}" for t in self.terms)

    def tightest(self) -> Term:
        """The term with the smallest threshold (the Pareto page's x axis)."""
        return min(self.terms, key=lambda t: (t.seconds, t.name))

    def thresholds(self) -> dict[str, float]:
        """Per metric, the smallest threshold any term sets (what a request must meet)."""
        out: dict[str, float] = {}
        for t in self.terms:
            out[t.metric] = min(out.get(t.metric, math.inf), t.seconds)
        return out


@dataclass(slots=True)
class Tally:
    """Requests counted against an SLO as they finish or fail, out of ``total``: the early-stop rule."""

    slo: SLO
    total: int
    failed: dict[str, int] = field(default_factory=dict)  # metric -> requests that exceeded its threshold
    failed_any: int = 0
    doomed: set[str] = field(default_factory=set)  # unfinished requests already counted (ttft or e2e passed)
    limits: dict[str, float] = field(default_factory=dict)  # the slo's thresholds, per metric

    def __post_init__(self) -> None:
        self.limits = self.slo.thresholds()
        self.failed = {m: 0 for m in self.limits}

    def finished(self, request_id: str, ttft: float, itl: float, e2e: float) -> None:
        if request_id in self.doomed:
            self.doomed.discard(request_id)
            return
        self._count({"ttft": ttft, "itl": itl, "e2e": e2e})

    def overdue(self, request_id: str, waited_s: float, started: bool) -> None:
        """An unfinished request ``waited_s`` after its arrival (``started``: it has its first token)."""
        if request_id in self.doomed:
            return
        over = {"e2e": waited_s} if started else {"ttft": waited_s, "e2e": waited_s}
        if any(over[m] > lim for m, lim in self.limits.items() if m in over):
            self.doomed.add(request_id)
            self._count({m: over.get(m, 0.0) for m in METRICS})

    def _count(self, values: dict[str, float]) -> None:
        bad = False
        for m, lim in self.limits.items():
            if values[m] > lim:
                self.failed[m] += 1
                bad = True
        self.failed_any += bad

    def lost(self) -> str | None:
        """The term (or ``"fraction"``) already lost whatever the other requests do; ``None`` while any can hold."""
        for t in self.slo.terms:
            if self.failed[t.metric] > t.allowed(self.total) and self._only_this_threshold(t):
                return t.name
        if self.failed_any > self.total - math.ceil(round(self.slo.fraction * self.total, 9)):
            return "fraction"
        return None

    def _only_this_threshold(self, term: Term) -> bool:
        """Failures are counted at the metric's tightest threshold; a looser term of the same metric (``ttft_p50``
        beside ``ttft_p99``) is judged at the end only."""
        return term.seconds == self.limits[term.metric]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One simulated rate judged: the percentiles of each term, the share meeting every threshold, and the
    first broken term (the one furthest over its threshold; ``fraction`` if only the fraction failed)."""

    percentiles: dict[str, float]
    attained: float
    broke: str | None
    stopped_early: bool = False

    @property
    def ok(self) -> bool:
        return self.broke is None


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank percentile of ascending ``sorted_values`` (``nan`` if empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(round(q * len(sorted_values), 9)))
    return sorted_values[rank - 1]


def judge(slo: SLO, per_request: dict[str, list[float]], total: int, lost: str | None = None,
          stopped_early: bool = False) -> Verdict:
    """The verdict on ``per_request`` metric values (one list per metric, a value per finished request, requests
    that never finished counted as failing every threshold) out of ``total`` submitted. ``lost``: the term the
    ``Tally`` found lost first during the simulation (then it is what broke, whether or not the simulation went on,
    so an early stop changes nothing); else the term furthest over its threshold, or ``fraction``."""
    unfinished = total - len(per_request["ttft"])
    limits = slo.thresholds()
    pcts: dict[str, float] = {}
    worst: tuple[float, str] | None = None
    for t in slo.terms:
        values = sorted(per_request[t.metric]) + [math.inf] * unfinished
        p = percentile(values, t.quantile)
        pcts[t.name] = p
        if p > t.seconds and (worst is None or p / t.seconds > worst[0]):
            worst = (p / t.seconds, t.name)
    meets = sum(all(per_request[m][i] <= lim for m, lim in limits.items()) for i in range(len(per_request["ttft"])))
    attained = meets / total if total else 0.0
    broke = worst[1] if worst is not None else ("fraction" if attained < slo.fraction - 1e-12 else None)
    if lost is not None:
        broke = lost
    return Verdict(pcts, attained, broke, stopped_early)
