"""The connector without instances: the layout and config parsing (vLLM's names), the blocks' bytes round trip
over each transport, the summary and the transfer track of a hand-made meta (no processes)."""

import hashlib
import hmac
import math
import os

import pytest
import torch

from kvscope.pd.config import KVTransferConfig, PDLayout
from kvscope.pd.connector import Connector, TransferError, TransferHandle, discard
from kvscope.pd.summary import pd_summary, transfer_lane


def test_layouts_parse_and_bad_ones_are_refused():
    assert PDLayout.parse("1P1D") == PDLayout(1, 1)
    assert PDLayout.parse("2p1d").names() == [("prefill-0", "kv_producer"), ("prefill-1", "kv_producer"),
                                             ("decode-0", "kv_consumer")]
    for bad in ("1P", "0P1D", "P1D", "1D1P", "99P1D"):
        with pytest.raises(ValueError, match="pd="):
            PDLayout.parse(bad)
    with pytest.raises(TypeError):
        PDLayout.parse(2)


def test_kv_transfer_config_takes_vllms_fields():
    c = KVTransferConfig.of({"kv_connector": "KVScopeConnector", "kv_port": 5600,
                             "kv_connector_extra_config": {"transport": "zmq"}})
    assert c.transport == "zmq" and c.for_role("kv_consumer", 2).kv_port == 5602
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig(kv_role="kv_both")
    with pytest.raises(ValueError, match="transport"):
        KVTransferConfig(kv_connector_extra_config={"transport": "rdma"})
    with pytest.raises(ValueError, match="unknown field"):
        KVTransferConfig.of({"kv_buffer_size": 1})
    with pytest.raises(ValueError, match="one connector"):
        KVTransferConfig(kv_connector="NixlConnector")


@pytest.mark.parametrize("transport", ["shm", "zmq"])
def test_blocks_round_trip(transport):
    extra = {"transport": transport, "timeout_s": 0.3}
    secret = os.urandom(32)
    producer = Connector(KVTransferConfig(kv_role="kv_producer", kv_connector_extra_config=extra), secret)
    consumer = Connector(KVTransferConfig(kv_role="kv_consumer", kv_connector_extra_config=extra), secret)
    src = [torch.randn(10, 4, 2, 8), torch.randn(10, 4, 2, 8).half()]
    dst = [torch.zeros_like(t) for t in src]
    try:
        handle = producer.send(src, [7, 2, 5], consumer.address)
        assert handle.num_bytes == 3 * (4 * 2 * 8 * 4 + 4 * 2 * 8 * 2)
        consumer.receive(dst, [0, 1, 9], handle)
        for s, d in zip(src, dst):
            assert torch.equal(d[[0, 1, 9]], s[[7, 2, 5]]) and not d[3].any()
        if transport == "shm":  # the consumer unlinked the segment; discarding it again is harmless
            discard(handle)
        else:
            with pytest.raises(TransferError, match="no bytes"):
                consumer.receive(dst, [0], TransferHandle("never-sent", "zmq", 8))
    finally:
        producer.close()
        consumer.close()


def test_zmq_consumer_takes_only_its_engines_transfers_from_a_hostile_local_sender():
    """Issue 38: any local process can connect to a consumer's port. Its junk (short non-UTF-8 frames, a message
    of the right shape without a valid MAC, one with a MAC under another key, a malformed one) is dropped and
    counted, a message over the size cap never reaches the consumer (MAXMSGSIZE), and real transfers still land,
    a stale one (its request failed) skipped."""
    import zmq

    from kvscope.pd.connector import MAGIC

    extra = {"transport": "zmq", "timeout_s": 1.0}
    secret = os.urandom(32)
    with pytest.raises(ValueError, match="shared secret"):
        Connector(KVTransferConfig(kv_role="kv_consumer", kv_connector_extra_config=extra))
    producer = Connector(KVTransferConfig(kv_role="kv_producer", kv_connector_extra_config=extra), secret)
    consumer = Connector(KVTransferConfig(kv_role="kv_consumer", kv_connector_extra_config=extra), secret,
                         max_message_bytes=64 * 1024)
    src = [torch.randn(6, 4, 2, 8)]
    dst = [torch.zeros_like(src[0])]
    ctx = zmq.Context()
    hostile = ctx.socket(zmq.PUSH)
    hostile.setsockopt(zmq.LINGER, 1000)
    hostile.connect(consumer.address)
    try:
        tid = b"0123456789abcdef"
        for _ in range(50):
            hostile.send(b"\xff\xfe")
        hostile.send_multipart([MAGIC, tid, b"x" * 32, b"y" * 512])  # the right shape, no valid MAC
        wrong = hmac.new(os.urandom(32), tid + b"z" * 512, hashlib.sha256).digest()
        hostile.send_multipart([MAGIC, tid, wrong, b"z" * 512])  # a MAC under another key
        hostile.send_multipart([MAGIC, tid, b"", b"", b"extra"])  # malformed
        hostile.send(b"j" * (1 << 20))  # over the cap: ZMQ drops it (and the sender) unread
        with pytest.raises(TransferError, match="53 messages dropped"):  # waits out timeout_s: all of it came
            consumer.receive(dst, [0], TransferHandle(tid.decode(), "zmq", 512))
        stale = producer.send(src, [0], consumer.address)  # nobody will read it
        real = producer.send(src, [3, 5], consumer.address)
        consumer.receive(dst, [0, 1], real)
        assert torch.equal(dst[0][[0, 1]], src[0][[3, 5]])
        assert consumer.dropped == 54 and stale.transfer_id != real.transfer_id
    finally:
        hostile.close()
        ctx.term()
        producer.close()
        consumer.close()


