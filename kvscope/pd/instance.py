"""One prefill or decode instance: an ``Engine`` of its own (its own block pool and prefix cache) in its own
process, answering the router's commands over a pipe (``serve``). The parent's side is
``kvscope.pd.process.InstanceProcess``.

Commands (each answered ``("ok", value)`` or ``("error", type name, message)``): those of every instance
(``kvscope.pd.instance_core``: ``snapshot``, ``clear``, ``stats``, ``abort``, ``tokenize``, ``detokenize``) and
``add`` (a prefill instance: the prompt with ``max_tokens=1``), ``step``, ``lookup`` (how many of a prompt's
full blocks this instance already holds), ``export`` (producer: send a prompt's blocks from ``start`` on),
``import_add`` (consumer: receive them into fresh blocks, cache them under their hashes, queue the request),
``fault`` (tests: ``"refuse"`` or ``"die"``), ``close``.

The consumer recomputes the prompt's last partial block (fewer than ``block_size`` tokens, at least the last
token), as vLLM's consumers recompute the last prompt token: the step that does it samples the first token.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import torch

from kvscope.engine.core.block_pool import KVBlock
from kvscope.engine.engine import Engine
from kvscope.engine.request import SamplingParams
from kvscope.pd.blocks import attach, prompt_prefix
from kvscope.pd.config import KVTransferConfig
from kvscope.pd.connector import Connector, TransferError, TransferHandle, block_nbytes, kv_tensors
from kvscope.pd.instance_core import InstanceCore
from kvscope.telemetry.records import RequestEvent, StepRecord


class InstanceServer(InstanceCore):
    """The commands of one instance, run in its process: ``InstanceCore``'s, and the hand-over's."""

    def __init__(self, name: str, model: str, engine_kwargs: dict[str, Any], kv_config: KVTransferConfig,
                 secret: bytes | None = None) -> None:
        engine = Engine(model, **engine_kwargs)
        groups = engine.kv_config.num_groups if engine.kv_config is not None else 1
        if groups != 1:
            raise ValueError(f"{model!r} has {groups} KV cache groups (a hybrid model): P/D disaggregation moves "
                             "one group's blocks only")
        if engine.speculator is not None:
            raise ValueError("P/D disaggregation does not combine with speculative decoding yet")
        if not engine.config.enable_prefix_caching:
            raise ValueError("P/D disaggregation hands blocks over by their hashes: keep enable_prefix_caching=True")
        if kv_config.kv_role is None:
            raise ValueError("an instance's kv_transfer_config names its kv_role (KVTransferConfig.for_role)")
        super().__init__(name, kv_config.kv_role, engine)
        self.tensors = kv_tensors(engine.runner)
        # a consumer takes no ZMQ message larger than a whole prompt's blocks (MAXMSGSIZE)
        largest = (engine.max_model_len // self.pool.block_size + 1) * block_nbytes(self.tensors)
        self.connector = Connector(kv_config, secret, max_message_bytes=largest)
        self.fault: str | None = None
        self.published: list[StepRecord | RequestEvent] = []  # the recorder's new items, sent with the next step
        if engine.recorder is not None:
            engine.recorder.subscribe(self.published.append)
        self.commands.update(add=self.add, step=self.report_step, lookup=self.lookup, export=self.export,
                             import_add=self.import_add, fault=self.set_fault)

    @property
    def info(self) -> dict[str, Any]:
        return {**super().info, "pid": os.getpid(), "threads": torch.get_num_threads(),
                "address": self.connector.address}

    def clear(self) -> dict[str, Any] | None:
        baseline = super().clear()
        self.published.clear()
        return baseline

    # ---- requests ----------------------------------------------------------------------------------
    def add(self, prompt: Any, params: SamplingParams | None, request_id: str) -> tuple[list[int], str | None]:
        """Queue a producer's prompt (``max_tokens=1``)."""
        request = self.queue(prompt, params, request_id, max_tokens=1)
        return list(request.prompt_token_ids), request.prompt

    def report_step(self, adds: Sequence[tuple[Any, SamplingParams | None, str]] = ()) -> dict[str, Any]:
        """The ``step`` command: queue ``adds`` (a producer's new prompts), then one step of the engine if it has
        work; a step that raised has failed its batch's requests, reported with the others."""
        for prompt, params, request_id in adds:
            self.add(prompt, params, request_id)
        error = None
        if self.engine.has_unfinished_requests():
            try:
                self.engine.step()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        now = time.perf_counter_ns()
        finished, first = self.collect()
        items, self.published[:] = list(self.published), []
        return {"finished": finished, "first_token_ns": {rid: now for rid in first}, "error": error,
                "items": items, "busy": self.engine.has_unfinished_requests(), "t_ns": now}

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
        self.queue(list(prompt_ids), params, request_id, text=prompt)
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
            n = handle.num_bytes // block_nbytes(self.tensors)
            scratch = [torch.empty((n, *t.shape[1:]), dtype=t.dtype) for t in self.tensors]
            self.connector.receive(scratch, list(range(n)), handle)

    # ---- tests ------------------------------------------------------------------------------------
    def set_fault(self, kind: str | None) -> None:
        self.fault = kind


def serve(conn: Connection, name: str, model: str, engine_kwargs: dict[str, Any], kv_config: KVTransferConfig,
          threads: int, secret: bytes | None = None) -> None:
    """The instance process's main: build the engine, report ``ready``, answer commands until ``close``."""
    torch.set_num_threads(max(1, threads))
    try:
        server = InstanceServer(name, model, engine_kwargs, kv_config, secret)
    except BaseException as exc:
        conn.send(("error", type(exc).__name__, f"{name}: {exc}"))
        return
    conn.send(("ok", server.info))
    while True:
        try:
            cmd, args = conn.recv()
        except (EOFError, OSError):  # the router is gone
            break
        if cmd == "close":
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", server.call(cmd, *args)))
        except Exception as exc:
            conn.send(("error", type(exc).__name__, str(exc)))
    server.connector.close()
