"""``Run.summary()``'s p90 latencies (``ttft_p90_s``, ``e2e_p90_s``, ...): what a prediction of a watched vLLM is
compared on (``kvscope compare WATCH SIM``), from the same per-request frame as the p50 and p99."""

from __future__ import annotations

import numpy as np
import pytest

from kvscope.runs.result.run import Run
from kvscope.telemetry.records import RequestEvent


def test_the_p90_of_ttft_and_e2e_are_over_the_requests():
    events, ttfts, e2es = [], [], []
    for i in range(10):
        t0, first, end = i * 10**9, i * 10**9 + (i + 1) * 10**7, i * 10**9 + (i + 1) * 10**8
        rid = f"r{i}"
        events += [RequestEvent(t0, 0, rid, "queued", 4, 0), RequestEvent(t0, 0, rid, "scheduled", 4, 0),
                   RequestEvent(first, 0, rid, "first_token", 4, 1), RequestEvent(end, 0, rid, "finished", 4, 5)]
        ttfts.append((first - t0) / 1e9)
        e2es.append((end - t0) / 1e9)
    s = Run([], events, {"model": "tiny"}).summary()
    assert s["ttft_p90_s"] == pytest.approx(np.percentile(ttfts, 90))
    assert s["e2e_p90_s"] == pytest.approx(np.percentile(e2es, 90))
    assert s["ttft_p50_s"] < s["ttft_p90_s"] < s["ttft_p99_s"]
