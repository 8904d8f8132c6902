"""The machine's limits: on the CPU a KV cache beyond the memory the machine can give (``kvscope.utils.host``) is
refused with the numbers and the fix before it is allocated, by the engine, ``kvscope run`` and ``%kvscope``,
instead of the kernel's OOM killer ending the process mid-run with no message."""

from __future__ import annotations

import subprocess
import sys

import pytest
from IPython.core.error import UsageError
from reliability_util import FIGURES

from kvscope import Engine
from kvscope.engine.worker.model_runner import ModelRunner
from kvscope.utils import host
from kvscope.utils.host import AvailableMemory

pytestmark = pytest.mark.timeout(180)
MiB = 1 << 20


@pytest.fixture
def small_machine(monkeypatch) -> list[int]:
    """A machine with 16 MiB available; returns the block counts the KV cache was allocated with."""
    monkeypatch.setattr(host, "available_memory", lambda *a: AvailableMemory(16 * MiB, "the test's machine"))
    allocated: list[int] = []
    real = ModelRunner.allocate_kv

    def allocate_kv(self, num_blocks):
        allocated.append(num_blocks)
        return real(self, num_blocks)

    monkeypatch.setattr(ModelRunner, "allocate_kv", allocate_kv)
    return allocated


@pytest.mark.parametrize("kwargs, source", [(dict(kv_cache_memory=64 * MiB), "kv_cache_memory=67108864"),
                                            (dict(num_blocks=100_000), "num_blocks=100000")])
def test_a_kv_cache_beyond_the_memory_is_refused_before_it_is_allocated(small_machine, kwargs, source):
    with pytest.raises(ValueError) as caught:
        Engine("tiny", block_size=16, **kwargs)
    FIGURES["KV budgets beyond the memory refused"] += 1
    message = str(caught.value)
    assert message.startswith(f"the KV cache ({source}: ") and "does not fit in this machine's memory" in message
    assert "16 MiB available (the test's machine)" in message and "--num-blocks of at most" in message
    assert max(small_machine, default=0) <= 1, small_machine  # the big pool was never allocated


def test_a_kv_cache_that_fits_is_allocated(small_machine):
    engine = Engine("tiny", block_size=16, kv_cache_memory=4 * MiB)
    assert small_machine[-1] == engine.pool.num_blocks > 1


def test_kvscope_run_refuses_more_kv_memory_than_the_machine_has(tmp_path):
    """For real: 1000 TiB is more than any machine this runs on (a pool that would not even be allocated
    outright; a budget just above the RAM would be, and the OOM killer would end the run later)."""
    proc = subprocess.run([sys.executable, "-m", "kvscope.cli.main", "run", "--kv-memory", "1000TiB", "--requests", "2",
                           "--out", str(tmp_path / "run"), "-q"], capture_output=True, text=True, timeout=170)
    FIGURES["KV budgets beyond the memory refused"] += 1
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("kvscope: error: the KV cache (kv_cache_memory=1099511627776000: "), lines[0]
    assert "available" in lines[0] and "--kv-memory of at most" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_the_magic_refuses_it_in_one_line(ip, small_machine):
    with pytest.raises(UsageError, match=r"^the KV cache \(kv_cache_memory=67108864: .* does not fit"):
        ip.run_line_magic("kvscope", "--kv-memory 64MiB --requests 2 --wait -q")
