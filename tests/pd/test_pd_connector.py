"""The connector without instances: the layout and config parsing (vLLM's names), the blocks' bytes round trip
over each transport, the summary and the transfer track of a hand-made meta (no processes)."""

import math

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
    producer = Connector(KVTransferConfig(kv_role="kv_producer", kv_connector_extra_config=extra))
    consumer = Connector(KVTransferConfig(kv_role="kv_consumer", kv_connector_extra_config=extra))
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
