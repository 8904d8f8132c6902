"""The KV connector: a request's KV blocks out of a producer's pages and into a consumer's.

Two transports carry the bytes, chosen by ``kv_connector_extra_config["transport"]``:

- ``"shm"``: the producer writes the blocks into a new POSIX shared-memory segment and hands its name on;
  the consumer copies them into its pages and unlinks the segment (one machine);
- ``"zmq"``: each consumer binds a ZeroMQ PULL socket on TCP (``kv_ip``, ``kv_port``); the producer PUSHes
  the bytes to it and the consumer receives them (works between machines). Anyone who can reach the port can
  connect, so a message counts only if it proves it comes from this engine: ``[MAGIC, transfer id, HMAC-SHA256
  of the id and the bytes under the engine's secret, the bytes]`` (the secret: random per engine, handed to each
  instance over its authenticated pipe, never written to a file; as the shm transport's pipe has an authkey).
  A message that is not so (a stranger's, malformed, forged, stale) is dropped and counted, and the consumer
  goes on waiting for its transfer; one larger than a prompt's blocks can be is refused by ZMQ itself
  (``MAXMSGSIZE``: the sender is disconnected), so junk cannot grow the consumer's memory.

The payload is every layer's K then V pages of the blocks, in block order, as raw bytes
(``pack_blocks`` / ``unpack_blocks``); both sides run the same model, so the shapes agree.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import TYPE_CHECKING

import torch

from kvscope.pd.config import KVTransferConfig

if TYPE_CHECKING:
    import zmq  # imported on first use: only the zmq transport needs it


MAGIC = b"kvscope-kv/1"  # the first frame of every ZMQ transfer message
SECRET_BYTES = 32
MAC_BYTES = hashlib.sha256().digest_size


class TransferError(RuntimeError):
    """A transfer that could not be made (refused, timed out, the bytes never came)."""


@dataclass(slots=True)
class TransferHandle:
    """What the router carries from producer to consumer: where the bytes are, and how many."""

    transfer_id: str
    transport: str
    num_bytes: int
    segment: str | None = None  # shm: the segment's name


def kv_tensors(runner) -> list[torch.Tensor]:
    """Every layer's K and V page tensors, in layer order (the order both sides pack in)."""
    return [t for kv in runner.kv_caches for t in kv]


def block_nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t[0].numel() * t.element_size() for t in tensors)


def pack_blocks(tensors: list[torch.Tensor], block_ids: list[int], out: memoryview) -> int:
    """Write the pages ``block_ids`` of every tensor into ``out``; returns the bytes written."""
    dst = torch.frombuffer(out, dtype=torch.uint8) if len(out) else torch.empty(0, dtype=torch.uint8)
    idx = torch.tensor(block_ids, dtype=torch.long)
    offset = 0
    for t in tensors:  # one copy per tensor: gathered straight into the buffer
        n = len(block_ids) * t[0].numel() * t.element_size()
        torch.index_select(t, 0, idx, out=dst[offset: offset + n].view(t.dtype).view(len(block_ids), *t.shape[1:]))
        offset += n
    return offset


def unpack_blocks(tensors: list[torch.Tensor], block_ids: list[int], data: memoryview) -> None:
    """Copy what ``pack_blocks`` wrote into the pages ``block_ids`` of every tensor."""
    src = torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    idx = torch.tensor(block_ids, dtype=torch.long)
    offset = 0
    for t in tensors:
        shape = (len(block_ids), *t.shape[1:])
        n = len(block_ids) * t[0].numel() * t.element_size()
        pages = src[offset: offset + n].view(t.dtype).view(shape)
        t.index_copy_(0, idx, pages)
        offset += n
    if offset != len(data):
        raise TransferError(f"the transfer holds {len(data)} bytes but {len(block_ids)} blocks take {offset}")


def _mac(secret: bytes, transfer_id: bytes, payload: memoryview | bytes | bytearray) -> bytes:
    mac = hmac.new(secret, transfer_id, hashlib.sha256)
    mac.update(payload)
    return mac.digest()


