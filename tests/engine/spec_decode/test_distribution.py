"""With temperature > 0, speculation keeps the target's distribution: the engine end to end.

A tiny random model with a vocabulary of 16 tokens samples 3,000 requests (one seed each, temperature
1.5) of 4 tokens, with and without speculation. Tokens 2-4 come from verification steps (token 1 from
the prefill). At each of those positions the two samples are compared with a chi-square test of
homogeneity (2 x 16 table): the p-value must stay above 1e-3, and the total-variation distance
between the two empirical distributions below 0.08 (two samples of 3,000 over 16 tokens differ by
about 0.03 by chance). The seeds are fixed, so the outcome is too. The same test catches a verifier
that accepts every draft (``test_rejection.py`` catches subtler ones, with the exact distribution).
"""

from __future__ import annotations

import pytest
import torch

from kvscope import Engine, SamplingParams
from kvscope.engine.spec_decode.draft_model import early_exit_draft
from kvscope.engine.worker import rejection
from kvscope.models.loader import build_tiny_model

V, N, TOKENS = 16, 3000, 4
PROMPT = [3, 7, 5, 3, 7, 5, 3, 7, 5, 3, 7]  # repetitive: prompt lookup drafts from the first step


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("llama", vocab_size=V, seed=2, init_std=0.15)


def sample(model, speculative_config=None) -> torch.Tensor:
    """[N, TOKENS] sampled tokens, request i seeded with i."""
    engine = Engine(model, block_size=4, num_blocks=2048, max_num_seqs=256, max_num_batched_tokens=4096,
                    telemetry=False, speculative_config=speculative_config)
    params = [SamplingParams(max_tokens=TOKENS, temperature=1.5, seed=i, ignore_eos=True) for i in range(N)]
    return torch.tensor([o.token_ids for o in engine.generate([PROMPT] * N, params)])


def homogeneity(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(chi-square p-value, total-variation distance) of two samples of token ids."""
    ca, cb = torch.bincount(a, minlength=V).double(), torch.bincount(b, minlength=V).double()
    keep = (ca + cb) > 0
    ca, cb = ca[keep], cb[keep]
    total = ca + cb
    ea, eb = total * ca.sum() / total.sum(), total * cb.sum() / total.sum()
    stat = float(((ca - ea) ** 2 / ea).sum() + ((cb - eb) ** 2 / eb).sum())
    dof = int(keep.sum()) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2)))
    return p, 0.5 * float((ca / ca.sum() - cb / cb.sum()).abs().sum())


@pytest.fixture(scope="module")
def plain(model):
    return sample(model)


def configs(model):
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2},
        "draft_model": {"method": "draft_model", "model": early_exit_draft(model, 1), "num_speculative_tokens": 2},
    }


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_sampled_tokens_keep_the_target_distribution(model, plain, method):
    spec = sample(model, configs(model)[method])
    for pos in range(1, TOKENS):
        p, tv = homogeneity(plain[:, pos], spec[:, pos])
        assert p > 1e-3 and tv < 0.08, (method, pos, p, tv)
    assert not torch.equal(plain, spec)  # the random streams differ: two samples, not one twice


def test_the_test_catches_a_verifier_that_accepts_every_draft(model, plain, monkeypatch):
    def broken(p, drafts, q, generator):  # as if every draft were right: the bonus token after them
        return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))

    monkeypatch.setattr(rejection, "accept_sampled", broken)
    spec = sample(model, configs(model)["ngram"])
    assert min(homogeneity(plain[:, pos], spec[:, pos])[0] for pos in range(1, TOKENS)) < 1e-6
