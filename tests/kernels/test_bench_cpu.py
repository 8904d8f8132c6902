"""``python benchmarks/kernel_times.py`` on a machine without CUDA says so and exits 0; its code paths run end
to end through Triton's interpreter (in this process) with the hidden ``--cpu-dry-run`` (tiny shapes,
timings meaningless)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_times.py"


def run(*args: str, interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_without_a_gpu_it_says_so_and_exits_0():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "no CUDA GPU" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run needs the interpreter (CPU-only machines)")
def test_cpu_dry_run_exercises_every_table(capsys):
    spec = importlib.util.spec_from_file_location("kernels_benchmark", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--cpu-dry-run", "--peak-gbs", "100"]) == 0
    printed = capsys.readouterr().out
    assert "decode attention" in printed and "store_kv" in printed
    assert " ok" in printed.split("decode attention")[1] and "MISMATCH" not in printed
    assert (
        bench.peak_gbs("NVIDIA H100 80GB HBM3", None) == 3350
        and bench.peak_gbs("NVIDIA H100 PCIe", None) == 2000
    )
