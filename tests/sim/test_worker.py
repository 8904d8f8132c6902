"""SimWorker.prepare: the requests that sample in the runner's packing order, and the step's features, the
same as the plain definitions (``packing_order``, then the filter; ``StepFeatures._add`` per request)."""

import random

from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request, SamplingParams
from kvscope.sim.worker import SimWorker
from kvscope.telemetry.step_features import StepFeatures
from kvscope.utils.clock import VirtualClock


def schedule(rng: random.Random, n: int, case: int) -> SchedulerOutput:
    """Decodes (most sample; a few are one-token chunks of a recompute that do not), and, in most cases,
    prefill chunks and one-token prompts; few computed-token values, so many ties."""
    out = SchedulerOutput()
    for i in range(n):
        r = Request(f"r{i}", [5] * rng.randrange(1, 12), SamplingParams())
        kind = "decode" if case % 3 == 0 else rng.choice(["decode", "decode", "decode", "chunk", "one"])
        if kind == "decode":
            r.output_token_ids.append(5)
            r.all_token_ids.append(5)
            r.num_computed_tokens = r.num_tokens - (1 if rng.random() < 0.9 else rng.randrange(2, 4))
            num, decode = 1, True
        elif kind == "chunk":
            r.num_computed_tokens = rng.randrange(0, r.num_tokens)
            num, decode = rng.randrange(1, r.num_tokens - r.num_computed_tokens + 1), False
        else:  # a prompt's last token
            r.num_computed_tokens = r.num_tokens - 1
            num, decode = 1, False
        out.requests.append(r)
        out.num_tokens.append(num)
        out.is_decode.append(decode)
        out.total_num_tokens += num
    return out


def reference(out: SchedulerOutput, block_size: int) -> tuple[list[str], StepFeatures]:
    requests, new, computed = out.packing_order()
    samples = [r.request_id for r, n, c in zip(requests, new, computed) if c + n == r.num_tokens]
    features = StepFeatures()
    for r, n, d in zip(out.requests, out.num_tokens, out.is_decode):
        features._add(d, n, r.num_computed_tokens + n, block_size)
    return samples, features


def test_prepare_matches_the_packing_order_and_the_per_request_features():
    rng = random.Random(7)
    for case in range(300):
        out = schedule(rng, rng.randrange(0, 40), case)
        block_size = rng.choice([1, 4, 16])
        if case % 10 == 9 and out.is_decode:  # a hand-made output whose lists disagree: zip's rule
            out.num_tokens.pop()
        worker = SimWorker(None, VirtualClock(), block_size, 64, 1, None)  # type: ignore[arg-type]
        inp = worker.prepare(out)
        samples, features = reference(out, block_size)
        assert [r.request_id for r in inp.sample_requests] == samples, case
        assert inp.features == features, (case, inp.features, features)
        assert inp.num_tokens == out.total_num_tokens and inp.spec_drafts is None


def test_prepare_of_a_step_with_drafts_gives_each_sample_its_drafts():
    out = SchedulerOutput()
    for i, (prompt, computed) in enumerate([(6, 5), (4, 2), (9, 3)]):
        r = Request(f"r{i}", [5] * prompt, SamplingParams())
        r.num_computed_tokens = computed
        out.requests.append(r)
    out.num_tokens, out.is_decode = [3, 2, 4], [True, False, False]  # r0 decodes with 2 drafts
    out.scheduled_spec_decode_tokens = {"r0": [7, 8]}
    inp = SimWorker(None, VirtualClock(), 4, 64, 1, None).prepare(out)  # type: ignore[arg-type]
    assert [r.request_id for r in inp.sample_requests] == ["r0", "r1"]  # r2's chunk ends before its prompt
    assert inp.spec_drafts == [[7, 8], []]
    assert inp.features == StepFeatures.of_schedule(out, 4)
