"""What the router records of each request: its route over the instances and times (``PDRequest``) and its KV
hand-over (``TransferRecord``). Both P/D engines record them (``kvscope.pd.engine``, ``kvscope.pd.sim_engine``),
and ``kvscope.pd.recorder`` writes them into ``meta["pd"]``. Light: importing it loads no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvscope.engine.request import Request, RequestOutput


@dataclass(slots=True)
class TransferRecord:
    """One request's KV hand-over (times: ``perf_counter_ns``, which every process on a machine shares; a
    simulation's: its virtual clock)."""

    request_id: str
    src: str
    dst: str
    transport: str
    num_blocks: int  # blocks moved
    num_held_blocks: int  # full prompt blocks the consumer already held (not moved)
    num_bytes: int
    start_ns: int  # the producer starts packing
    end_ns: int  # the consumer has unpacked
    ok: bool = True
    error: str | None = None
    src_block_ids: list[int] | None = None  # the producer's blocks sent (the page maps mark them in flight)
    dst_block_ids: list[int] | None = None  # the consumer's blocks they landed in


@dataclass(slots=True)
class PDRequest:
    """A request as the router follows it; ``request`` mirrors it for callers (tokens and status at the end)."""

    request: Request
    arrival_ns: int
    prefill: str
    decode: str | None = None
    first_token_ns: int | None = None
    finished_ns: int | None = None
    output: RequestOutput | None = None
    timeline: dict[str, int] = field(default_factory=dict)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_token_ids
