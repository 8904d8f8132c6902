"""What every P/D instance does with its ``Engine``, wherever it runs: ``InstanceCore``, the base of the process
instance (``kvscope.pd.instance.InstanceServer``: an ``Engine`` in its own process) and of the simulated one
(``kvscope.pd.sim_instance.SimInstance``: a simulated ``Engine`` on the clock every instance shares).

It queues requests on the engine and tracks them until they are reported finished (``queue``, ``collect``),
holds a consumer's blocks for a request until its scheduler admits it (``pins``), and answers the commands
the router asks by name (``call``): ``snapshot``, ``clear``, ``stats``, ``abort``, ``tokenize``,
``detokenize``, ``tokenizer``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvscope.engine.core.block_pool import BlockPool, KVBlock
from kvscope.engine.request import Request, RequestOutput, SamplingParams
from kvscope.pd.protocols import Snapshot

if TYPE_CHECKING:
    from kvscope.engine.engine import Engine


class InstanceCore:
    """One instance's engine and the requests it holds: ``tracked`` (request id -> its ``Request`` here, until
    reported finished), ``pins`` (a consumer's blocks for a request, until admitted) and ``first_seen``
    (requests whose first token was reported). ``commands``: what ``call`` answers; a subclass adds its own."""

    def __init__(self, name: str, role: str, engine: Engine) -> None:
        self.name, self.role, self.engine = name, role, engine
        self.pool: BlockPool = engine.pool
        self.tracked: dict[str, Request] = {}
        self.pins: dict[str, list[KVBlock]] = {}
        self.first_seen: set[str] = set()
        self.commands: dict[str, Callable[..., Any]] = {
            "snapshot": self.snapshot, "clear": self.clear, "stats": self.stats, "abort": self.abort,
            "tokenize": self.tokenize, "detokenize": self.detokenize, "tokenizer": self.tokenizer}

    @property
    def info(self) -> dict[str, Any]:
        """Its pool and model (``pid``, ``threads``, ``address``: a process instance's), its engine's metadata."""
        e = self.engine
        return {"name": self.name, "role": self.role, "pid": None, "num_blocks": self.pool.num_blocks,
                "block_size": self.pool.block_size, "kv_bytes_per_block": e.runner.kv_bytes_per_block,
                "threads": None, "address": None, "model": e.model_name, "vocab_size": e.spec.vocab_size,
                "max_model_len": e.max_model_len, "eos_token_ids": sorted(e.eos_token_ids),
                "meta": e.run_metadata()}

    def call(self, cmd: str, *args: Any) -> Any:
        """Run the command ``cmd`` here (``KeyError`` for one it does not know)."""
        return self.commands[cmd](*args)

    # ---- requests ----------------------------------------------------------------------------------
    def queue(self, prompt: Any, params: SamplingParams | None, request_id: str, *, max_tokens: int | None = None,
              text: str | None = None) -> Request:
        """Queue a request on the engine and track it. ``max_tokens``: a producer's ``1`` (the prompt's KV and
        its first token); ``text``: the prompt's text where ``prompt`` is its token ids."""
        if max_tokens is not None:
            params = replace(params or SamplingParams(), max_tokens=max_tokens)
        request = self.engine.make_request(prompt, params, request_id)
        if text is not None:
            request.prompt = text
        self.engine.add_request(request)
        self.tracked[request_id] = request
        return request

    def step(self) -> tuple[list[RequestOutput], list[str]]:
        """One step of the engine if it has work, then ``collect``."""
        if self.engine.has_unfinished_requests():
            self.engine.step()
        return self.collect()

    def collect(self) -> tuple[list[RequestOutput], list[str]]:
        """After a step: the tracked requests that finished (let go here) and those that got their first token.
        A request's pinned blocks go back once the scheduler has admitted it (its prefix lookup took them)."""
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

    # ---- the commands ------------------------------------------------------------------------------
    def abort(self, request_id: str) -> bool:
        self._unpin(request_id)
        self.tracked.pop(request_id, None)
        self.first_seen.discard(request_id)
        found = self.engine.abort(request_id)
        self.engine.record_state()
        return found

    def tokenize(self, prompt: Any, params: SamplingParams | None) -> tuple[list[int], str | None]:
        """A prompt's token ids and text, checked as ``Engine.make_request`` checks them (nothing queued)."""
        request = self.engine.make_request(prompt, params, f"check-{self.engine.clock.now_ns()}")
        return list(request.prompt_token_ids), request.prompt

    def detokenize(self, token_ids: list[int]) -> str:
        return self.engine.decode(list(token_ids))

    def tokenizer(self) -> Any:
        """The engine's own tokenizer (``None`` for a model without one): the router prepares prompts with it
        exactly as a colocated run does (``WorkItem.prompt_for``: the chat template, special tokens), so a P/D
        run submits the same token ids as an ``Engine`` on the same model."""
        return self.engine.tokenizer

    def clear(self) -> dict[str, Any] | None:
        """A new run: the engine's recorder forgets what it recorded; its baseline (the cumulative counters the
        run's count from), for the router to keep in case this instance dies."""
        if self.engine.recorder is None:
            return None
        self.engine.recorder.clear()
        return dict(self.engine.recorder.baseline)

    def snapshot(self) -> Snapshot | None:
        recorder = self.engine.recorder
        return recorder.snapshot() if recorder is not None else None

    def stats(self) -> dict[str, int]:
        return {"num_blocks": self.pool.num_blocks, "num_used_blocks": self.pool.num_used_blocks,
                "num_cached_free_blocks": self.pool.num_cached_free_blocks,
                "num_pinned": sum(len(b) for b in self.pins.values()), "num_unfinished": len(self.tracked)}