class Connector:
    """One instance's side of the connector (its ``kv_role`` says which side). ``secret``: the engine's shared
    secret (the zmq transport needs it: ``SECRET_BYTES`` random bytes); ``max_message_bytes``: the largest
    transfer a consumer accepts (a whole prompt's blocks; ZMQ disconnects a sender of more)."""

    def __init__(self, config: KVTransferConfig, secret: bytes | None = None,
                 max_message_bytes: int | None = None) -> None:
        self.config = config
        self.transport = config.transport
        self._ctx: zmq.Context | None = None
        self._pull: zmq.Socket | None = None
        self._pushes: dict[str, zmq.Socket] = {}
        self.address: str | None = None  # a consumer's ZMQ address
        self.dropped = 0  # messages a zmq consumer threw away: not this engine's, malformed, or stale
        if self.transport == "zmq" and (not isinstance(secret, bytes) or len(secret) < 16):
            raise ValueError("the zmq KV transport needs the engine's shared secret (16 bytes or more): "
                             "PDEngine makes one; a Connector made by hand takes secret=os.urandom(32)")
        self.secret = secret or b""
        if self.transport == "zmq" and config.kv_role == "kv_consumer":
            import zmq

            self._ctx = zmq.Context()
            self._pull = self._ctx.socket(zmq.PULL)
            self._pull.setsockopt(zmq.LINGER, 0)
            if max_message_bytes is not None:  # per frame: a bigger one disconnects its sender, unread
                self._pull.setsockopt(zmq.MAXMSGSIZE, max(4096, int(max_message_bytes)))
            if config.kv_port:
                self._pull.bind(f"tcp://{config.kv_ip}:{config.kv_port}")
                self.address = f"tcp://{config.kv_ip}:{config.kv_port}"
            else:
                port = self._pull.bind_to_random_port(f"tcp://{config.kv_ip}")
                self.address = f"tcp://{config.kv_ip}:{port}"

    # ---- producer ----------------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], block_ids: list[int], address: str | None) -> TransferHandle:
        """Pack the blocks and put them on the transport; the handle goes to the consumer."""
        tid = uuid.uuid4().hex[:16]
        nbytes = len(block_ids) * block_nbytes(tensors)
        if self.transport == "shm":
            if nbytes == 0:
                return TransferHandle(tid, "shm", 0)
            seg = shared_memory.SharedMemory(name=f"kvscope_{tid}", create=True, size=nbytes)
            try:
                pack_blocks(tensors, block_ids, _segment_bytes(seg, nbytes))
            finally:
                seg.close()
                # the consumer unlinks it; _name is the name the tracker registered (typeshed leaves it out)
                resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
            return TransferHandle(tid, "shm", nbytes, seg.name)
        buf = bytearray(nbytes)
        pack_blocks(tensors, block_ids, memoryview(buf))
        self._push(address).send_multipart([MAGIC, tid.encode(), _mac(self.secret, tid.encode(), buf), buf],
                                           copy=False)
        return TransferHandle(tid, "zmq", nbytes)

    def _push(self, address: str | None) -> zmq.Socket:
        if address is None:
            raise TransferError("the consumer has no ZMQ address")
        sock = self._pushes.get(address)
        if sock is None:
            import zmq

            if self._ctx is None:
                self._ctx = zmq.Context()
            sock = self._pushes[address] = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(address)
        return sock

    # ---- consumer ----------------------------------------------------------------------------
    def receive(self, tensors: list[torch.Tensor], block_ids: list[int], handle: TransferHandle) -> None:
        """Copy a transfer's bytes into the pages ``block_ids``."""
        if handle.num_bytes == 0:
            return
        if handle.transport == "shm":
            seg = shared_memory.SharedMemory(name=handle.segment)
            try:
                unpack_blocks(tensors, block_ids, _segment_bytes(seg, handle.num_bytes))
            finally:
                seg.close()
                seg.unlink()
            return
        payload = self._receive_payload(handle.transfer_id, handle.num_bytes)
        unpack_blocks(tensors, block_ids, payload)

    def _receive_payload(self, transfer_id: str, num_bytes: int) -> memoryview:
        """The bytes of transfer ``transfer_id``, waiting at most ``timeout_s`` in all; every other message is
        dropped (``self.dropped``): a stranger's or a forged one (no valid MAC under the secret), a malformed one,
        a stale transfer's (its request failed before the consumer read it)."""
        if self._pull is None:
            raise TransferError("this instance has no ZMQ socket (it is not a zmq consumer)")
        want = transfer_id.encode()
        deadline = time.monotonic() + self.config.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._pull.poll(max(1, int(left * 1000))):
                raise TransferError(f"transfer {transfer_id}: no bytes within {self.config.timeout_s} s"
                                    + (f" ({self.dropped} messages dropped as not this engine's)"
                                       if self.dropped else ""))
            frames = self._pull.recv_multipart(copy=False)
            if len(frames) == 4 and frames[0].bytes == MAGIC and len(frames[2].bytes) == MAC_BYTES:
                tid, payload = frames[1].bytes, frames[3].buffer
                authentic = hmac.compare_digest(frames[2].bytes, _mac(self.secret, tid, payload))
                if authentic and tid == want and len(payload) == num_bytes:
                    return payload
            self.dropped += 1

    def close(self) -> None:
        for sock in [*self._pushes.values(), self._pull]:
            if sock is not None:
                sock.close()
        if self._ctx is not None:
            self._ctx.term()


def _segment_bytes(seg: shared_memory.SharedMemory, nbytes: int) -> memoryview:
    """The first ``nbytes`` of an open segment (its ``buf`` is ``None`` only once closed)."""
    if seg.buf is None:
        raise TransferError(f"shared-memory segment {seg.name} is closed")
    return seg.buf[:nbytes]


def discard(handle: TransferHandle) -> None:
    """Free a transfer nobody will read (its consumer failed): unlink its shared-memory segment."""
    if handle.transport == "shm" and handle.segment:
        try:
            seg = shared_memory.SharedMemory(name=handle.segment)
        except FileNotFoundError:
            return
        seg.close()
        seg.unlink()
