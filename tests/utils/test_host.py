"""kvscope.utils.host: the memory this process can still get (system, cgroup v1 / v2) and the CPU KV cache check."""

from __future__ import annotations

import pytest

from kvscope.utils import host
from kvscope.utils.host import AvailableMemory, available_memory, cgroup_headroom, check_kv_fits

GiB = 1 << 30


def fake_cgroup(root, v1: bool, limit: str, usage: int, inactive: int):
    folder = root / "memory" if v1 else root
    folder.mkdir(parents=True, exist_ok=True)
    names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file") if v1 else \
        ("memory.max", "memory.current", "inactive_file")
    (folder / names[0]).write_text(limit + "\n")
    (folder / names[1]).write_text(f"{usage}\n")
    (folder / "memory.stat").write_text(f"anon 5\n{names[2]} {inactive}\nactive_file 7\n")
    return root


@pytest.mark.parametrize("v1", [False, True], ids=["cgroup-v2", "cgroup-v1"])
def test_cgroup_headroom_is_the_limit_less_what_cannot_be_reclaimed(tmp_path, v1):
    root = fake_cgroup(tmp_path, v1, str(4 * GiB), usage=3 * GiB, inactive=1 * GiB)
    assert cgroup_headroom(root) == 2 * GiB  # 4 GiB - (3 GiB used - 1 GiB of page cache the kernel can drop)


@pytest.mark.parametrize("limit, v1", [("max", False), ("9223372036854771712", True)], ids=["v2-max", "v1-none"])
def test_no_cgroup_limit(tmp_path, limit, v1):
    assert cgroup_headroom(fake_cgroup(tmp_path, v1, limit, usage=GiB, inactive=0)) is None
    assert cgroup_headroom(tmp_path / "nothing-here") is None


def test_available_memory_is_the_smaller_of_system_and_cgroup(tmp_path):
    system = available_memory(tmp_path / "none")
    assert system.bytes > 0 and "system" in system.source
    tight = available_memory(fake_cgroup(tmp_path, False, str(GiB), usage=0, inactive=0))
    assert tight.bytes == min(GiB, system.bytes)
    assert "cgroup" in tight.source or tight.bytes == system.bytes


def test_check_kv_fits_refuses_with_the_numbers_and_the_fix():
    memory = AvailableMemory(10 * GiB, "the system's available memory")
    check_kv_fits(9 * 1024, 1 << 20, "num_blocks=9216", memory)  # 9 GiB: within 90 %
    with pytest.raises(ValueError) as caught:
        check_kv_fits(64 * 1024, 1 << 20, "kv_cache_memory=68719476736", memory)
    message = str(caught.value)
    for part in ("kv_cache_memory=68719476736: 65,536 blocks x 1 MiB = 64 GiB", "10 GiB available",
                 "90% (9 GiB)", "--kv-memory of at most 9 GiB", "--num-blocks of at most 9,216"):
        assert part in message, (part, message)
    assert host.KV_SHARE == 0.9
