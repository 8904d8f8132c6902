"""``Comparison``: runs side by side, as a summary table with ratios against the first run.

```python
cmp = kvscope.compare("bs16.trace.json", "bs64.trace.json", labels=["16", "64"])  # or Run objects
cmp.table                  # metric x run DataFrame: each run's value, then "<run> / <first>" ratios
cmp.per_run                # one row per run (a sweep's: per value, the median of its --repeat runs; its CSV)
cmp.warnings               # different systems, models, workloads or devices; dropped steps; unfinished requests
cmp.notes                  # what relates them without a warning: a simulation replaying another of the runs
cmp.show()                 # in a notebook: the table, overlaid time series and latency, page maps
cmp.save_html("cmp.html")  # the same, standalone and offline (``kvscope.widgets.compare``)
```

Every value in ``table`` is the run's own ``Run.summary()`` value (``static_reservation_x_pool`` is
derived: the peak static reservation over the KV pool's bytes). A ratio is value / first run's value:
NaN where the first is 0 or NaN (1.0 when both are 0).
What sets the runs apart (``differences``, ``warnings``, ``notes``) is ``differences.py``'s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvscope.runs.result.differences import replay_notes, setting_differences, unlike_warnings
from kvscope.runs.result.run import Run


@dataclass(slots=True, frozen=True)
class Metric:
    """One row of the summary table."""

    key: str  # a key of Run.summary() (or a derived one, see ``_value``)
    name: str
    unit: str = ""  # "ms", "%", "MiB", "x", or ""
    better: str = ""  # "higher", "lower" or "" (neither): colours the ratio


METRICS = (
    Metric("output_tokens_per_s", "throughput (output tokens/s)", better="higher"),
    Metric("total_tokens_per_s", "throughput incl. prefill (tokens/s)", better="higher"),
    Metric("ttft_p50_s", "TTFT p50", "ms", "lower"),
    Metric("ttft_p90_s", "TTFT p90", "ms", "lower"),
    Metric("ttft_p99_s", "TTFT p99", "ms", "lower"),
    Metric("itl_p50_s", "ITL p50", "ms", "lower"),
    Metric("itl_p99_s", "ITL p99", "ms", "lower"),
    Metric("e2e_p50_s", "end-to-end latency p50", "ms", "lower"),
    Metric("peak_block_usage", "peak KV use (share of the pool)", "%"),
    Metric("peak_kv_bytes", "peak KV use (memory)", "MiB", "lower"),
    Metric("static_reservation_x_pool", "static reservation at its peak (x the pool)", "x"),
    Metric("mean_fragmentation", "fragmentation (mean)", "%", "lower"),
    Metric("preemptions", "preemptions", better="lower"),
    Metric("prefix_cache_hits", "prefix-cache hits (prompt tokens)", better="higher"),
    Metric("prefix_cache_hit_rate", "prefix-cache hit rate", "%", "higher"),
    Metric("spec_acceptance_rate", "speculative decoding: drafts accepted", "%", "higher"),
    Metric("spec_mean_acceptance_length", "speculative decoding: tokens per verification", better="higher"),
    Metric("requests", "requests"),
    Metric("output_tokens", "output tokens"),
    Metric("steps", "steps", better="lower"),
    Metric("duration_s", "duration", "ms", "lower"),
)
METRIC = {m.key: m for m in METRICS}


def _ratio(value: float, base: float) -> float:
    if value != value or base != base:
        return math.nan
    if base == 0:
        return 1.0 if value == 0 else math.nan
    return value / base


def _value(run: Run, summary: dict[str, Any], key: str) -> float:
    if key == "static_reservation_x_pool":
        pool = run.meta.get("kv_pool_bytes") or (run.meta.get("num_blocks", 0) * run.meta.get("kv_bytes_per_block", 0))
        return summary["peak_static_reservation_bytes"] / pool if pool else math.nan
    return summary[key]


def _load(item: Run | str | os.PathLike) -> Run:
    if isinstance(item, Run):
        return item
    so_far = getattr(item, "run", None)  # a LiveRun's: the run so far, or all of it once over
    if isinstance(so_far, Run):
        return so_far
    if isinstance(item, (str, os.PathLike)):
        return Run.load(item)  # ValueError naming the file: missing, empty, damaged, another tool's
    raise TypeError(f"compare() takes Runs or paths of saved runs, not {type(item).__name__}")


def _name(run: Run, index: int) -> str:
    source = run.meta.get("source")
    return Path(source).name if source else f"run {index + 1}"


def unique_labels(labels: Sequence[str]) -> list[str]:
    """Labels made distinct: a repeated one gets " (2)", " (3)", ... (a file compared with itself)."""
    out: list[str] = []
    for label in labels:
        candidate, n = label, 1
        while candidate in out:
            n += 1
            candidate = f"{label} ({n})"
        out.append(candidate)
    return out


class Comparison:
    """Runs compared with the first one. ``Comparison(runs, labels)``; ``kvscope.compare`` is the way in."""

    metrics: Sequence[Metric] = METRICS

    def __init__(self, runs: Sequence[Run], labels: Sequence[str] | None = None,
                 swept: tuple[str, Sequence[Any]] | None = None) -> None:
        if not runs:
            raise ValueError("compare needs at least one run")
        for i, run in enumerate(runs):
            if not run.records:
                raise ValueError(f"{_name(run, i)}: the run recorded no steps; nothing to compare")
        if labels is not None and len(labels) != len(runs):
            raise ValueError(f"{len(labels)} labels for {len(runs)} runs; give one label per run")
        self.runs = list(runs)
        self.labels = unique_labels([str(s) for s in labels] if labels is not None
                                    else [_name(r, i) for i, r in enumerate(runs)])
        self.swept = swept  # (option, values): set by kvscope.runs.background.sweep
        self.summaries = [run.summary() for run in self.runs]
        # per run, metric -> (min, max) over its repeats (a sweep's --repeat); empty: one run each, no spread
        self.spreads: list[dict[str, tuple[float, float]]] = []

    # ---- the numbers ---------------------------------------------------------------------------
    @property
    def table(self) -> pd.DataFrame:
        """Rows: ``METRICS`` keys; columns: each run's value, then ``"<run> / <first>"`` for the others."""
        first = self.labels[0]
        values = {label: [_value(r, s, m.key) for m in METRICS]
                  for label, r, s in zip(self.labels, self.runs, self.summaries)}
        frame = pd.DataFrame(index=pd.Index([m.key for m in METRICS], name="metric"))
        for label in self.labels:
            frame[label] = values[label]
        for label in self.labels[1:]:
            frame[f"{label} / {first}"] = [_ratio(v, b) for v, b in zip(values[label], values[first])]
        return frame

    @property
    def ratios(self) -> pd.DataFrame:
        """Rows: metrics; columns: runs; each value over the first run's (the first column is all 1 or NaN)."""
        table = self.table
        first = table[self.labels[0]]
        return pd.DataFrame({label: [_ratio(v, b) for v, b in zip(table[label], first)] for label in self.labels},
                            index=table.index)

    @property
    def per_run(self) -> pd.DataFrame:
        """One row per run: label, the swept option's value (a sweep), model, source, every metric. A sweep
        keeps one run per value (``kvscope.runs.background.sweep``): with ``--repeat N`` its row is the median of
        the N runs, metric by metric, and the warm-up run is in no row."""
        rows = []
        for i, (label, run, s) in enumerate(zip(self.labels, self.runs, self.summaries)):
            row: dict[str, Any] = {"run": label}
            if self.swept is not None:
                row[self.swept[0]] = self.swept[1][i]
            row.update(model=run.meta.get("model"), source=run.meta.get("source"))
            row.update({m.key: _value(run, s, m.key) for m in METRICS})
            rows.append(row)
        return pd.DataFrame(rows)

    def save_csv(self, path: str | os.PathLike) -> Path:
        """``per_run`` as CSV (atomically)."""
        from kvscope.utils.files import atomic_write

        frame = self.per_run
        return atomic_write(path, lambda f: frame.to_csv(f, index=False))

    def within_noise(self, key: str, index: int) -> bool:
        """Whether run ``index``'s ``key`` differs from the first run's by no more than their repeats scatter
        (their min-max ranges overlap): such a difference is not coloured as a win or a loss."""
        if len(self.spreads) <= index or not self.spreads[0] or key not in self.spreads[index]:
            return False
        (lo, hi), (lo0, hi0) = self.spreads[index][key], self.spreads[0].get(key, (math.nan, math.nan))
        return lo <= hi0 and lo0 <= hi

    # ---- what differs (differences.py) -------------------------------------------------------
    @property
    def differences(self) -> dict[str, list[Any]]:
        """Engine settings (and the model) whose values differ between the runs: name -> value per run."""
        return setting_differences(self.runs)

    @property
    def warnings(self) -> list[str]:
        """What makes the runs not like for like, one sentence each."""
        return unlike_warnings(self.labels, self.runs, self.summaries)

    @property
    def notes(self) -> list[str]:
        """What relates the runs without making them unlike, one sentence each: a simulation that replays
        another run of the comparison (its requests, on the run's engine settings but those it changed)."""
        return replay_notes(self.labels, self.runs)

    # ---- display -------------------------------------------------------------------------------
    def save_html(self, path: str | os.PathLike) -> Path:
        """A standalone HTML comparison (BokehJS inlined: opens offline)."""
        from kvscope.widgets.compare import save_html

        return save_html(self, path)

    def show(self) -> None:
        """Display the comparison in a notebook (table, overlaid series and latency, page maps)."""
        from kvscope.widgets.compare import show

        show(self)

    def _repr_html_(self) -> str:
        from kvscope.widgets.compare_table import summary_html

        return summary_html(self)

    def __repr__(self) -> str:
        return f"<Comparison of {len(self.runs)} runs: {', '.join(self.labels)}>"



def compare(*runs: Run | str | os.PathLike, labels: Sequence[str] | None = None) -> Comparison:
    """Compare runs (``Run`` objects or paths of saved traces / metrics files) against the first one.

    A path that is not a readable kvscope run raises ``ValueError`` naming it; the same file may be
    given twice (its labels are made distinct).
    """
    if len(runs) == 1 and isinstance(runs[0], (list, tuple)):
        runs = tuple(runs[0])
    return Comparison([_load(r) for r in runs], labels)
