"""What a disaggregated engine is made of: the ``pd`` spelling ("1P1D", "2P1D", ...) and the KV connector's
configuration, in vLLM's words (``kv_transfer_config``: ``kv_connector``, ``kv_role``, ``kv_ip``,
``kv_port``, ``kv_connector_extra_config``). Standard library only."""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from dataclasses import dataclass, field, replace
from typing import Any

KV_PRODUCER = "kv_producer"  # a prefill instance: computes a prompt's KV and sends its blocks
KV_CONSUMER = "kv_consumer"  # a decode instance: receives the blocks and continues the request
KV_ROLES = (KV_PRODUCER, KV_CONSUMER)
TRANSPORTS = ("shm", "zmq")  # shared memory on one machine; TCP through ZeroMQ between machines
CONNECTOR = "KVScopeConnector"
AUTHKEY_ENV = "KVSCOPE_PD_AUTHKEY"  # how an instance process gets the key of its connection to the router
EXTRA_KEYS = ("transport", "timeout_s")  # what kvscope's connector reads of kv_connector_extra_config
MAX_TIMEOUT_S = 3600.0
# what one instance process takes before its model and KV pool: an interpreter with torch (measured ~0.5 GB)
INSTANCE_BASE_BYTES = 512 * 2**20
INSTANCES_PER_CORE = 4  # past this many instance processes per usable core, a layout is refused

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

    def check_fits(self, cores: int | None = None, available_bytes: int | None = None) -> str | None:
        """Refuse (``ValueError``) a layout this machine cannot hold; a warning line (``None``: none) for one that
        oversubscribes it. The rule: each instance is a process of its own (an interpreter with torch, at least
        ``INSTANCE_BASE_BYTES`` before its model and KV pool) with at least one thread, so at most
        ``INSTANCES_PER_CORE`` instances per usable core and ``INSTANCE_BASE_BYTES`` each within the memory
        available now (``MemAvailable``); more instances than cores are allowed with a warning (they take turns)."""
        n = self.num_prefill + self.num_decode
        cores = cores or _usable_cores()
        available = available_bytes if available_bytes is not None else _available_bytes()
        if n > INSTANCES_PER_CORE * cores:
            raise ValueError(f"pd={self}: {n} instance processes on {cores} usable core(s) is more than this machine "
                             f"runs usefully (at most {INSTANCES_PER_CORE * cores}: {INSTANCES_PER_CORE} per core); "
                             "use fewer instances, e.g. '1P1D'")
        if available is not None and n * INSTANCE_BASE_BYTES > available:
            raise ValueError(f"pd={self}: {n} instance processes take at least {n * INSTANCE_BASE_BYTES / 2**30:.1f} "
                             f"GiB before any model or KV cache (~{INSTANCE_BASE_BYTES // 2**20} MiB each) and "
                             f"{available / 2**30:.1f} GiB is available; use fewer instances")
        if n > cores:
            return (f"pd={self}: {n} instance processes share {cores} core(s), one thread each: they take turns, "
                    "and the timings show it")
        return None

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
        if not isinstance(self.kv_connector_extra_config, dict):
            raise ValueError(f"kv_connector_extra_config={self.kv_connector_extra_config!r} must be a dict")
        if self.kv_connector != CONNECTOR:
            raise ValueError(f"kv_connector={self.kv_connector!r}: kvscope has one connector, {CONNECTOR!r}")
        if self.kv_role is not None and self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role={self.kv_role!r} must be one of {KV_ROLES}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"kv_connector_extra_config['transport']={self.transport!r} must be one of "
                             f"{TRANSPORTS}")
        if not isinstance(self.kv_port, int) or isinstance(self.kv_port, bool) or not 0 <= self.kv_port < 65536:
            raise ValueError(f"kv_port={self.kv_port!r} must be an int in [0, 65535]")
        unknown = sorted(set(self.kv_connector_extra_config) - set(EXTRA_KEYS))
        if unknown:
            raise ValueError(f"kv_connector_extra_config: unknown key(s) {unknown}; kvscope's connector reads "
                             f"{list(EXTRA_KEYS)}")
        t = self.kv_connector_extra_config.get("timeout_s", 30.0)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= MAX_TIMEOUT_S:
            raise ValueError(f"kv_connector_extra_config['timeout_s']={t!r} must be a number of seconds in "
                             f"(0, {MAX_TIMEOUT_S:.0f}]: how long a consumer waits for a transfer's bytes")
        try:
            ipaddress.ip_address(self.kv_ip)
        except ValueError:
            raise ValueError(f"kv_ip={self.kv_ip!r} must be an IP address of this machine (e.g. '127.0.0.1'), "
                             "where a decode instance's ZMQ socket binds") from None

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

    def check_bindable(self, num_consumers: int) -> None:
        """For the zmq transport, before any process starts: each decode instance's address can be bound now
        (``ValueError`` naming the address and why not: not this machine's, in use)."""
        if self.transport != "zmq":
            return
        family = socket.AF_INET6 if ipaddress.ip_address(self.kv_ip).version == 6 else socket.AF_INET
        for i in range(num_consumers):
            port = self.kv_port + i if self.kv_port else 0
            if port > 65535:
                raise ValueError(f"kv_port={self.kv_port}: decode instance {i} would bind port {port}, past 65535")
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((self.kv_ip, port))
                except OSError as exc:
                    raise ValueError(f"kv_transfer_config: decode instance {i} cannot bind {self.kv_ip}:{port} "
                                     f"({exc.strerror or exc}); give a kv_ip of this machine and a free kv_port "
                                     "(0: any free port)") from None

    def to_json(self) -> dict[str, Any]:
        return {"kv_connector": self.kv_connector, "kv_role": self.kv_role, "kv_ip": self.kv_ip,
                "kv_port": self.kv_port, "kv_connector_extra_config": dict(self.kv_connector_extra_config)}


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (``None`` where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
