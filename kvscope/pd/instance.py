"""One prefill or decode instance: an ``Engine`` of its own (its own block pool and prefix cache) in its own
process, answering the router's commands over a pipe (``serve``). The parent's side is
``kvscope.pd.process.InstanceProcess``.

Commands (each answered ``("ok", value)`` or ``("error", type name, message)``):
``add`` (a prefill instance: the prompt with ``max_tokens=1``), ``step``, ``lookup`` (how many of a prompt's
full blocks this instance already holds), ``export`` (producer: send a prompt's blocks from ``start`` on),
``import_add`` (consumer: receive them into fresh blocks, cache them under their hashes, queue the request),
``snapshot`` (its recorder's), ``stats`` (its pool), ``fault`` (tests: ``"refuse"`` or ``"die"``), ``close``.

The consumer recomputes the prompt's last partial block (fewer than ``block_size`` tokens, at least the last
token), as vLLM's consumers recompute the last prompt token: the step that does it samples the first token.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import torch

from kvscope.engine.core.block_pool import KVBlock
from kvscope.engine.engine import Engine
from kvscope.engine.request import SamplingParams
from kvscope.pd.blocks import attach, prompt_prefix
from kvscope.pd.config import KVTransferConfig
from kvscope.pd.connector import Connector, TransferError, TransferHandle, kv_tensors


class InstanceServer:
    """The commands of one instance, run in its process."""

    def __init__(self, name: str, model: str, engine_kwargs: dict[str, Any], kv_config: KVTransferConfig) -> None:
        self.name, self.role = name, kv_config.kv_role
        self.engine = Engine(model, **engine_kwargs)
        if self.engine.kv_config.num_groups != 1:
            raise ValueError(f"{model!r} has {self.engine.kv_config.num_groups} KV cache groups (a hybrid "
                             "model): P/D disaggregation moves one group's blocks only")
        if self.engine.speculator is not None:
            raise ValueError("P/D disaggregation does not combine with speculative decoding yet")
        if not self.engine.config.enable_prefix_caching:
            raise ValueError("P/D disaggregation hands blocks over by their hashes: keep enable_prefix_caching=True")
        self.pool = self.engine.pool
        self.tensors = kv_tensors(self.engine.runner)
        self.connector = Connector(kv_config)
        self.tracked: dict[str, Any] = {}  # request id -> Request, until reported finished
        self.pins: dict[str, list[KVBlock]] = {}  # consumer: blocks held for a request until it is admitted
        self.first_seen: set[str] = set()  # requests whose first token was reported
        self.fault: str | None = None
        self.published: list = []  # the recorder's new records and events, sent with the next step's answer
        if self.engine.recorder is not None:
            self.engine.recorder.subscribe(self.published.append)

    def info(self) -> dict[str, Any]:
        e = self.engine
        return {"name": self.name, "role": self.role, "pid": os.getpid(), "num_blocks": self.pool.num_blocks,
                "block_size": self.pool.block_size, "kv_bytes_per_block": e.runner.kv_bytes_per_block,
                "threads": torch.get_num_threads(), "address": self.connector.address, "model": e.model_name,
                "vocab_size": e.spec.vocab_size, "max_model_len": e.max_model_len,
                "eos_token_ids": sorted(e.eos_token_ids), "meta": e.run_metadata()}

    def tokenize(self, prompt: Any, params: SamplingParams | None) -> tuple[list[int], str | None]:
        """A prompt's token ids and text, checked as ``Engine.make_request`` checks them (nothing queued)."""
        request = self.engine.make_request(prompt, params, f"check-{time.perf_counter_ns()}")
        return list(request.prompt_token_ids), request.prompt

    def detokenize(self, token_ids: list[int]) -> str:
        return self.engine.decode(list(token_ids))

    def abort(self, request_id: str) -> bool:
        self._unpin(request_id)
        self.tracked.pop(request_id, None)
        self.first_seen.discard(request_id)
        found = self.engine.abort(request_id)
        self.engine.record_state()
        return found

    def clear(self) -> None:
        if self.engine.recorder is not None:
            self.engine.recorder.clear()
        self.published.clear()

    # ---- requests ----------------------------------------------------------------------------------
    def add(self, prompt: Any, params: SamplingParams | None, request_id: str) -> tuple[list[int], str | None]:
        params = replace(params or SamplingParams(), max_tokens=1)
        request = self.engine.make_request(prompt, params, request_id)
        self.engine.add_request(request)
        self.tracked[request_id] = request
        return list(request.prompt_token_ids), request.prompt

    def step(self, adds: list[tuple] = ()) -> dict[str, Any]:
        """Queue ``adds`` (a producer's new prompts), then one step of the engine if it has work."""
        for prompt, params, request_id in adds:
            self.add(prompt, params, request_id)
        error = None
        if self.engine.has_unfinished_requests():
            try:
                self.engine.step()
            except Exception as exc:  # the engine failed that batch's requests; they are reported below
                error = f"{type(exc).__name__}: {exc}"
        now = time.perf_counter_ns()
        finished, first = [], {}
        for rid, request in list(self.tracked.items()):
            if request.num_computed_tokens > 0 or request.is_finished:
                self._unpin(rid)
            if request.output_token_ids and rid not in self.first_seen:
                self.first_seen.add(rid)
                first[rid] = now
            if request.is_finished:
                finished.append(self.engine.output(request))
                del self.tracked[rid]
                self.first_seen.discard(rid)
        items, self.published[:] = list(self.published), []
        return {"finished": finished, "first_token_ns": first, "error": error, "items": items,
                "busy": self.engine.has_unfinished_requests(), "t_ns": now}

    def _unpin(self, rid: str) -> None:
        blocks = self.pins.pop(rid, None)
        if blocks:
            self.pool.free(reversed(blocks))

    # ---- the connector -----------------------------------------------------------------------------
    def lookup(self, prompt_ids: list[int]) -> dict[str, int]:
        hashes, held = prompt_prefix(self.pool, prompt_ids)
        return {"held": len(held), "full": len(hashes)}

    def export(self, prompt_ids: list[int], start: int, address: str | None) -> dict[str, Any]:
        t0 = time.perf_counter_ns()
        _hashes, chain = prompt_prefix(self.pool, prompt_ids)
        blocks = chain[start:]  # blocks past the cached chain were evicted: the consumer recomputes them
        handle = self.connector.send(self.tensors, [b.block_id for b in blocks], address)
        return {"handle": handle, "num_blocks": len(blocks), "start_ns": t0, "sent_ns": time.perf_counter_ns(),
                "block_ids": [b.block_id for b in blocks]}

    def import_add(self, request_id: str, prompt_ids: list[int], prompt: str | None, params: SamplingParams,
                   start: int, num_blocks: int, handle: TransferHandle) -> dict[str, Any]:
        if self.fault == "die":
            os._exit(3)
        if self.fault == "refuse":
            raise TransferError(f"{self.name} refuses KV transfers (fault injected)")
        hashes, chain = prompt_prefix(self.pool, prompt_ids)
        if len(chain) < start:  # blocks it held were evicted since the lookup: those arriving cannot attach
            start_ok, num_blocks = len(chain), 0
        else:
            start_ok = start
        new = self._receive(handle, num_blocks) if num_blocks else []
        if num_blocks == 0:
            self._drain(handle)
        attach(self.pool, hashes, chain[:start_ok], new)
        self.pool.touch(chain[:start_ok])
        self.pins[request_id] = chain[:start_ok] + new  # held until the scheduler admits the request
        request = self.engine.make_request(list(prompt_ids), params, request_id)
        request.prompt = prompt
        self.engine.add_request(request)
        self.tracked[request_id] = request
        return {"received_ns": time.perf_counter_ns(), "num_blocks": len(new), "block_ids": [b.block_id for b in new]}

    def _receive(self, handle: TransferHandle, num_blocks: int) -> list[KVBlock]:
        if self.pool.num_free_blocks < num_blocks:
            self._drain(handle)
            raise TransferError(f"{self.name} has {self.pool.num_free_blocks} free blocks, the transfer "
                                f"needs {num_blocks}")
        new = self.pool.allocate(num_blocks)
        try:
            self.connector.receive(self.tensors, [b.block_id for b in new], handle)
        except BaseException:
            self.pool.free(reversed(new))
            raise
        return new

    def _drain(self, handle: TransferHandle) -> None:
        """Read and drop a transfer's bytes (nothing can use them)."""
        if handle.num_bytes:
            n = handle.num_bytes // sum(t[0].numel() * t.element_size() for t in self.tensors)
            scratch = [torch.empty((n, *t.shape[1:]), dtype=t.dtype) for t in self.tensors]
            self.connector.receive(scratch, list(range(n)), handle)

    # ---- state ---------------------------------------------------------------------------------------
    def snapshot(self):
        recorder = self.engine.recorder
        return recorder.snapshot() if recorder is not None else None

    def stats(self) -> dict[str, int]:
        return {"num_blocks": self.pool.num_blocks, "num_used_blocks": self.pool.num_used_blocks,
                "num_cached_free_blocks": self.pool.num_cached_free_blocks,
                "num_pinned": sum(len(b) for b in self.pins.values()), "num_unfinished": len(self.tracked)}

    def set_fault(self, kind: str | None) -> None:
        self.fault = kind


def serve(conn, name: str, model: str, engine_kwargs: dict[str, Any], kv_config: KVTransferConfig,
          threads: int) -> None:
    """The instance process's main: build the engine, report ``ready``, answer commands until ``close``."""
    torch.set_num_threads(max(1, threads))
    try:
        server = InstanceServer(name, model, engine_kwargs, kv_config)
    except BaseException as exc:
        conn.send(("error", type(exc).__name__, f"{name}: {exc}"))
        return
    conn.send(("ok", server.info()))
    handlers = {"add": server.add, "step": server.step, "lookup": server.lookup, "export": server.export,
                "import_add": server.import_add, "snapshot": server.snapshot, "stats": server.stats,
                "fault": server.set_fault, "tokenize": server.tokenize, "detokenize": server.detokenize,
                "abort": server.abort, "clear": server.clear}
    while True:
        try:
            cmd, args = conn.recv()
        except (EOFError, OSError):  # the router is gone
            break
        if cmd == "close":
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", handlers[cmd](*args)))
        except Exception as exc:
            conn.send(("error", type(exc).__name__, str(exc)))
    server.connector.close()
