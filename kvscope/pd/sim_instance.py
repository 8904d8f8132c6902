"""One instance of a simulated P/D engine: a simulated ``Engine`` (its own block pool and prefix cache, the
engine's own scheduler) on the clock every instance shares, answering what the router asks of a real
instance (``kvscope.pd.instance.InstanceServer``) in-process: ``step``, the hand-over's two ends
(``reserve`` on the consumer, ``export`` on the producer, ``land`` on the consumer when the bytes are in),
and ``call(cmd)`` for what ``PDEngine`` and ``PDRecorder`` ask by name (``snapshot``, ``clear``, ``stats``,
``abort``, ``tokenize``, ``detokenize``).

As vLLM's connectors do, a hand-over reserves the consumer's blocks when the transfer starts (the prompt's
blocks it already holds are pinned, fresh ones allocated for the rest) and the producer keeps the blocks it
sends until the transfer ends; the consumer caches them under their hashes and queues the request then,
and lets them go once its scheduler has admitted the request (its prefix lookup took them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvscope.engine.core.block_pool import KVBlock
from kvscope.engine.engine import Engine
from kvscope.engine.request import Request, RequestOutput, SamplingParams
from kvscope.pd.blocks import attach, prompt_prefix


class TransferRefused(RuntimeError):
    """The consumer cannot take a transfer (not enough free blocks): that request fails alone."""


@dataclass(slots=True)
class Reservation:
    """A transfer's blocks while it is in flight."""

    held: list[KVBlock]  # consumer: the prompt's blocks it already had (pinned)
    new: list[KVBlock]  # consumer: fresh blocks the bytes land in
    sent: list[KVBlock]  # producer: the blocks it sends (kept until the transfer ends)


@dataclass(slots=True)
class SimInstance:
    name: str
    role: str
    engine: Engine
    alive: bool = True
    dead: str | None = None
    pending: bool = False  # the router's question of a process; a simulated step is never "in flight" here
    busy_until_ns: int | None = None  # the end of the step it is computing (virtual time)
    tracked: dict[str, Request] = field(default_factory=dict)  # until reported finished
    pins: dict[str, list[KVBlock]] = field(default_factory=dict)  # consumer: held until the request is admitted
    first_seen: set[str] = field(default_factory=set)

    @property
    def pool(self):
        return self.engine.pool

    @property
    def info(self) -> dict[str, Any]:
        e = self.engine
        return {"name": self.name, "role": self.role, "pid": None, "num_blocks": self.pool.num_blocks,
                "block_size": self.pool.block_size, "kv_bytes_per_block": e.runner.kv_bytes_per_block,
                "threads": None, "address": None, "model": e.model_name, "vocab_size": e.spec.vocab_size,
                "max_model_len": e.max_model_len, "eos_token_ids": sorted(e.eos_token_ids),
                "meta": e.run_metadata()}

    # ---- requests ----------------------------------------------------------------------------------
    def add(self, request: Request, max_tokens: int | None = None) -> None:
        """Queue a copy of ``request`` on this engine (a producer's: ``max_tokens=1``)."""
        params = request.sampling_params if max_tokens is None else replace(request.sampling_params,
                                                                            max_tokens=max_tokens)
        own = self.engine.make_request(list(request.prompt_token_ids), params, request.request_id)
        own.prompt = request.prompt
        self.engine.add_request(own)
        self.tracked[own.request_id] = own

    def step(self) -> tuple[list[RequestOutput], list[str]]:
        """One step of the engine (the shared clock moves by its predicted time); the requests it finished
        and those that got their first token (as ``InstanceServer.step`` reports them)."""
        if self.engine.has_unfinished_requests():
            self.engine.step()
        finished, first = [], []
        for rid, request in list(self.tracked.items()):
            if request.num_computed_tokens > 0 or request.is_finished:
                self._unpin(rid)
            if request.output_token_ids and rid not in self.first_seen:
                self.first_seen.add(rid)
                first.append(rid)
            if request.is_finished:
                finished.append(self.engine.output(request))
                del self.tracked[rid]
                self.first_seen.discard(rid)
        return finished, first

    def _unpin(self, rid: str) -> None:
        blocks = self.pins.pop(rid, None)
        if blocks:
            self.pool.free(reversed(blocks))

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

    # ---- what PDEngine and PDRecorder ask by name --------------------------------------------------------
    def call(self, cmd: str, *args: Any) -> Any:
        handlers = {"snapshot": self.snapshot, "clear": self.clear, "stats": self.stats, "abort": self.abort,
                    "tokenize": self.tokenize, "detokenize": self.detokenize}
        return handlers[cmd](*args)

    def snapshot(self):
        return self.engine.recorder.snapshot() if self.engine.recorder is not None else None

    def clear(self) -> None:
        if self.engine.recorder is not None:
            self.engine.recorder.clear()

    def stats(self) -> dict[str, int]:
        return {"num_blocks": self.pool.num_blocks, "num_used_blocks": self.pool.num_used_blocks,
                "num_cached_free_blocks": self.pool.num_cached_free_blocks,
                "num_pinned": sum(len(b) for b in self.pins.values()), "num_unfinished": len(self.tracked)}

    def abort(self, request_id: str) -> bool:
        self._unpin(request_id)
        self.tracked.pop(request_id, None)
        self.first_seen.discard(request_id)
        found = self.engine.abort(request_id)
        self.engine.record_state()
        return found

    def tokenize(self, prompt: Any, params: SamplingParams | None) -> tuple[list[int], str | None]:
        request = self.engine.make_request(prompt, params, f"check-{self.engine.clock.now_ns()}")
        return list(request.prompt_token_ids), request.prompt

    def detokenize(self, token_ids: list[int]) -> str:
        return self.engine.decode(list(token_ids))

    def close(self) -> None:
        """Nothing to end: the instance lives in this process."""
