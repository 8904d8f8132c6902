"""The seams of P/D disaggregation, as ``typing.Protocol`` s that mypy (``.ci/typecheck``) checks both sides of.

- ``Instance``: what the router (``kvscope.pd.router.Router``) asks of a prefill or decode instance. Two
  satisfy it: ``kvscope.pd.process.InstanceProcess`` (the router's side of an instance in its own process)
  and ``kvscope.pd.sim_instance.SimInstance`` (a simulated engine in this process). ``Router`` is generic in
  its instances (``Router[InstanceProcess, ...]``, ``Router[SimInstance, ...]``, bound by ``Instance``), so
  each is checked where a P/D engine is declared.
- ``TransferConfig``: how KV moves between instances, as a run's metadata records it:
  ``kvscope.pd.config.KVTransferConfig`` (a real connector) or ``kvscope.pd.sim_engine.SimLink`` (timed).
- ``RouterView``: what the recorder (``kvscope.pd.recorder.PDRecorder``) reads of a router.

Members are read-only properties where the router only reads them, so an implementation may hold a plain
attribute, a narrower type or a property.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kvscope.pd.config import PDLayout
from kvscope.pd.routes import PDRequest, TransferRecord
from kvscope.telemetry.records import RequestEvent, StepRecord

__all__ = ["Instance", "RouterView", "Snapshot", "TransferConfig"]

# An instance's answer to ``snapshot``: its recorder's records, events, metadata and profiler events.
Snapshot = tuple[list[StepRecord], list[RequestEvent], dict[str, Any], list[dict[str, Any]]]


class Instance(Protocol):
    """One prefill (``kv_producer``) or decode (``kv_consumer``) instance as the router sees it."""

    @property
    def name(self) -> str:
        """``prefill-0``, ``decode-1``, ... (``PDLayout.names``)."""

    @property
    def role(self) -> str:
        """``kv_producer`` or ``kv_consumer`` (``kvscope.pd.config``)."""

    @property
    def alive(self) -> bool:
        """False once the instance is gone (its process died or was closed)."""

    @property
    def dead(self) -> str | None:
        """Why it is gone, naming it (``None`` while alive)."""

    @property
    def info(self) -> dict[str, Any]:
        """Its pool, model and place (``pid``, ``threads``, ``address``: ``None`` in a simulation), and its
        engine's ``run_metadata`` under ``meta``."""

    def call(self, cmd: str, *args: Any) -> Any:
        """Its answer to a command once it has run (raising the instance's own error if it failed). Every instance
        answers ``snapshot``, ``clear``, ``stats``, ``abort``, ``tokenize`` and ``detokenize``
        (``kvscope.pd.instance_core``); a process instance also the hand-over's (``kvscope.pd.instance``)."""


class TransferConfig(Protocol):
    """How KV moves between instances (``meta["pd"]["kv_transfer_config"]`` is its ``to_json``)."""

    def to_json(self) -> dict[str, Any]: ...


class RouterView(Protocol):
    """What ``PDRecorder`` reads of a router: the layout and transfer configuration, the instances, the
    requests (unfinished, then finished in finishing order) and the transfers."""

    @property
    def layout(self) -> PDLayout: ...

    @property
    def kv_transfer_config(self) -> TransferConfig: ...

    @property
    def instances(self) -> Mapping[str, Instance]: ...

    @property
    def requests(self) -> Mapping[str, PDRequest]: ...

    @property
    def done(self) -> list[PDRequest]: ...

    @property
    def transfers(self) -> list[TransferRecord]: ...

    def instances_at_rest(self) -> Sequence[Instance]:
        """The live instances, none with a step in flight (ready to answer a command at once)."""