def test_summary_and_track_of_a_handmade_meta():
    pd = {"layout": "1P1D", "instances": [{"name": "decode-0", "summary": {"itl_p50_s": 0.01, "ttft_p50_s": None}}],
          "transfers": [{"request_id": "a", "src": "prefill-0", "dst": "decode-0", "num_blocks": 2,
                         "num_bytes": 2_000_000, "start_ns": 0, "end_ns": 1_000_000, "ok": True},
                        {"request_id": "b", "src": "prefill-0", "dst": "decode-0", "num_blocks": 0, "num_bytes": 0,
                         "start_ns": 5, "end_ns": 9, "ok": False, "error": "refused"}]}
    s = pd_summary(pd)
    assert (s["kv_transfers"], s["kv_transfer_failures"], s["kv_transfer_bytes"]) == (1, 1, 2_000_000)
    assert s["kv_transfer_mb_per_s"] == pytest.approx(2000.0)
    assert s["decode-0_itl_p50_s"] == 0.01 and math.isnan(s["decode-0_ttft_p50_s"])
    [(name, tracks, spans)] = transfer_lane(pd)
    assert name == "KV transfers" and len(spans) == 2 and "FAILED: refused" in spans[1][0]
    assert max(v["MB"] for _, v in tracks["KV in flight (MB)"]) == 2.0


def test_engine_pd_says_to_use_pdengine():
    """kvscope.engine never imports kvscope.pd (a layer above): Engine(pd=...) names the class to use instead,
    before loading anything."""
    from kvscope.engine.engine import Engine

    with pytest.raises(TypeError, match=r"kvscope.PDEngine\(model, pd='1P1D'\)"):
        Engine("tiny", pd="1P1D")


@pytest.mark.parametrize("timeout", ["soon", -1, 0, float("nan"), float("inf"), True, 10**9])
def test_kv_transfer_timeout_must_be_a_positive_number_of_seconds(timeout):
    """Issue 38: "soon" and -1 were accepted (a negative wait never ends)."""
    with pytest.raises(ValueError, match=r"timeout_s.*must be a number of seconds"):
        KVTransferConfig.of({"kv_connector_extra_config": {"transport": "zmq", "timeout_s": timeout}})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['timeout'\]"):
        KVTransferConfig.of({"kv_connector_extra_config": {"timeout": 5}})


def test_a_bad_kv_ip_or_a_port_in_use_is_refused_before_any_process_starts():
    """Issue 38: these failed only after 13-16 s of start-up; now in well under a second, naming the address."""
    import socket
    import time

    from kvscope import PDEngine

    with pytest.raises(ValueError, match="kv_ip='localhost:5' must be an IP address"):
        KVTransferConfig(kv_ip="localhost:5")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for config, why in (({"kv_port": port}, f"cannot bind 127.0.0.1:{port}"),
                            ({"kv_ip": "192.0.2.1"}, "cannot bind 192.0.2.1:0")):  # TEST-NET-1: not this machine
            t0 = time.monotonic()
            with pytest.raises(ValueError, match=why):
                PDEngine("tiny", pd="1P1D", kv_transfer_config={
                    **config, "kv_connector_extra_config": {"transport": "zmq"}})
            assert time.monotonic() - t0 < 2.0


def test_a_layout_beyond_what_the_machine_holds_is_refused():
    """Issue 38: --pd 16P16D on 2 cores started 32 interpreters of ~0.5 GB each. The rule: at most 4 instances
    per usable core and 0.5 GiB each within the memory available; more instances than cores: a warning."""
    from kvscope import PDEngine

    with pytest.raises(ValueError, match=r"32 instance processes on 2 usable core\(s\).*at most 8"):
        PDLayout(16, 16).check_fits(cores=2, available_bytes=2**40)
    with pytest.raises(ValueError, match=r"at least 2.0 GiB.*0.5 GiB is available"):
        PDLayout(2, 2).check_fits(cores=8, available_bytes=2**29)
    assert PDLayout(1, 1).check_fits(cores=2, available_bytes=2**31) is None
    assert "3 instance processes share 2 core(s)" in PDLayout(1, 2).check_fits(cores=2, available_bytes=2**40)
    cores = len(os.sched_getaffinity(0))
    if 4 * cores < 32:
        with pytest.raises(ValueError, match="instance processes"):
            PDEngine("tiny", pd="16P16D")
