"""Do the systems produce the same greedy tokens, and where they do not, is it float noise?

A difference is called numerical when, at the first token where two outputs part, the unpadded
reference forward pass (transformers, sdpa, one request alone) puts the two candidate tokens within
a hair of each other: a near-tie that a different summation order (padding, batching, another kernel)
can flip. Once a token differs the rest of the output follows a different context, so only the
first divergence says anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from harness import RunResult

from kvscope.runs.workload.items import WorkItem

NEAR_TIE = 1e-3  # logit gap (absolute) below which float32 reordering can flip an argmax


@dataclass(slots=True)
class Divergence:
    request: int
    position: int  # index of the first differing output token
    ours: int
    theirs: int
    gap: float | None = None  # reference logit(ours) - logit(theirs); None when not analysed
    reference_picks: int | None = None  # the token the unpadded reference picks there

    @property
    def numerical(self) -> bool | None:
        return None if self.gap is None else abs(self.gap) < NEAR_TIE


@dataclass(slots=True)
class Agreement:
    peer: str
    matched: int
    total: int
    divergences: list[Divergence]

    def line(self) -> str:
        text = f"tokens kvscope vs {self.peer}: {self.matched}/{self.total} requests identical"
        if not self.divergences:
            return text
        analysed = [d for d in self.divergences if d.gap is not None]
        ties = sum(1 for d in analysed if d.numerical)
        text += f"; {len(self.divergences)} differ"
        if analysed:
            text += f" ({ties} of {len(analysed)} analysed are near-ties, |logit gap| < {NEAR_TIE:g})"
        return text


def compare(ours: RunResult, theirs: RunResult) -> Agreement:
    divergences = []
    for k, (a, b) in enumerate(zip(ours.tokens, theirs.tokens)):
        if a == b:
            continue
        pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        divergences.append(Divergence(k, pos, a[pos] if pos < len(a) else -1, b[pos] if pos < len(b) else -1))
    return Agreement(theirs.name, len(ours.tokens) - len(divergences), len(ours.tokens), divergences)


@torch.inference_mode()
def analyse(model: torch.nn.Module, items: Sequence[WorkItem], ours: RunResult,
            agreement: Agreement, limit: int = 6) -> None:
    """Fill ``gap`` and ``reference_picks`` for up to ``limit`` divergences with one unpadded forward
    pass each over the prompt plus the common output prefix."""
    model.set_attn_implementation("sdpa")
    for d in agreement.divergences[:limit]:
        if d.ours < 0 or d.theirs < 0:
            continue
        context = list(items[d.request].prompt) + ours.tokens[d.request][: d.position]
        logits = model(input_ids=torch.tensor([context]), use_cache=False, logits_to_keep=1).logits[0, -1]
        d.gap = float(logits[d.ours] - logits[d.theirs])
        d.reference_picks = int(logits.argmax())


def report(agreements: Sequence[Agreement]) -> list[str]:
    lines = [a.line() for a in agreements]
    for a in agreements:
        for d in a.divergences:
            if d.gap is None:
                continue
            who = ("kvscope" if d.reference_picks == d.ours else a.peer if d.reference_picks == d.theirs
                   else "neither")
            lines.append(f"  request {d.request}: first differs at output token {d.position} "
                         f"(kvscope {d.ours}, {a.peer} {d.theirs}); reference logit gap {d.gap:+.2e}, "
                         f"the unpadded reference agrees with {who}")
    return lines
