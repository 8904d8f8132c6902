"""Replicas behind a router: ``replicas=N`` in ``kvscope search``. N copies of one simulated engine (each its own
block pool and prefix cache, a GPU's budget each) on one virtual clock, each request sent whole to one of them by
a named policy (``POLICIES``):

- ``round_robin``: replica 0, 1, ..., N-1, 0, ... in arrival order;
- ``least_outstanding``: the replica with the fewest unfinished requests (ties: the lowest index), as the P/D
  router picks its instances (``Router._pick``);
- ``prefix_aware``: the replica whose prefix cache holds the most of the prompt's full blocks (by block hash, as
  llm-d's precise prefix-cache scorer looks them up from the engines' KV events), ties broken by the fewest
  unfinished requests, then the lowest index.

It is the P/D router (``kvscope.pd.router.Router``, through ``SimPDEngine``'s event loop: every idle replica
with work starts a step, the clock moves to the next step end or arrival) with one role, ``kv_both`` (vLLM's
name for an instance that both prefills and decodes), so no request is handed over: it finishes where it was
sent. ``pick`` is a pure function of the replicas' load and of how many blocks each holds, so a router over
engine processes (``kvscope.pd.engine``) can take the same policy with ``lookup`` answering the second.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvscope.engine.engine import Engine
from kvscope.engine.request import Request, SamplingParams
from kvscope.pd.blocks import prompt_prefix
from kvscope.pd.config import PDLayout
from kvscope.pd.sim_engine import SimLink, SimPDEngine
from kvscope.pd.sim_instance import SimInstance
from kvscope.utils.clock import VirtualClock

KV_BOTH = "kv_both"  # vLLM's kv_role of an instance that does both
POLICIES = ("round_robin", "least_outstanding", "prefix_aware")


def pick(policy: str, names: Sequence[str], load: dict[str, int], turn: int,
         cached: Callable[[str], int] | None = None) -> str:
    """The replica ``policy`` sends the next request to, among ``names`` (in order): ``load`` is each one's
    unfinished requests, ``turn`` how many requests were routed before, ``cached(name)`` how many of the prompt's
    full blocks it holds (``prefix_aware`` only; without it, ``least_outstanding``)."""
    if not names:
        raise RuntimeError("no replica to route to")
    if policy == "round_robin":
        return names[turn % len(names)]
    if policy == "prefix_aware" and cached is not None:
        return min(names, key=lambda n: (-cached(n), load[n], names.index(n)))
    if policy in ("least_outstanding", "prefix_aware"):
        return min(names, key=lambda n: (load[n], names.index(n)))
    raise ValueError(f"unknown router policy {policy!r}; known: {', '.join(POLICIES)}")


@dataclass(frozen=True, slots=True)
class ReplicaLayout(PDLayout):
    """``num_prefill`` replicas that each do both (``kv_both``); ``num_decode`` is 0."""

    def __str__(self) -> str:
        return f"{self.num_prefill} replicas"

    def names(self) -> list[tuple[str, str]]:
        return [(f"replica-{i}", KV_BOTH) for i in range(self.num_prefill)]


class SimReplicaEngine(SimPDEngine):
    """``replicas`` simulated engines (``build(name, clock)`` each) behind the router, on one virtual clock."""

    def __init__(self, build: Callable[[str, VirtualClock], Engine], replicas: int, policy: str = "least_outstanding",
                 *, clock: VirtualClock | None = None, arrivals_s: Iterable[float] | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown router policy {policy!r}; known: {', '.join(POLICIES)}")
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas={replicas!r} must be a whole number >= 1")
        self.policy, self.turn = policy, 0
        self._prompt: list[int] | None = None
        super().__init__(build, ReplicaLayout(replicas, 0), SimLink(), clock=clock, arrivals_s=arrivals_s)

    def add_request(self, prompt: Any, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        request = prompt if isinstance(prompt, Request) else self.make_request(prompt, params, request_id)
        self._prompt = request.prompt_token_ids
        try:
            rid = super().add_request(request)
        finally:
            self._prompt = None
        self.turn += 1
        return rid

    def _prefill_instance(self, among: Iterable[SimInstance] | None = None) -> SimInstance:
        live = [i for i in (self.instances.values() if among is None else among) if i.alive]
        prompt = self._prompt
        cached = None if prompt is None else (lambda n: len(prompt_prefix(self.instances[n].pool, prompt)[1]))
        return self.instances[pick(self.policy, [i.name for i in live], self.load, self.turn, cached)]

    def _dispatch(self, inst: SimInstance, request: Request) -> None:
        """The whole request, queued on its replica at once."""
        inst.add(request)
