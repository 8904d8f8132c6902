"""SchedulerOutput.packing_order: decodes first by computed tokens (ties in schedule order), then the rest."""

import random

from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request, SamplingParams


def schedule(rng: random.Random, n: int, decodes_only: bool) -> SchedulerOutput:
    out = SchedulerOutput()
    for i in range(n):
        r = Request(f"r{i}", [5] * rng.randrange(1, 40), SamplingParams())
        r.num_computed_tokens = rng.randrange(0, 6)  # few values: many ties
        out.requests.append(r)
        out.num_tokens.append(1 if decodes_only or rng.random() < 0.6 else rng.randrange(2, 30))
    return out


def reference(out: SchedulerOutput) -> tuple[list, list, list]:
    """The order written plainly: (computed, index) tuples of the one-token requests, then the others."""
    decodes = sorted((r.num_computed_tokens, i) for i, (r, n) in enumerate(zip(out.requests, out.num_tokens))
                     if n == 1)
    order = [i for _, i in decodes] + [i for i, n in enumerate(out.num_tokens) if n != 1]
    requests = [out.requests[i] for i in order]
    return requests, [out.num_tokens[i] for i in order], [r.num_computed_tokens for r in requests]


def test_packing_order_matches_the_plain_definition_with_ties_and_mixed_batches():
    rng = random.Random(3)
    for case in range(200):
        out = schedule(rng, rng.randrange(0, 30), decodes_only=case % 2 == 0)
        if case % 5 == 4 and out.num_tokens:  # a hand-made output with a request too many: it is left out
            out.num_tokens.pop()
        got, want = out.packing_order(), reference(out)
        assert [r.request_id for r in got[0]] == [r.request_id for r in want[0]]
        assert got[1:] == want[1:]


def test_packing_order_returns_fresh_lists():
    out = schedule(random.Random(1), 5, decodes_only=True)
    _, num_tokens, _ = out.packing_order()
    num_tokens.append(9)
    assert len(out.num_tokens) == 5
