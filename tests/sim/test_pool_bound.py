"""A simulation's pool is bounded (issue 38 item 3): no option makes the simulator hold more than
``MAX_SIM_BLOCKS`` block objects, and a GPU's pool with the toy model is refused with the fix, before
anything runs or is written."""

from __future__ import annotations

import pytest

from kvscope.cli.main import main
from kvscope.engine.config import EngineConfig
from kvscope.sim.build import MAX_SIM_BLOCKS, pool_blocks
from kvscope.sim.shape import resolve_shape


def test_pool_blocks_refuses_past_the_bound_and_says_why():
    shape = resolve_shape("tiny", None)
    assert pool_blocks(EngineConfig(num_blocks=MAX_SIM_BLOCKS), shape) == MAX_SIM_BLOCKS
    with pytest.raises(ValueError, match=r"1,000,000,000,000 blocks \(--num-blocks.*at most 1,048,576 blocks"):
        pool_blocks(EngineConfig(num_blocks=10**12), shape)
    with pytest.raises(ValueError, match="the KV memory given"):
        pool_blocks(EngineConfig(kv_cache_memory=2**40), shape)


@pytest.mark.parametrize("args, message", [
    (["--gpu", "h100"], "tiny is a toy of 256 bytes per token: give the model the pool is for"),
    (["--gpu", "h200", "--model", "llama-7b", "--num-blocks", "1000000000000"], "at most 1,048,576 blocks"),
])
def test_simulate_refuses_a_pool_past_the_bound_before_writing(tmp_path, capsys, args, message):
    rc = main(["simulate", *args, "-n", "16", "--out", str(tmp_path / "x"), "-q"])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_sweep_refuses_a_value_past_the_bound_before_any_run(tmp_path, capsys):
    rc = main(["sweep", "--simulate", "--gpu", "h100", "--model", "llama-7b", "--num-blocks", "64,1000000000000",
               "-n", "4", "-o", str(tmp_path / "s.html"), "-q"])
    assert rc == 2
    assert "--num-blocks 1000000000000: a pool of 1,000,000,000,000 blocks" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
