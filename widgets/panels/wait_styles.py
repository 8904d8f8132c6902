"""How a wait looks, one definition for every panel that shows one: the colour and label of each reason a
request waited in the queue (``kvscope.explain.waits``), shared by the queue-reasons bars and the request
timeline's queue segments. None of these colours is the timeline's prefill (orange) or decode (blue)."""

from __future__ import annotations

from kvscope.explain.waits import UNKNOWN
from kvscope.telemetry.records import (
    WAIT_MAX_NUM_SEQS,
    WAIT_NO_FREE_BLOCKS,
    WAIT_PREEMPTED,
    WAIT_REASONS,
    WAIT_STEP_IN_PROGRESS,
    WAIT_TOKEN_BUDGET,
)

REASONS = (*WAIT_REASONS, UNKNOWN)
QUEUE_COLORS = {
    WAIT_TOKEN_BUDGET: "#17becf",
    WAIT_MAX_NUM_SEQS: "#bcbd22",
    WAIT_NO_FREE_BLOCKS: "#e377c2",
    WAIT_PREEMPTED: "#d62728",
    WAIT_STEP_IN_PROGRESS: "#c7c7c7",
    UNKNOWN: "#7f7f7f",
}
QUEUE_LABELS = {
    WAIT_TOKEN_BUDGET: "queued: token budget spent",
    WAIT_MAX_NUM_SEQS: "queued: max_num_seqs reached",
    WAIT_NO_FREE_BLOCKS: "queued: no free blocks",
    WAIT_PREEMPTED: "preempted: waits to recompute",
    WAIT_STEP_IN_PROGRESS: "queued: a step in progress",
    UNKNOWN: "queued: reason not recorded",
}
