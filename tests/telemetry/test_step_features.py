"""StepFeatures.of_schedule: the same features as adding the scheduled requests one by one; a record's counts
and its items give the same tokens and phase."""

import random
from dataclasses import replace

from step_records import step

from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request, SamplingParams
from kvscope.telemetry.step_features import StepFeatures, phase_of


def test_of_schedule_equals_the_per_request_sum_for_decode_only_and_mixed_steps():
    rng = random.Random(5)
    for case in range(200):
        out = SchedulerOutput()
        for i in range(rng.randrange(0, 25)):
            r = Request(f"r{i}", [5] * 8, SamplingParams())
            r.num_computed_tokens = rng.randrange(0, 700)
            decode = case % 3 == 0 or rng.random() < 0.5
            out.requests.append(r)
            out.num_tokens.append(1 if decode and rng.random() < 0.8 else rng.randrange(1, 300))
            out.is_decode.append(decode)
        if case % 10 == 9 and out.is_decode:  # a hand-made output whose lists disagree: zip's rule
            out.is_decode.pop()
        block_size = rng.choice([1, 16, 7])
        want = StepFeatures()
        for r, n, d in zip(out.requests, out.num_tokens, out.is_decode):
            want._add(d, n, r.num_computed_tokens + n, block_size)
        got = StepFeatures.of_schedule(out, block_size)
        assert got == want, (case, got, want)
        assert got.num_seqs == min(len(out.requests), len(out.is_decode))


def test_a_records_counts_are_its_items_features_and_phase():
    """``of_counts`` (the online baseline's O(1) reading) gives the tokens, requests and phase that ``of_record``
    reads from the scheduled items (the fitted model's), and a record without items is read from its counts."""
    for record in (step(3, 5.0), step(4, 9.0, prefill=48), step(5, 9.0, prefill=48, decode=0)):
        full, counts = StepFeatures.of_record(record, 16), StepFeatures.of_counts(record)
        assert (full.prefill_tokens, full.decode_tokens, full.num_seqs) == \
            (counts.prefill_tokens, counts.decode_tokens, counts.num_seqs)
        assert full.num_tokens == counts.num_tokens == record.num_tokens
        assert phase_of(full) == phase_of(counts) == ("prefill" if record.num_prefill_tokens else "decode")
        assert full.context_tokens > 0 == counts.context_tokens
        assert StepFeatures.of_record(replace(record, scheduled=[]), 16) == counts


def test_values_are_the_features_in_feature_names_order():
    from dataclasses import fields

    from kvscope.telemetry.step_features import FEATURE_NAMES

    f = StepFeatures(*range(1, 8))
    assert [x.name for x in fields(StepFeatures)] == list(FEATURE_NAMES)
    assert f.values() == tuple(getattr(f, name) for name in FEATURE_NAMES) == (1, 2, 3, 4, 5, 6, 7)
