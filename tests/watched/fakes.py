"""Stand-ins for a vLLM server, all on 127.0.0.1: ``FakeServer`` serves ``/metrics`` in vLLM's format from a
state the test changes; ``FakePublisher`` publishes KV event batches the way ``ZmqEventPublisher`` does
(bind or connect, both event encodings, a replay ROUTER)."""

from __future__ import annotations

import http.server
import math
import socket
import threading
import time
from dataclasses import dataclass, field

import msgspec
import zmq

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)
# vLLM 0.32's buckets (kv_connector/v1/nixl/stats.py, offloading/metrics.py)
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
POST_BUCKETS = (0.001, *XFER_BUCKETS)
BYTES_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
DESCRIPTOR_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
OFFLOAD_SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")


@dataclass
class NixlMetrics:
    """One engine's NIXL series (observations per transfer, cumulative counters)."""

    xfer_time: list[float] = field(default_factory=list)
    post_time: list[float] = field(default_factory=list)
    bytes_transferred: list[float] = field(default_factory=list)
    descriptors: list[float] = field(default_factory=list)
    failed_transfers: float = 0
    failed_notifications: float = 0
    kv_expired_reqs: float = 0
    notifications_after_expiry: float = 0


@dataclass
class OffloadMetrics:
    """One engine's offloading series per transfer_type: bytes, seconds and the size of each transfer;
    ``flat``: vLLM's flat store / load names too (CPU offload counts in both)."""

    bytes: dict[str, float] = field(default_factory=lambda: {"GPU_to_CPU": 0.0, "CPU_to_GPU": 0.0})
    seconds: dict[str, float] = field(default_factory=lambda: {"GPU_to_CPU": 0.0, "CPU_to_GPU": 0.0})
    sizes: dict[str, list[float]] = field(default_factory=lambda: {"GPU_to_CPU": [], "CPU_to_GPU": []})
    allocation_failures: float = 0
    flat: bool = True


@dataclass
class EngineMetrics:
    """What one engine's series say (cumulative counters, as vLLM keeps them)."""

    running: float = 0
    waiting: float = 0
    kv_usage: float = 0.0
    prompt_tokens: float = 0
    generation_tokens: float = 0
    prefix_queries: float = 0
    prefix_hits: float = 0
    preemptions: float = 0
    finished: dict[str, float] = field(default_factory=lambda: {"stop": 0, "length": 0})
    ttft: list[float] = field(default_factory=list)  # observations
    itl: list[float] = field(default_factory=list)
    num_gpu_blocks: int = 64
    block_size: int = 32
    nixl: NixlMetrics | None = None  # NixlConnector's families (None: no such connector)
    offload: OffloadMetrics | None = None
    kv_fetch: dict[str, float] | None = None  # vllm:num_requests_kv_fetch_by_stage (kv_consumer / kv_both only)


def render(engines: dict[str, EngineMetrics], model: str = "tiny") -> str:
    """A /metrics page like vLLM 0.32's (HELP / TYPE lines, model_name and engine labels)."""
    out = []

    def family(name: str, kind: str, rows: list[tuple[str, dict, float]]) -> None:
        out.append(f"# HELP {name} {name}.")
        out.append(f"# TYPE {name} {kind}")
        for sample, labels, value in rows:
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            out.append(f"{sample}{{{text}}} {value}")

    def per(attr: str) -> list:
        return [({"engine": e, "model_name": model}, getattr(m, attr)) for e, m in engines.items()]

    for name, attr in (("vllm:num_requests_running", "running"), ("vllm:num_requests_waiting", "waiting"),
                       ("vllm:kv_cache_usage_perc", "kv_usage")):
        family(name, "gauge", [(name, lab, v) for lab, v in per(attr)])
    for name, attr in (("vllm:prompt_tokens", "prompt_tokens"), ("vllm:generation_tokens", "generation_tokens"),
                       ("vllm:prefix_cache_queries", "prefix_queries"), ("vllm:prefix_cache_hits", "prefix_hits"),
                       ("vllm:num_preemptions", "preemptions")):
        family(name, "counter", [(name + s, lab, v if s == "_total" else 1.7e9)  # _created: prometheus_client's
                                 for lab, v in per(attr) for s in ("_total", "_created")])
    family("vllm:request_success", "counter", [
        ("vllm:request_success_total", {"engine": e, "finished_reason": r, "model_name": model}, n)
        for e, m in engines.items() for r, n in m.finished.items()])
    for name, attr in (("vllm:time_to_first_token_seconds", "ttft"), ("vllm:inter_token_latency_seconds", "itl")):
        rows = []
        for e, m in engines.items():
            obs = getattr(m, attr)
            lab = {"engine": e, "model_name": model}
            for le in (*TTFT_BUCKETS, "+Inf"):
                bound = float("inf") if le == "+Inf" else le
                rows.append((name + "_bucket", {**lab, "le": le}, sum(1 for o in obs if o <= bound)))
            rows.append((name + "_count", lab, len(obs)))
            rows.append((name + "_sum", lab, sum(obs)))
        family(name, "histogram", rows)
    render_transfers(engines, model, family)
    family("vllm:cache_config_info", "gauge", [
        ("vllm:cache_config_info", {"block_size": m.block_size, "engine": e, "num_gpu_blocks": m.num_gpu_blocks,
                                    "enable_prefix_caching": "True"}, 1.0) for e, m in engines.items()])
    return "\n".join(out) + "\n"


