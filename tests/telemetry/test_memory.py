"""Memory readings (``telemetry/memory.py``): real readings where they exist, absent keys (never zeros,
never exceptions) elsewhere."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch
from telemetry_util import PROMPT_A, greedy

from kvscope.engine.source import weights_bytes
from kvscope.telemetry.memory import MemoryProbe, NvmlReader

DEVICE_KEYS = {
    "device_used_bytes",
    "device_total_bytes",
    "device_reserved_bytes",
    "gpu_util_pct",
    "gpu_mem_util_pct",
    "torch_allocated_bytes",
    "torch_reserved_bytes",
}


def test_cpu_engine_reads_what_exists_and_nothing_else(engine):
    engine.generate([PROMPT_A], greedy(2))
    memory = engine.recorder.steps[-1].memory
    assert set(memory) == {"kv_pool_bytes", "weights_bytes", "host_rss_bytes", "sampled_ns"}
    assert memory["kv_pool_bytes"] == engine.runner.kv_cache_bytes == 2 * 2 * 64 * 4 * 2 * 16 * 4
    assert memory["weights_bytes"] == sum(p.numel() * 4 for p in engine.model.parameters()) + sum(
        b.numel() * b.element_size() for b in engine.model.buffers()
    )
    assert memory["host_rss_bytes"] > 50 * 2**20
    assert "unavailable" in engine.recorder.memory.nvml_status


def test_no_nvml_library_means_absent_fields():
    reader = NvmlReader(torch.device("cuda", 0))  # this machine has no NVIDIA driver
    if reader.handle is not None:
        pytest.skip("this machine has NVML")
    assert reader.status.startswith("unavailable")
    out: dict = {}
    reader.read(out)
    assert out == {}


class FakeNVMLError(Exception):
    pass


def fake_nvml(v2: bool = True, fail_memory: bool = False) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.nvmlMemory_v2 = 0x02000028
    m.nvmlInit = lambda: None

    def by_uuid(uuid):
        raise FakeNVMLError("Not Found")

    def memory(handle, version=None):
        if fail_memory:
            raise FakeNVMLError("GPU is lost")
        if version is not None:
            if not v2:
                raise FakeNVMLError("Function Not Found")
            assert version == m.nvmlMemory_v2
            return SimpleNamespace(total=80 * 2**30, used=10 * 2**30, reserved=2**29, free=0)
        return SimpleNamespace(total=80 * 2**30, used=10 * 2**30 + 2**29, free=0)

    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"
    m.nvmlDeviceGetMemoryInfo = memory
    m.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=37, memory=12)
    return m


def cuda_probe() -> MemoryProbe:
    """A probe as a CUDA engine makes it: plain numbers for its KV pool and weights."""
    return MemoryProbe(torch.device("cuda", 0), weights_bytes(torch.nn.Linear(4, 4)), kv_pool_bytes=4096)


@pytest.mark.parametrize("v2", [True, False])
def test_nvml_memory_v2_with_v1_fallback(monkeypatch, v2):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(v2=v2))
    probe = cuda_probe()
    assert probe.nvml_status == f"ok (memory {'v2' if v2 else 'v1'})"
    m = probe.sample()
    assert m["device_total_bytes"] == 80 * 2**30
    assert (m["device_used_bytes"], "device_reserved_bytes" in m) == (
        (10 * 2**30, True) if v2 else (10 * 2**30 + 2**29, False)
    )
    assert (m["gpu_util_pct"], m["gpu_mem_util_pct"]) == (37, 12)
    assert m["kv_pool_bytes"] == 4096 and m["weights_bytes"] == (16 + 4) * 4  # Linear(4, 4): weight + bias
    # torch.cuda cannot be read on a CPU-only torch: those keys are absent, not 0
    assert ("torch_allocated_bytes" in m) == torch.cuda.is_available()


def test_nvml_failing_mid_run_drops_its_fields_without_raising(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail_memory=True))
    probe = cuda_probe()
    m = probe.sample()
    assert not DEVICE_KEYS & set(m) and m["kv_pool_bytes"] == 4096
    assert probe.nvml_status.startswith("failed")


def test_readings_are_throttled():
    probe = MemoryProbe("cpu", weights_bytes=1, kv_pool_bytes=1, interval_s=0.05)
    first = probe.sample(now_ns=1_000_000_000)
    assert probe.sample(now_ns=1_040_000_000) is first  # within 50 ms: the same reading
    later = probe.sample(now_ns=1_060_000_000)
    assert later is not first and later["sampled_ns"] == 1_060_000_000



def test_refresh_static_takes_new_sizes():
    probe = MemoryProbe("cpu", weights_bytes=10, kv_pool_bytes=20)
    first = probe.sample(now_ns=1)
    probe.refresh_static(kv_pool_bytes=30)
    again = probe.sample(now_ns=2)  # within the interval, yet a new reading: the sizes changed
    assert again is not first and (again["kv_pool_bytes"], again["weights_bytes"]) == (30, 10)
