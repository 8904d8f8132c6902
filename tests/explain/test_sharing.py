"""What each prompt shares with the prompts before it: reusable whole blocks, the first differing token."""

from __future__ import annotations

from kvscope.explain.sharing import MAX_CANDIDATES, chain_hashes, common_prefix, share_prompts

BS = 4
BASE = list(range(100, 120))  # 20 tokens, 5 whole blocks


def test_divergence_is_the_first_differing_token():
    changed = [*BASE[:9], 999, *BASE[10:]]
    first, second = share_prompts([("a", BASE), ("b", changed)], BS)
    assert (first.diverged_at, first.diverged_from, first.num_reusable_tokens) == (None, None, 0)
    assert (second.diverged_at, second.diverged_from) == (9, "a")
    assert (
        second.num_reusable_tokens == 8
    )  # whole blocks before token 9; 9 % 4 = 1 token lost to the boundary
    assert changed[second.diverged_at] != BASE[second.diverged_at]
    assert changed[: second.diverged_at] == BASE[: second.diverged_at]


def test_the_earlier_prompt_shared_the_most_is_named():
    far = BASE[:5] + [1] * 15
    near = BASE[:14] + [2] * 6
    rows = share_prompts([("far", far), ("near", near), ("q", [*BASE[:17], 3, 3, 3])], BS)
    assert (rows[2].diverged_from, rows[2].diverged_at) == ("near", 14)
    assert rows[2].num_reusable_tokens == 12


def test_duplicates_reuse_every_whole_block_but_the_one_holding_the_last_token():
    twelve = BASE[:12]  # 3 whole blocks: the last prompt token is in block 3, always recomputed
    thirteen = BASE[:13]  # 3 whole blocks and a partial one
    rows = share_prompts([("a", twelve), ("b", twelve), ("c", thirteen), ("d", thirteen)], BS)
    assert [r.num_reusable_tokens for r in rows] == [0, 8, 12, 12]  # c extends a: a's third block is whole
    assert [r.diverged_at for r in rows] == [None, None, 12, None]  # a duplicate shares its whole prompt
    assert rows[2].diverged_from == "a"


def test_nothing_shared_and_a_prefix_of_an_earlier_prompt():
    rows = share_prompts([("a", BASE), ("b", [7] * 20), ("c", BASE[:6])], BS)
    assert (rows[1].diverged_at, rows[1].num_reusable_tokens) == (None, 0)
    assert (rows[2].diverged_at, rows[2].num_reusable_tokens) == (None, 4)


def test_a_divergence_inside_the_first_block_is_found():
    rows = share_prompts([("a", BASE), ("b", BASE[:2] + [5] * 10)], BS)
    assert (rows[1].diverged_at, rows[1].diverged_from, rows[1].num_reusable_tokens) == (2, "a", 0)


def test_chain_hashes_and_common_prefix():
    assert len(chain_hashes(BASE, BS)) == 5 and len(chain_hashes(BASE[:7], BS)) == 1
    assert chain_hashes(BASE[:8], BS) == chain_hashes(BASE[:11], BS)
    assert chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS)[1] != chain_hashes([0, 2, 3, 4, 5, 6, 7, 8], BS)[1]
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([1, 2], [1, 2, 3]) == 2


def test_many_sharers_stay_bounded():
    prompts = [(str(i), [*BASE[:16], i, i, i, i]) for i in range(3 * MAX_CANDIDATES)]
    rows = share_prompts(prompts, BS)
    assert all(r.num_reusable_tokens == 16 and r.diverged_at == 16 for r in rows[1:])
