"""vLLM's rules for prompts sent one after another: whole blocks, the last prompt token recomputed, outputs
cached."""

from __future__ import annotations

from kvscope.explain.sharing import predict_vllm

BS = 32


def p(start: int, n: int) -> list[int]:
    return [3 + (start + i) % 509 for i in range(n)]


def test_shared_system_prompt():
    system = p(0, 64)
    prompts = [system + p(100, 33), system + p(200, 33), system + p(300, 20)]
    out = predict_vllm(prompts, BS)
    assert out.hits == [0, 64, 64]
    assert (out.prefix_cache_queries, out.prefix_cache_hits) == (97 + 97 + 84, 128)


def test_duplicates_never_hit_the_block_of_the_last_token():
    prompt = p(0, 96)  # three whole blocks; the third holds the last token
    out = predict_vllm([prompt, prompt, prompt], BS)
    assert out.hits == [0, 64, 64]
    longer = p(0, 97)
    assert predict_vllm([longer, longer], BS).hits == [0, 96]


def test_timestamp_in_the_system_prompt_breaks_the_chain_at_its_block():
    head = p(0, 40)
    prompts = [[*head, 500 + i, *p(41, 60)] for i in range(3)]  # differ at token 40: in block 1
    assert predict_vllm(prompts, BS).hits == [0, 32, 32]


def test_outputs_are_cached_too():
    first, out1 = p(0, 40), p(40, 30)  # 70 tokens, the last one never computed: 69 -> two whole blocks
    follow = first + out1 + p(900, 10)
    assert predict_vllm([first, follow], BS).hits == [0, 32]
    assert predict_vllm([first, follow], BS, outputs=[out1, []]).hits == [0, 64]
