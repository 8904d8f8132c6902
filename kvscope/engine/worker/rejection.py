"""Verifying drafts against the target model's logits (vLLM's ``RejectionSampler``).

A request with drafts ``d_1..d_k`` gets ``k + 1`` rows of target logits from one forward pass: row
``i`` is the target's distribution ``p_i`` for the token after ``d_i`` (row 0: after the last accepted
token). Then, left to right:

- **greedy** requests accept ``d_{i+1}`` while it is the argmax of ``p_i``; the first mismatch is
  replaced by that argmax, and if every draft matches, the argmax of ``p_k`` comes free (the *bonus*
  token). The output is exactly what greedy decoding without drafts gives.
- **sampled** requests (temperature > 0) accept ``d_{i+1}`` with probability ``min(1, p_i(d) / q_i(d))``,
  where ``q_i`` is the distribution the draft was drawn from (a point mass for n-gram drafts); the first
  rejection draws its replacement from ``norm(max(0, p_i - q_i))``, and full acceptance draws the bonus
  from ``p_k``. Each emitted token is then distributed exactly as ``p`` (Leviathan et al. 2023,
  "Fast inference from transformers via speculative decoding", theorem 1; Chen et al. 2023).

``p`` is the distribution the plain sampler would draw from (temperature, top-k, top-p applied the
same way), and a seeded request draws its uniforms and replacements from its own generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvscope.engine.request import Request
from kvscope.engine.worker.sampler import apply_top_k_top_p


def target_probs(logits: torch.Tensor, requests: Sequence[Request], rows: Sequence[int]) -> torch.Tensor:
    """The sampling distribution of each row: ``logits[rows[j]]`` ([V], float32) of ``requests[j]``
    with its temperature, top-k and top-p applied, as probabilities on the CPU ([R, V])."""
    params = [r.sampling_params for r in requests]
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device)
    sub = logits[list(rows)] / temps[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
        sub = apply_top_k_top_p(sub, top_k, top_p)
    return sub.softmax(dim=-1).cpu()


def accept_greedy(argmax: Sequence[int], start: int, drafts: Sequence[int]) -> tuple[int, int]:
    """(accepted drafts, the token after them) from the target's argmax per row."""
    j = 0
    for d in drafts:
        if argmax[start + j] != d:
            break
        j += 1
    return j, argmax[start + j]


def accept_sampled(
    p: torch.Tensor,  # [k + 1, V] target probabilities (CPU)
    drafts: Sequence[int],
    q: torch.Tensor | None,  # [k, V] draft probabilities (CPU); None: point masses on the drafts
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """(accepted drafts, the token after them) by rejection sampling (see the module docstring)."""
    k = len(drafts)
    uniforms = torch.rand(k, generator=generator).tolist() if k else []
    for i, d in enumerate(drafts):
        p_d = float(p[i, d])
        q_d = float(q[i, d]) if q is not None else 1.0
        if uniforms[i] * q_d < p_d:  # u < p/q, without dividing by q
            continue
        if q is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_(min=0.0)
        if not float(residual.sum()) > 0.0:  # p <= q everywhere: only rounding can get here
            residual = p[i]
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def verify(
    logits: torch.Tensor,  # [N, V] float32: 1 + len(drafts[i]) consecutive rows per request
    requests: Sequence[Request],
    drafts: Sequence[Sequence[int]],
    draft_probs: dict[str, torch.Tensor] | None = None,
) -> tuple[list[int], list[int]]:
    """For each request with drafts: (the token emitted after its accepted drafts, the number
    accepted). ``draft_probs[request_id]``: ``[>= k, V]`` draft distributions of a draft model's
    sampled requests; missing means the drafts were point masses (n-gram, or greedy drafting)."""
    argmax = logits.argmax(dim=-1).tolist()
    starts, at = [], 0
    for d in drafts:
        starts.append(at)
        at += 1 + len(d)
    tokens = [0] * len(requests)
    accepted = [0] * len(requests)
    sampled = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
    for i, r in enumerate(requests):
        if r.sampling_params.greedy:
            accepted[i], tokens[i] = accept_greedy(argmax, starts[i], drafts[i])
    if sampled:
        rows = [row for i in sampled for row in range(starts[i], starts[i] + 1 + len(drafts[i]))]
        owners = [requests[i] for i in sampled for _ in range(1 + len(drafts[i]))]
        probs = target_probs(logits, owners, rows)  # [sum(k + 1), V]
        at = 0
        for i in sampled:
            k = len(drafts[i])
            q = draft_probs.get(requests[i].request_id) if draft_probs else None
            accepted[i], tokens[i] = accept_sampled(probs[at : at + k + 1], drafts[i],
                                                    q[:k] if q is not None else None, requests[i].generator)
            at += k + 1
    return tokens, accepted
