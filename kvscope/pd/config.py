"""What a disaggregated engine is made of: the ``pd`` spelling ("1P1D", "2P1D", ...) and the KV connector's
configuration, in vLLM's words (``kv_transfer_config``: ``kv_connector``, ``kv_role``, ``kv_ip``,
``kv_port``, ``kv_connector_extra_config``). Standard library only."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

KV_PRODUCER = "kv_producer"  # a prefill instance: computes a prompt's KV and sends its blocks
KV_CONSUMER = "kv_consumer"  # a decode instance: receives the blocks and continues the request
KV_ROLES = (KV_PRODUCER, KV_CONSUMER)
TRANSPORTS = ("shm", "zmq")  # shared memory on one machine; TCP through ZeroMQ between machines
CONNECTOR = "KVScopeConnector"
AUTHKEY_ENV = "KVSCOPE_PD_AUTHKEY"  # how an instance process gets the key of its connection to the router

_PD = re.compile(r"^\s*(\d+)\s*P\s*(\d+)\s*D\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class PDLayout:
    """How many prefill and decode instances: ``PDLayout.parse("2P1D")``."""

    num_prefill: int
    num_decode: int

    @classmethod
    def parse(cls, value: str | PDLayout) -> PDLayout:
        if isinstance(value, PDLayout):
            return value
        if not isinstance(value, str):
            raise TypeError(f"pd={value!r} must be a string like '1P1D' or '2P1D'")
        m = _PD.match(value)
        if m is None:
            raise ValueError(f"pd={value!r} is not a layout: write <n>P<m>D, e.g. '1P1D' or '2P1D'")
        layout = cls(int(m.group(1)), int(m.group(2)))
        if not 1 <= layout.num_prefill <= 16 or not 1 <= layout.num_decode <= 16:
            raise ValueError(f"pd={value!r}: each of P and D must be between 1 and 16")
        return layout

    def __str__(self) -> str:
        return f"{self.num_prefill}P{self.num_decode}D"

    def names(self) -> list[tuple[str, str]]:
        """(instance name, kv_role) of every instance, prefill ones first."""
        return ([(f"prefill-{i}", KV_PRODUCER) for i in range(self.num_prefill)]
                + [(f"decode-{i}", KV_CONSUMER) for i in range(self.num_decode)])


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    """vLLM's ``KVTransferConfig`` fields that kvscope's connector reads.

    ``kv_connector_extra_config["transport"]``: ``"shm"`` (default) or ``"zmq"``; ``kv_ip`` / ``kv_port``:
    where a decode instance's ZMQ socket binds (port 0: any free port; instance i binds port + i).
    ``kv_role`` is set per instance by the router."""

    kv_connector: str = CONNECTOR
    kv_role: str | None = None
    kv_ip: str = "127.0.0.1"
    kv_port: int = 0
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kv_connector != CONNECTOR:
            raise ValueError(f"kv_connector={self.kv_connector!r}: kvscope has one connector, {CONNECTOR!r}")
        if self.kv_role is not None and self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role={self.kv_role!r} must be one of {KV_ROLES}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"kv_connector_extra_config['transport']={self.transport!r} must be one of "
                             f"{TRANSPORTS}")
        if not isinstance(self.kv_port, int) or isinstance(self.kv_port, bool) or not 0 <= self.kv_port < 65536:
            raise ValueError(f"kv_port={self.kv_port!r} must be an int in [0, 65535]")

    @property
    def transport(self) -> str:
        return self.kv_connector_extra_config.get("transport", "shm")

    @property
    def timeout_s(self) -> float:
        """How long a consumer waits for a transfer's bytes (``kv_connector_extra_config["timeout_s"]``)."""
        return float(self.kv_connector_extra_config.get("timeout_s", 30.0))

    @classmethod
    def of(cls, value: KVTransferConfig | dict[str, Any] | None) -> KVTransferConfig:
        """From a ``KVTransferConfig``, a dict of its fields (vLLM's JSON form) or ``None`` (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"kv_transfer_config={value!r} must be a dict or a KVTransferConfig")
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"kv_transfer_config: unknown field(s) {sorted(unknown)}")
        return cls(**value)

    def for_role(self, role: str, index: int) -> KVTransferConfig:
        port = self.kv_port + index if self.kv_port else 0
        return replace(self, kv_role=role, kv_port=port)

    def to_json(self) -> dict[str, Any]:
        return {"kv_connector": self.kv_connector, "kv_role": self.kv_role, "kv_ip": self.kv_ip,
                "kv_port": self.kv_port, "kv_connector_extra_config": dict(self.kv_connector_extra_config)}
