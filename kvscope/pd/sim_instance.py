"""One instance of a simulated P/D engine: a simulated ``Engine`` (its own block pool and prefix cache, the
engine's own scheduler) on the clock every instance shares. What every instance does (``step``, the commands
the router asks by name through ``call``) is ``kvscope.pd.instance_core.InstanceCore``'s, as for a process
instance; a simulated one adds the hand-over's ends in-process: ``reserve`` (the consumer, at the transfer's
start), ``land`` (the consumer, once the bytes are in) and ``release`` (a transfer that will not land).

As vLLM's connectors do, a hand-over reserves the consumer's blocks when the transfer starts (the prompt's
blocks it already holds are pinned, fresh ones allocated for the rest) and the producer keeps the blocks it
sends until the transfer ends; the consumer caches them under their hashes and queues the request then,
and lets them go once its scheduler has admitted the request (its prefix lookup took them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engine.core.block_pool import KVBlock
from kvscope.engine.engine import Engine
from kvscope.engine.request import Request
from kvscope.pd.blocks import attach, prompt_prefix
from kvscope.pd.instance_core import InstanceCore


class TransferRefused(RuntimeError):
    """The consumer cannot take a transfer (not enough free blocks): that request fails alone."""


@dataclass(slots=True)
class Reservation:
    """A transfer's blocks while it is in flight."""

    held: list[KVBlock]  # consumer: the prompt's blocks it already had (pinned)
    new: list[KVBlock]  # consumer: fresh blocks the bytes land in
    sent: list[KVBlock]  # producer: the blocks it sends (kept until the transfer ends)


class SimInstance(InstanceCore):
    """``InstanceCore`` on the shared virtual clock; ``busy_until_ns``: the end of the step it is computing."""

    def __init__(self, name: str, role: str, engine: Engine) -> None:
        super().__init__(name, role, engine)
        self.busy_until_ns: int | None = None

    @property
    def alive(self) -> bool:
        """A simulated instance never dies (faults are tested on process instances)."""
        return True

    @property
    def dead(self) -> str | None:
        return None

    def add(self, request: Request, max_tokens: int | None = None) -> None:
        """Queue a copy of ``request`` on this engine (a producer's: ``max_tokens=1``)."""
        self.queue(list(request.prompt_token_ids), request.sampling_params, request.request_id,
                   max_tokens=max_tokens, text=request.prompt)

    # ---- the hand-over -----------------------------------------------------------------------------
    def reserve(self, prompt_ids: list[int], producer: SimInstance) -> Reservation:
        """Consumer, at the transfer's start: pin the prompt's full blocks it holds, take fresh blocks for
        those the producer still has cached after them (the rest, evicted there, the consumer recomputes)."""
        _, held = prompt_prefix(self.pool, prompt_ids)
        _, chain = prompt_prefix(producer.pool, prompt_ids)
        sent = chain[len(held):]
        if self.pool.num_free_blocks < len(sent):
            raise TransferRefused(f"{self.name} has {self.pool.num_free_blocks} free blocks, the transfer "
                                  f"needs {len(sent)}")
        self.pool.touch(held)
        producer.pool.touch(sent)
        return Reservation(held, self.pool.allocate(len(sent)), sent)

    def land(self, request: Request, res: Reservation, producer: SimInstance) -> None:
        """Consumer, once the bytes are in: cache the new blocks under their hashes, queue the request (its
        blocks pinned until admitted); the producer lets its sent blocks go."""
        if res.sent:
            producer.pool.free(reversed(res.sent))
        hashes, _ = prompt_prefix(self.pool, request.prompt_token_ids)
        attach(self.pool, hashes, res.held, res.new)
        self.pins[request.request_id] = res.held + res.new
        self.add(request)

    def release(self, res: Reservation, producer: SimInstance) -> None:
        """A transfer that will not land (its request was aborted): every block goes back."""
        if res.sent:
            producer.pool.free(reversed(res.sent))
        self.pool.free(reversed(res.held + res.new))
