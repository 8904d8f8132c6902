"""The SLO: its syntax, nearest-rank percentiles, the verdict, and the early-stop rule (exact: it never changes a
verdict)."""

from __future__ import annotations

import math

import pytest

from kvscope.search.slo import SLO, Tally, judge, percentile


def test_parse_and_thresholds():
    slo = SLO.parse("ttft_p99=0.5, tpot_p90=0.05,ttft_p50=0.2", 0.8)
    assert [t.name for t in slo.terms] == ["ttft_p99", "itl_p90", "ttft_p50"]
    assert slo.thresholds() == {"ttft": 0.2, "itl": 0.05} and slo.fraction == 0.8
    assert slo.tightest().name == "itl_p90" and str(slo) == "ttft_p99=0.5,itl_p90=0.05,ttft_p50=0.2"


@pytest.mark.parametrize(("text", "match"), [("", "empty"), ("ttft=0.5", "not METRIC_pQ"),
                                             ("ttft_p98=1", "not METRIC_pQ"), ("e2e_p50=fast", "not a number"),
                                             ("itl_p99=0", "above 0"), ("ttft_p99=1,ttft_p99=2", "twice")])
def test_bad_slos_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        SLO.parse(text)
    with pytest.raises(ValueError, match="goodput-fraction"):
        SLO.parse("ttft_p99=1", 1.5)


def test_nearest_rank_percentile_matches_the_allowed_count():
    values = sorted(float(i) for i in range(1, 101))  # 1..100
    assert percentile(values, 0.99) == 99.0 and percentile(values, 0.5) == 50.0 and math.isnan(percentile([], .5))
    term = SLO.parse("ttft_p99=99").terms[0]
    assert term.allowed(100) == 1  # one of 100 may exceed: p99 = the 99th value
    assert percentile(values, 0.99) <= term.seconds


def test_judge_names_the_term_furthest_over_and_the_fraction():
    slo = SLO.parse("ttft_p50=1,itl_p50=0.1", fraction=0.9)
    ok = judge(slo, {"ttft": [0.5] * 10, "itl": [0.05] * 10, "e2e": [1.0] * 10}, 10)
    assert ok.ok and ok.attained == 1.0
    over = judge(slo, {"ttft": [3.0] * 10, "itl": [0.2] * 10, "e2e": [1.0] * 10}, 10)
    assert over.broke == "ttft_p50"  # 3x over beats 2x over
    # the medians hold but only 6 of 10 meet both: the fraction breaks
    mixed = judge(slo, {"ttft": [0.5] * 6 + [0.5, 0.5, 2, 2], "itl": [0.05] * 6 + [0.2, 0.2, 0.05, 0.05],
                        "e2e": [1.0] * 10}, 10)
    assert mixed.percentiles == {"ttft_p50": 0.5, "itl_p50": 0.05} and mixed.broke == "fraction"
    unfinished = judge(slo, {"ttft": [0.5] * 4, "itl": [0.05] * 4, "e2e": [1.0] * 4}, 10)
    assert unfinished.broke == "ttft_p50" and unfinished.percentiles["ttft_p50"] == math.inf


def test_tally_loses_exactly_when_the_verdict_must_fail():
    slo = SLO.parse("ttft_p90=1")
    tally = Tally(slo, 20)  # 2 of 20 may exceed
    tally.finished("a", 2.0, 0, 2.0)
    tally.overdue("b", 1.5, started=False)  # still waiting past the TTFT threshold: already failed
    tally.overdue("c", 1.5, started=True)  # has its first token: TTFT is settled, not failed here
    assert tally.lost() is None
    tally.finished("b", 3.0, 0, 3.0)  # counted once
    assert tally.lost() is None and tally.failed["ttft"] == 2
    tally.finished("d", 1.2, 0, 1.2)
    assert tally.lost() == "ttft_p90"
