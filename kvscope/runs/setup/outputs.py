"""The files a run writes when it ends, set up before it starts (``RunSetup.run_options``, the faces), and what
became of each: ``Outputs`` (a run's trace, metrics and HTML report), ``SweepOutputs`` (a sweep's comparison).
Standard library only: ``kvscope.runs.background.status`` (read by the faces without the engine) hands them on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class Outputs:
    """Files to write when the run ends (each atomically: a temp file, then a rename)."""

    trace: Path | None = None
    metrics: Path | None = None
    html: Path | None = None
    written: dict[str, Path] = field(default_factory=dict)  # kind -> path, once written
    errors: dict[str, str] = field(default_factory=dict)  # kind -> why it could not be written

    def wanted(self) -> dict[str, Path]:
        return {k: p for k, p in (("trace", self.trace), ("metrics", self.metrics), ("html", self.html)) if p}


@dataclass(slots=True)
class SweepOutputs:
    """A sweep's files, written when its last run ends: the comparison as HTML, its ``per_run`` as CSV."""

    html: Path | None = None
    csv: Path | None = None
    written: dict[str, Path] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def wanted(self) -> dict[str, Path]:
        return {k: p for k, p in (("html", self.html), ("csv", self.csv)) if p}