def _hist_rows(name: str, labels: dict, obs: list[float], bounds: tuple) -> list[tuple[str, dict, float]]:
    rows = [(name + "_bucket", {**labels, "le": le}, sum(1 for o in obs if o <= (math.inf if le == "+Inf" else le)))
            for le in (*bounds, "+Inf")]
    return [*rows, (name + "_count", labels, len(obs)), (name + "_sum", labels, sum(obs))]


def render_transfers(engines: dict[str, EngineMetrics], model: str, family) -> None:
    """The KV connector families of the engines that have them, as vLLM 0.32 names them."""
    lab = {e: {"engine": e, "model_name": model} for e in engines}
    nixl = {e: m.nixl for e, m in engines.items() if m.nixl is not None}
    for name, attr, bounds in (("vllm:nixl_xfer_time_seconds", "xfer_time", XFER_BUCKETS),
                               ("vllm:nixl_post_time_seconds", "post_time", POST_BUCKETS),
                               ("vllm:nixl_bytes_transferred", "bytes_transferred", BYTES_BUCKETS),
                               ("vllm:nixl_num_descriptors", "descriptors", DESCRIPTOR_BUCKETS)):
        if nixl:
            family(name, "histogram",
                   [r for e, n in nixl.items() for r in _hist_rows(name, lab[e], getattr(n, attr), bounds)])
    for name, attr in (("vllm:nixl_num_failed_transfers", "failed_transfers"),
                       ("vllm:nixl_num_failed_notifications", "failed_notifications"),
                       ("vllm:nixl_num_kv_expired_reqs", "kv_expired_reqs"),
                       ("vllm:nixl_num_notifications_after_expiry", "notifications_after_expiry")):
        if nixl:
            family(name, "counter", [(name + s, lab[e], getattr(n, attr) if s == "_total" else 1.7e9)
                                     for e, n in nixl.items() for s in ("_total", "_created")])
    off = {e: m.offload for e, m in engines.items() if m.offload is not None}
    if off:
        for name, attr in (("vllm:kv_offload_total_bytes", "bytes"), ("vllm:kv_offload_total_time", "seconds")):
            family(name, "counter", [(name + "_total", {**lab[e], "transfer_type": k}, v)
                                     for e, o in off.items() for k, v in getattr(o, attr).items()])
        family("vllm:kv_offload_size", "histogram", [
            r for e, o in off.items() for k, obs in o.sizes.items()
            for r in _hist_rows("vllm:kv_offload_size", {**lab[e], "transfer_type": k}, obs, OFFLOAD_SIZE_BUCKETS)])
        flat = {e: o for e, o in off.items() if o.flat}
        for word, kind in (("store", "GPU_to_CPU"), ("load", "CPU_to_GPU")):
            if flat:
                family(f"vllm:kv_offload_{word}_bytes", "counter",
                       [(f"vllm:kv_offload_{word}_bytes_total", lab[e], o.bytes[kind]) for e, o in flat.items()])
                family(f"vllm:kv_offload_{word}_time", "counter",
                       [(f"vllm:kv_offload_{word}_time_total", lab[e], o.seconds[kind]) for e, o in flat.items()])
                family(f"vllm:kv_offload_{word}_size", "histogram", [
                    r for e, o in flat.items()
                    for r in _hist_rows(f"vllm:kv_offload_{word}_size", lab[e], o.sizes[kind], OFFLOAD_SIZE_BUCKETS)])
        family("vllm:kv_offload_allocation_failure", "counter", [
            ("vllm:kv_offload_allocation_failure_total", lab[e], o.allocation_failures) for e, o in off.items()])
    fetch = {e: m.kv_fetch for e, m in engines.items() if m.kv_fetch is not None}
    if fetch:
        family("vllm:num_requests_kv_fetch_by_stage", "gauge", [
            ("vllm:num_requests_kv_fetch_by_stage", {**lab[e], "stage": st}, f.get(st, 0))
            for e, f in fetch.items() for st in FETCH_STAGES])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    """``/metrics`` on 127.0.0.1; ``stop()`` and ``start()`` again on the same port (a server that dies and
    comes back); ``page`` overrides the text (malformed pages)."""

    def __init__(self, engines: int | list[str] = 1, port: int | None = None) -> None:
        labels = [str(i) for i in range(engines)] if isinstance(engines, int) else engines
        self.engines = {e: EngineMetrics() for e in labels}
        self.page: str | bytes | None = None
        self.status = 200
        self.num_requests = 0
        self.port = port or free_port()
        self._httpd: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeServer:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.num_requests += 1
                page = owner.page if owner.page is not None else render(owner.engines)
                body = page if isinstance(page, bytes) else page.encode()
                self.send_response(owner.status if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def restart(self) -> None:
        """The server starts again: every counter back at zero."""
        self.engines = {e: EngineMetrics() for e in self.engines}


def stored(hashes: list, parent=None, block_size: int = 32, encoding: str = "map") -> object:
    tokens = list(range(len(hashes) * block_size))
    if encoding == "array":
        return ["BlockStored", hashes, parent, tokens, block_size, None, "GPU"]
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None,
            "extra_keys": [None] * len(hashes), "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def removed(hashes: list, encoding: str = "map") -> object:
    if encoding == "array":
        return ["BlockRemoved", hashes, "GPU"]
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": 0}


def cleared(encoding: str = "map") -> object:
    return ["AllBlocksCleared"] if encoding == "array" else {"type": "AllBlocksCleared"}


class FakePublisher:
    """vLLM's ``ZmqEventPublisher`` in miniature: PUB frames ``[topic, seq, payload]``; ``bind`` (vLLM with
    ``tcp://*:PORT``) or ``connect`` (vLLM with a concrete address); ``replay_port``: a ROUTER that answers
    ``[b"", start_seq]`` with the buffered batches and an end marker."""

    def __init__(self, endpoint: str, *, bind: bool = True, topic: str = "kv-events", replay_port: int | None = None,
                 rank: int | None = 0) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        (self.pub.bind if bind else self.pub.connect)(endpoint)
        self.topic, self.rank, self.seq = topic.encode(), rank, 0
        self.buffer: list[tuple[int, bytes]] = []
        self.router = None
        self._stop = threading.Event()
        if replay_port is not None:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(f"tcp://127.0.0.1:{replay_port}")
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def payload(self, events: list) -> bytes:
        return msgspec.msgpack.encode([time.time(), events, self.rank])

    def send(self, events: list, *, seq: int | None = None, raw: bytes | None = None, frames=None) -> int:
        """Publish one batch (``raw``: this payload instead; ``frames``: these frames instead)."""
        seq = self.seq if seq is None else seq
        payload = raw if raw is not None else self.payload(events)
        self.pub.send_multipart(frames if frames is not None else [self.topic, seq.to_bytes(8, "big"), payload])
        self.buffer.append((seq, payload))
        self.seq = seq + 1
        return seq

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    self.router.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self._stop.set()
        if self.router is not None:
            self._thread.join(2)
            self.router.close(0)
        self.pub.close(0)
        self.ctx.term()
