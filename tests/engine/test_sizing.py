import pytest
import torch

from kvscope import Engine
from kvscope.engine.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from kvscope.engine.sizing import resolve_dtype, resolve_num_blocks

TINY_BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * 16  # K and V x layers x kv heads x head dim x fp32 x block of 16


def test_dtype_names_and_auto():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype("auto", cpu) is torch.float32 and resolve_dtype(None, cuda) is torch.bfloat16
    assert resolve_dtype("fp16", cpu) is torch.float16 and resolve_dtype(torch.bfloat16, cpu) is torch.bfloat16
    with pytest.raises(ValueError, match="must be one of float32, float16, bfloat16 or auto"):
        resolve_dtype("int8", cpu)


def test_kv_sizing_from_byte_budget():
    engine = Engine("tiny", block_size=16, kv_cache_memory=1 << 20)
    assert engine.pool.num_blocks == (1 << 20) // TINY_BLOCK_BYTES
    assert engine.runner.kv_cache_bytes == engine.pool.num_blocks * TINY_BLOCK_BYTES
    assert engine.runner.kv_caches[0][0].shape == (engine.pool.num_blocks, 16, 2, 16)
    assert torch.equal(engine.runner.kv_caches[0][0], torch.zeros_like(engine.runner.kv_caches[0][0]))


def test_cpu_default_holds_max_num_seqs_full_sequences_up_to_a_cap():
    engine = Engine("tiny", block_size=16, max_model_len=100, max_num_seqs=3)
    assert engine.pool.num_blocks == 3 * 7  # ceil(100 / 16) blocks for each of 3 sequences
    config = EngineConfig(block_size=16, max_num_seqs=10**6)
    capped = resolve_num_blocks(config, engine.spec, engine.runner, max_model_len=100)
    assert capped == DEFAULT_CPU_KV_BYTES // TINY_BLOCK_BYTES


def test_a_budget_below_one_block_names_the_fix():
    engine = Engine("tiny", block_size=16, num_blocks=4)
    config = EngineConfig(block_size=16, kv_cache_memory=TINY_BLOCK_BYTES - 1)
    with pytest.raises(ValueError, match=r"cannot hold one block.*give more memory or num_blocks"):
        resolve_num_blocks(config, engine.spec, engine.runner, max_model_len=64)
    assert resolve_num_blocks(EngineConfig(block_size=16, num_blocks=5), engine.spec, engine.runner, 64) == 5


def test_max_model_len_is_the_models_positions_whatever_its_window():
    from types import SimpleNamespace

    from kvscope.engine.config import ModelSpec, max_positions
    from kvscope.engine.sizing import resolve_max_model_len

    spec = ModelSpec(2, 2, 16, 4, max_model_len=4096)
    assert resolve_max_model_len(EngineConfig(), spec) == 4096  # a sliding window no longer caps it
    assert resolve_max_model_len(EngineConfig(max_model_len=1000), spec) == 1000
    with pytest.raises(ValueError, match="exceeds what the model supports"):
        resolve_max_model_len(EngineConfig(max_model_len=5000), spec)
    # the positions limit under its other names; none usable (XLNet's -1): 2048
    assert max_positions(SimpleNamespace(n_positions=1024)) == 1024
    assert max_positions(SimpleNamespace(max_position_embeddings=-1)) == 2048
