"""Why requests waited (``kvscope.explain.waits``), live and in the report.

``QueueReasonsPanel``: the seconds requests spent in the waiting queue over the run, one bar per reason: the
step's token budget was spent, ``max_num_seqs`` requests were running, the pool had no free blocks, the request
was preempted and waits to be recomputed, or it arrived while a step ran; a line above gives the preemptions and
the tokens recomputed after them. Recomputed like ``PrefixMissesPanel`` (at most every ``REFRESH_S`` seconds,
and at the end); hidden while no step has recorded a reason and nobody was preempted.
"""

from __future__ import annotations

from kvscope.explain.waits import queue_times, queue_totals

from ..feed import Tick
from ..theme import AMOUNT
from .prefix_misses import PrefixMissesPanel, facts_html
from .wait_styles import QUEUE_COLORS, REASONS

COLORS = QUEUE_COLORS  # the timeline colours its queue segments alike


class QueueReasonsPanel(PrefixMissesPanel):
    name = "queue_reasons"
    title = "Why requests waited"

    def build(self) -> None:
        fig = self.build_bars("reason", REASONS, "seconds", ("reason", "seconds", "share", "color"), height=210,
                              x_axis_label="seconds in the waiting queue (all requests)", axis=AMOUNT,
                              tooltips=[("reason", "@reason"), ("seconds", "@seconds{0.000}"),
                                        ("share of queue time", "@share{0%}")])
        fig.name = "queue-reasons"

    def changed(self, tick: Tick) -> bool:
        return any(e.kind in ("scheduled", "resumed") for e in tick.events)

    def refresh(self) -> None:
        if not any(r.wait_reason for r in self.records) and not any(
            e.kind == "preempted" for e in self.events
        ):
            return
        totals = queue_totals(queue_times(self.records, self.events))
        queue = float(totals["queue_s"]) or 1.0
        seconds = [float(totals[f"queue_{r}_s"]) for r in REASONS]
        self.source.data = {
            "reason": list(REASONS),
            "seconds": seconds,
            "share": [s / queue for s in seconds],
            "color": [COLORS[r] for r in REASONS],
        }
        facts = [
            ("in the queue", f"{totals['queue_s']:.3f} s"),
            ("preemptions", f"{totals['num_preemptions']:,d}"),
            ("tokens recomputed", f"{totals['num_recomputed_tokens']:,d}"),
        ]
        self.div.text = facts_html("Waiting", facts)
        self.model.visible = True
