"""``Draws`` makes exactly ``random.Random(seed)``'s draws, so synthetic workloads are what they always were."""

from __future__ import annotations

import random

import pytest

from kvscope.engine.request import SamplingParams
from kvscope.runs.workload.draws import Draws
from kvscope.runs.workload.items import iter_synthetic_workload, synthetic_workload

SEEDS = [0, 1, 7, 12345, 2**40 + 3, 2**80, -5, "a seed"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("vocab", [1, 2, 3, 511, 32000, 151936])
def test_choices_and_randint_follow_random_random(seed, vocab):
    population = [t for t in range(vocab + 3) if t not in (0, 2, 5)]  # not 0..n-1: gaps, as exclude_ids makes
    python, draws = random.Random(seed), Draws(seed, population)
    for lo, hi in [(1, 1), (0, 1), (64, 512), (1, 700), (5, 2**33), (0, 2**70), (3, 2**32 + 2), (0, 0)]:
        for _ in range(4):  # several rounds: chunks of words run out and are drawn again, at odd positions too
            assert draws.randint(lo, hi) == python.randint(lo, hi), (lo, hi)
            k = python.randint(0, 3000)
            assert draws.randint(0, 3000) == k
            assert draws.choices(k) == python.choices(population, k=k)
    assert draws.choices(0) == [] and draws.randint(1, 10**6) == python.randint(1, 10**6)


def test_picks_are_python_ints():
    picks = Draws(3, range(100)).choices(50)
    assert all(type(t) is int for t in picks) and len(picks) == 50


def test_picks_share_the_population_s_ints():
    population = list(range(1000, 3000))
    ids = {id(t) for t in population}
    picks = Draws(5, population).choices(400)
    assert picks == random.Random(5).choices(population, k=400) and all(id(t) in ids for t in picks)


def reference(num_requests, prompt_len, output_len, vocab_size, shared_prefix_len=0, seed=0, exclude_ids=()):
    """The workload as ``random.Random`` made it before ``Draws``: (tokens, max_tokens) per request."""
    allowed = [t for t in range(vocab_size) if t not in set(exclude_ids)]
    rng = random.Random(seed)
    prefix = rng.choices(allowed, k=shared_prefix_len)
    out = []
    for _ in range(num_requests):
        tokens = prefix + rng.choices(allowed, k=rng.randint(*prompt_len))
        out.append((tokens, rng.randint(*output_len)))
    return out


@pytest.mark.parametrize("seed", [0, 3, 9, 2**63 + 11])
@pytest.mark.parametrize("options", [
    dict(prompt_len=(64, 512), output_len=(32, 256), vocab_size=32000),
    dict(prompt_len=(8, 120), output_len=(4, 40), vocab_size=512, shared_prefix_len=40, exclude_ids=(0, 1, 2)),
    dict(prompt_len=(16, 16), output_len=(1, 1), vocab_size=2),
    dict(prompt_len=(1, 3000), output_len=(1, 2000), vocab_size=151936, shared_prefix_len=700, exclude_ids=[5]),
])
def test_synthetic_workload_is_the_random_random_one(seed, options):
    options = dict(options)
    prompt_len, output_len = options.pop("prompt_len"), options.pop("output_len")
    items = synthetic_workload(150, prompt_len, output_len, seed=seed, **options)
    expected = reference(150, prompt_len, output_len, seed=seed, **options)
    assert [(item.prompt, item.params.max_tokens) for item in items] == expected
    assert all(type(t) is int for item in items for t in item.prompt)


def test_lazy_and_listed_workloads_are_the_same():
    args = (300, (10, 900), (5, 50))
    kwargs = dict(vocab_size=1000, shared_prefix_len=3, seed=4, params=SamplingParams(seed=1))
    listed, lazy = synthetic_workload(*args, **kwargs), list(iter_synthetic_workload(*args, **kwargs))
    assert [(i.prompt, i.params) for i in listed] == [(i.prompt, i.params) for i in lazy]
