"""Memory readings (``MemoryProbe``): device memory through NVML, the torch CUDA allocator, the KV pool,
weights, host RSS.

``MemoryProbe.sample()`` returns a dict with these keys (bytes unless named otherwise):

- always: ``kv_pool_bytes`` (the KV tensors), ``weights_bytes`` (parameters and buffers), both as the
  source gave them, and ``sampled_ns`` (``perf_counter_ns`` of the reading);
- ``host_rss_bytes``: the process's resident set (psutil);
- CUDA devices only: ``torch_allocated_bytes``, ``torch_reserved_bytes`` (the caching allocator);
- CUDA devices with NVML: ``device_used_bytes``, ``device_total_bytes`` and, where the driver has the
  v2 memory struct, ``device_reserved_bytes`` (v2's ``used`` excludes driver-reserved memory; v1's
  includes it); ``gpu_util_pct`` and ``gpu_mem_util_pct`` (NVML utilisation rates over the driver's
  last sample period).

A key that cannot be read is **absent**, never 0, and no probe ever raises. Readings are throttled:
within ``interval_s`` of the last reading the same dict object is returned again (its
``sampled_ns`` tells how old it is), so a step costs a clock read; consumers must not mutate it.
"""

from __future__ import annotations

import time
from typing import Any

import torch

try:
    import psutil
except ImportError:  # pragma: no cover - psutil is a dependency, but stay usable without it
    psutil = None


class NvmlReader:
    """Device memory and utilisation of one GPU via nvidia-ml-py; ``status`` says what works or why not."""

    def __init__(self, device: torch.device) -> None:
        self.handle = None
        self.v2 = False
        self.status = "not initialised"
        try:
            import pynvml
        except ImportError:
            self.status = "unavailable: nvidia-ml-py is not installed"
            return
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            self.handle = self._handle(pynvml, device)
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... : no NVML here
            self.status = f"unavailable: {exc}"
            self.handle = None
            return
        try:
            pynvml.nvmlDeviceGetMemoryInfo(self.handle, version=pynvml.nvmlMemory_v2)
            self.v2 = True
        except Exception:  # old driver or library: no nvmlDeviceGetMemoryInfo_v2
            self.v2 = False
        self.status = f"ok (memory {'v2' if self.v2 else 'v1'})"

    @staticmethod
    def _handle(pynvml, device: torch.device):
        """NVML numbers GPUs by PCI order, CUDA by CUDA_VISIBLE_DEVICES: match them by UUID."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            return pynvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            )
        except Exception:
            return pynvml.nvmlDeviceGetHandleByIndex(index)

    def read(self, out: dict[str, Any]) -> None:
        if self.handle is None:
            return
        nvml = self.nvml
        try:
            if self.v2:
                mem = nvml.nvmlDeviceGetMemoryInfo(self.handle, version=nvml.nvmlMemory_v2)
                out["device_reserved_bytes"] = int(mem.reserved)
            else:
                mem = nvml.nvmlDeviceGetMemoryInfo(self.handle)
            out["device_used_bytes"] = int(mem.used)
            out["device_total_bytes"] = int(mem.total)
        except Exception as exc:
            self.status, self.handle = f"failed: {exc}", None
            return
        try:
            util = nvml.nvmlDeviceGetUtilizationRates(self.handle)
            out["gpu_util_pct"] = int(util.gpu)
            out["gpu_mem_util_pct"] = int(util.memory)
        except Exception:  # some devices (MIG slices) do not report utilisation
            pass


class MemoryProbe:
    """Readings for a source on ``device`` whose KV pool and weights take the given bytes (plain
    numbers, read once: ``refresh_static`` changes them)."""

    def __init__(
        self,
        device: torch.device | str,
        weights_bytes: int,
        kv_pool_bytes: int,
        interval_s: float = 0.05,
        use_nvml: bool = True,
    ) -> None:
        self.device = torch.device(device)
        self.interval_ns = int(interval_s * 1e9)
        self.static = {"kv_pool_bytes": int(kv_pool_bytes), "weights_bytes": int(weights_bytes)}
        self.process = _process()
        self.cuda = self.device.type == "cuda"
        # torch.cuda.memory_allocated answers 0 where CUDA is absent: ask only where it is real.
        self.allocator = self.cuda and torch.cuda.is_available()
        self.nvml = NvmlReader(self.device) if self.cuda and use_nvml else None
        self.last: dict[str, Any] | None = None

    @property
    def nvml_status(self) -> str:
        return self.nvml.status if self.nvml is not None else "unavailable: the engine does not run on CUDA"

    def refresh_static(self, kv_pool_bytes: int | None = None, weights_bytes: int | None = None) -> None:
        """New KV pool and weight sizes (after the source reallocated its cache or reloaded weights)."""
        if kv_pool_bytes is not None:
            self.static["kv_pool_bytes"] = int(kv_pool_bytes)
        if weights_bytes is not None:
            self.static["weights_bytes"] = int(weights_bytes)
        self.last = None

    def sample(self, now_ns: int | None = None) -> dict[str, Any]:
        now = time.perf_counter_ns() if now_ns is None else now_ns
        last = self.last
        if last is not None and now - last["sampled_ns"] < self.interval_ns:
            return last
        out: dict[str, Any] = dict(self.static)
        if self.process is not None:
            try:
                out["host_rss_bytes"] = int(self.process.memory_info().rss)
            except Exception:
                self.process = None
        if self.allocator:
            try:
                out["torch_allocated_bytes"] = int(torch.cuda.memory_allocated(self.device))
                out["torch_reserved_bytes"] = int(torch.cuda.memory_reserved(self.device))
            except Exception:
                pass
        if self.nvml is not None:
            self.nvml.read(out)
        out["sampled_ns"] = now
        self.last = out
        return out


def _process():
    if psutil is None:
        return None
    try:
        return psutil.Process()
    except Exception:
        return None
