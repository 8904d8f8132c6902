"""What this machine can give a run: the memory available now (``available_memory``) and the check that a
CPU KV cache fits in it (``check_kv_fits``), so a budget beyond the RAM is refused with the numbers before
anything is allocated, not ended by the kernel's OOM killer mid-run.

Available memory is the smaller of the system's (``psutil``: MemAvailable, what can be had without
swapping) and what the process's cgroup still allows (a container's limit: cgroup v2 ``memory.max`` or v1
``memory.limit_in_bytes``, minus the usage the kernel cannot reclaim). Standard library and psutil only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvscope.utils.units import fmt_bytes

CGROUP_ROOT = Path("/sys/fs/cgroup")
KV_SHARE = 0.9  # of the available memory a CPU KV cache may take: the rest is for activations and the rest


@dataclass(slots=True, frozen=True)
class AvailableMemory:
    bytes: int
    source: str  # where the figure comes from, for messages

    def __str__(self) -> str:
        return f"{fmt_bytes(self.bytes)} available ({self.source})"


def available_memory(cgroup_root: Path = CGROUP_ROOT) -> AvailableMemory:
    """The memory this process can still get: the system's available memory or its cgroup's headroom,
    whichever is smaller."""
    import psutil

    best = AvailableMemory(int(psutil.virtual_memory().available), "the system's available memory")
    headroom = cgroup_headroom(cgroup_root)
    if headroom is not None and headroom < best.bytes:
        best = AvailableMemory(headroom, "the memory limit of this process's cgroup (container)")
    return best


def cgroup_headroom(root: Path = CGROUP_ROOT) -> int | None:
    """The cgroup's limit minus its unreclaimable usage (usage less inactive page cache), or ``None`` when no
    limit is set or none can be read. cgroup v2 first, then v1; the process's own group, else the mount's root
    (inside a container the root is the container's group)."""
    for limit_name, usage_name, cache_key in (("memory.max", "memory.current", "inactive_file"),
                                              ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                               "total_inactive_file")):
        for folder in _groups(root, v1=limit_name.endswith("_bytes")):
            limit = _read_int(folder / limit_name)
            if limit is None:
                continue
            if limit >= 1 << 60:  # "max", or v1's "no limit" (a page-aligned 2**63 - 1)
                return None
            usage = _read_int(folder / usage_name) or 0
            cache = _stat(folder / "memory.stat").get(cache_key, 0)
            return max(0, limit - max(0, usage - cache))
    return None


def _groups(root: Path, *, v1: bool) -> list[Path]:
    """The folders that may hold this process's memory controller files: its group's, then the root's."""
    base = root / "memory" if v1 else root
    found = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, group = line.split(":", 2)
            if (v1 and "memory" in controllers.split(",")) or (not v1 and controllers == ""):
                found.append(base / group.lstrip("/"))
    except (OSError, ValueError):
        pass
    return [*found, base]


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return 1 << 62
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def check_kv_fits(num_blocks: int, bytes_per_block: int, source: str,
                  available: AvailableMemory | None = None) -> None:
    """Refuse a CPU KV cache of ``num_blocks`` x ``bytes_per_block`` that takes more than ``KV_SHARE`` of the
    available memory (``source``: where the size came from, "kv_cache_memory=64GiB"), with the numbers and
    the fix, before it is allocated."""
    need = num_blocks * bytes_per_block
    available = available or available_memory()
    allowed = int(available.bytes * KV_SHARE)
    if need <= allowed:
        return
    fits = allowed // bytes_per_block
    raise ValueError(
        f"the KV cache ({source}: {num_blocks:,} blocks x {fmt_bytes(bytes_per_block)} = {fmt_bytes(need)}) "
        f"does not fit in this machine's memory: {available}, of which the KV cache may take "
        f"{KV_SHARE:.0%} ({fmt_bytes(allowed)}); give kv_cache_memory / --kv-memory of at most "
        f"{fmt_bytes(allowed)} or num_blocks / --num-blocks of at most {fits:,}"
    )
