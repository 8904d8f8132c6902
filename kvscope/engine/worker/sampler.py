"""Next-token choice from the logits of the positions that produce a token."""

from __future__ import annotations

import torch

from kvscope.engine.request import Request


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k and nucleus (top-p). ``top_k == 0`` / ``top_p == 1`` are off.

    logits: [S, V] float32; top_k: [S] int64; top_p: [S] float32.
    """
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)  # [S, V]
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    drop = ranks >= k[:, None]
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of strictly better tokens
    drop |= mass_before >= top_p[:, None]
    drop[:, 0] = False  # always keep the best token
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


def sample(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """One token per row of ``logits`` ([S, V], float32) for ``requests[row]``."""
    greedy = logits.argmax(dim=-1)
    rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
    if not rows:
        return greedy.tolist()
    picked = greedy.clone()
    params = [requests[i].sampling_params for i in rows]
    temps = torch.tensor([p.temperature for p in params], device=logits.device)
    sub = logits[rows]  # [R, V]
    # shifted so each row's best logit is 0 before dividing: a small temperature (at least
    # TEMPERATURE_FLOOR) can push the others to -inf, never the best one to inf (no NaN probabilities)
    sub = (sub - sub.amax(dim=-1, keepdim=True)) / temps[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=logits.device)
        top_p = torch.tensor([p.top_p for p in params], device=logits.device, dtype=torch.float32)
        sub = apply_top_k_top_p(sub, top_k, top_p)
    probs = sub.softmax(dim=-1).cpu()
    for j, i in enumerate(rows):
        generator = requests[i].generator  # seeded requests draw from their own stream
        picked[i] = torch.multinomial(probs[j], 1, generator=generator).item()
    return picked.tolist()
