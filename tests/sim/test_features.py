"""StepFeatures.of_schedule: the same features as adding the scheduled requests one by one."""

import random

from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request, SamplingParams
from kvscope.sim.features import StepFeatures


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
