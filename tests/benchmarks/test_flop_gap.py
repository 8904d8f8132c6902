"""benchmarks/flop_gap.py: the split of a run's time into the ideal (every FLOP at the GEMM peak) and each
category's excess, the row interpolation of GEMM times, and (slow) the script itself on its ``--quick`` workload."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from flop_gap import gap_split, interp  # noqa: E402
from flops import WorkloadFlops  # noqa: E402


def test_gap_split_adds_up_and_charges_only_the_excess():
    work = WorkloadFlops(linear=60e9, head=20e9, attention=10e9)  # 90 GFLOP
    peak = 90e9  # ideal: 1 s, of which GEMMs 80/90 s and attention 10/90 s
    ops = {"gemm": 2.0, "attention": 0.5, "elementwise": 0.4, "copies / gathers": 0.1, "sampling": 0.05,
           "other": 0.05}  # 3.1 s of ops in a 4 s profiled run
    ideal, parts = gap_split(work, peak, wall_s=2.0, profiled_wall_s=4.0, op_seconds=ops)  # scale 0.5
    assert ideal == pytest.approx(1.0)
    by = {p.name.split(" ")[0]: p.seconds for p in parts}
    assert by["GEMMs"] == pytest.approx(0.5 * 2.0 - 80 / 90)
    assert by["attention"] == pytest.approx(0.5 * 0.5 - 10 / 90)
    assert by["elementwise"] == pytest.approx(0.2)
    assert by["no"] == pytest.approx(0.5 * (4.0 - 3.1))  # the profiled wall no op covers, scaled
    assert sum(p.seconds for p in parts) == pytest.approx(2.0 - ideal)  # the parts are the gap, exactly
    assert "at 80.0 GFLOP/s = 89% of peak" in parts[0].note  # 80 GFLOP of GEMMs in their 1.0 s (scaled)


def test_gap_split_refuses_bad_input():
    work = WorkloadFlops(1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        gap_split(work, 1.0, 0.0, 1.0, {})
    with pytest.raises(ValueError, match=r"unknown categories.*category"):
        gap_split(work, 1.0, 1.0, 1.0, {"gemms": 1.0})


def test_interp_between_and_past_the_measured_rows():
    times = {1: 1.0, 8: 2.0, 32: 8.0}
    assert interp(times, 0) == 0.0
    assert interp(times, 1) == 1.0
    assert interp(times, 20) == pytest.approx(5.0)  # halfway from 8 to 32
    assert interp(times, 64) == pytest.approx(16.0)  # proportional past the last
    assert interp(times, 8) == 2.0


@pytest.mark.slow
def test_flop_gap_quick():
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flop_gap.py"), "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert re.search(r"same tokens: True", text), text
    shares = [int(s) for s in re.findall(r"^\| [^|]+ \| -?[0-9.]+ \| (-?\d+)% \|", text, re.M)]
    assert len(shares) == 7 and 98 <= sum(shares) <= 102, text  # the parts split the gap
    assert re.search(r"^kvscope per step \(unprofiled, \d+ steps\), s: schedule [0-9.]+", text, re.M), text
    assert re.search(r"^REACHABLE end-to-end FLOP rate .* = [0-9.]+ GFLOP/s = \d+% of the square GEMM peak$",
                     text, re.M), text
