"""Verification: greedy acceptance is exact, and rejection sampling keeps the target distribution.

The statistical tests draw many verifications with fixed seeds and compare the emitted tokens with
the exact target distribution: a chi-square goodness-of-fit test (p-value above 1e-3; with fixed seeds
the outcome is fixed, so the test cannot flake) and a total-variation distance below 0.02 (the
sampling noise of 40,000 draws over 6 tokens is about 0.005). Drafts come from a draft distribution
q far from p, so a verifier that accepted too often or resampled from p instead of the residual would
fail both (checked against such broken verifiers below). (Accepting with p(d) alone, as for point-mass
drafts, would be right for any q: it is the n-gram verifier.)
"""

from __future__ import annotations

import pytest
import torch

from kvscope.engine.request import Request, SamplingParams
from kvscope.engine.worker import rejection
from kvscope.engine.worker.rejection import accept_greedy, accept_sampled, verify

V = 6
P = torch.tensor([[0.40, 0.25, 0.15, 0.10, 0.06, 0.04], [0.05, 0.05, 0.10, 0.20, 0.25, 0.35],
                  [0.30, 0.30, 0.10, 0.10, 0.10, 0.10]])  # target rows p_0, p_1, p_2
Q = torch.tensor([[0.05, 0.05, 0.10, 0.20, 0.30, 0.30], [0.50, 0.20, 0.10, 0.10, 0.05, 0.05]])  # q_0, q_1
N = 40_000


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2), torch.tensor(stat / 2)))


def run_many(accept, q: torch.Tensor | None, seed: int = 0, n: int = N):
    """``n`` verifications of 2 drafts drawn from q (point masses when None: fixed drafts 0 and 5)."""
    gen = torch.Generator().manual_seed(seed)
    first, second = torch.zeros(V), torch.zeros(V)
    for _ in range(n):
        if q is None:
            drafts = [0, 5]
        else:
            drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
        j, token = accept(P, drafts, q, gen)
        emitted = [*drafts[:j], token]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return first, second


@pytest.mark.parametrize("q", [Q, None], ids=["draft-model", "point-mass"])
def test_rejection_sampling_keeps_the_target_distribution(q):
    first, second = run_many(accept_sampled, q)
    for counts, p in ((first, P[0]), (second, P[1])):  # the 2nd token exists when the 1st was accepted
        assert chi_square_p_value(counts, p) > 1e-3, (counts / counts.sum(), p)
        assert 0.5 * float((counts / counts.sum() - p).abs().sum()) < 0.02
    assert second.sum() > N * 0.1  # acceptance happened often enough to test the second position


def broken_accepts_too_often(p, drafts, q, gen):  # accepts with min(1, 2 p / q)
    return accept_sampled(p, drafts, q / 2, gen)


def broken_resamples_from_p(p, drafts, q, gen):  # on rejection draws from p instead of the residual
    j, token = accept_sampled(p, drafts, q, gen)
    if j < len(drafts):
        token = int(torch.multinomial(p[j], 1, generator=gen))
    return j, token


@pytest.mark.parametrize("broken", [broken_accepts_too_often, broken_resamples_from_p])
def test_the_statistical_test_catches_broken_verifiers(broken):
    first, _ = run_many(broken, Q, seed=1, n=N // 4)
    assert chi_square_p_value(first, P[0]) < 1e-6


def test_greedy_acceptance_is_the_argmax_chain():
    argmax = [3, 1, 4, 1, 5]
    assert accept_greedy(argmax, 1, [1, 4, 2]) == (2, 1)  # rows 1-3: 1 and 4 accepted, 2 replaced by 1
    assert accept_greedy(argmax, 0, [3, 1, 4, 1]) == (4, 5)  # all accepted: the bonus token
    assert accept_greedy(argmax, 0, [0]) == (0, 3)
    assert accept_greedy(argmax, 4, []) == (0, 5)


def test_verify_mixes_greedy_and_sampled_requests_in_one_batch():
    greedy = Request("g", [1], SamplingParams())
    sampled = Request("s", [1], SamplingParams(temperature=1.0, seed=7))
    logits = torch.full((5, V), -30.0)
    for row, tok in enumerate([2, 3, 0, 5, 5]):  # g: rows 0-2, s: rows 3-4
        logits[row, tok] = 30.0
    tokens, accepted = verify(logits, [greedy, sampled], [[2, 4], [5]])
    assert (tokens, accepted) == ([3, 5], [1, 1])  # g: 2 accepted, 4 != argmax 3; s: 5 accepted, bonus 5


def test_top_k_applies_to_the_target_distribution():
    request = Request("s", [1], SamplingParams(temperature=1.0, top_k=1, seed=3))
    logits = torch.tensor([[2.0, 1.9, -1.0, -1.0]])  # top-k 1 leaves only token 0
    probs = rejection.target_probs(logits, [request], [0])
    assert probs[0].tolist() == [1.0, 0.0, 0.0, 0.0]
