"""The scheduling rules where kvscope and vLLM differ (kvscope/engine/core/rules.py), each against kvscope's own:
the whole sequence must fit to be admitted (reserve_full_isl), finished requests free their blocks in schedule
order, and vLLM's prefix index (by hash, duplicates kept). The schedules against vLLM itself: tests/sim."""

from __future__ import annotations

import pytest

from kvscope.engine.config import EngineConfig
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_block import BlockHash
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.rules import KVSCOPE_RULES, VLLM_RULES, SchedulerRules
from kvscope.engine.core.scheduler import Scheduler
from kvscope.engine.request import Request, SamplingParams


def make(rules, num_blocks: int, block_size: int = 4, budget: int = 16) -> Scheduler:
    config = EngineConfig(block_size=block_size, num_blocks=num_blocks, max_num_batched_tokens=budget,
                          max_num_seqs=8, scheduler_rules=rules)
    return Scheduler(config, KVCacheManager(BlockPool(num_blocks, block_size), None, budget), 256)


def req(rid: str, prompt: list[int], max_tokens: int) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def step(s: Scheduler):
    out = s.schedule()
    sampled = [r for r, n in zip(out.requests, out.num_tokens) if r.num_computed_tokens + n == r.num_tokens]
    s.update_from_output(out, sampled, [7] * len(sampled))
    return out


def test_rules_are_named_or_given_field_by_field():
    assert EngineConfig().scheduler_rules is KVSCOPE_RULES and KVSCOPE_RULES.is_default
    assert EngineConfig(scheduler_rules="vllm").scheduler_rules is VLLM_RULES and not VLLM_RULES.is_default
    custom = EngineConfig(scheduler_rules={"reserve_full_isl": True}).scheduler_rules
    assert custom == SchedulerRules("custom", reserve_full_isl=True)
    with pytest.raises(ValueError, match="'sglang' is not an engine's rules"):
        EngineConfig(scheduler_rules="sglang")
    with pytest.raises(ValueError, match="unknown keys \\['watermark'\\]"):
        SchedulerRules.coerce({"watermark": 0.1})
    with pytest.raises(TypeError, match="must be True or False"):
        SchedulerRules(reserve_full_isl=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be 'kvscope', 'vllm'"):
        SchedulerRules.coerce(3)


def test_vllm_admits_only_when_the_whole_sequence_fits():
    """8 blocks of 4; A holds 3 (12 prompt tokens). B's 24-token prompt needs 6 blocks but 5 are free: kvscope
    admits B's first chunk (the 4 tokens left of the budget) and preempts a request later; vLLM leaves B waiting
    until A is done."""
    runs = {}
    for rules in ("kvscope", "vllm"):
        s = make(rules, num_blocks=8)
        s.add_request(req("A", list(range(10, 22)), 8))
        s.add_request(req("B", list(range(30, 54)), 2))
        first = step(s)
        runs[rules] = [(r.request_id, n) for r, n in zip(first.requests, first.num_tokens)], s
    assert runs["kvscope"][0] == [("A", 12), ("B", 4)]
    assert runs["vllm"][0] == [("A", 12)]
    s = runs["vllm"][1]
    while s.has_unfinished_requests():  # B goes in once A has finished, and nobody is preempted
        step(s)
    assert s.num_preemptions == 0
    s = runs["kvscope"][1]
    while s.has_unfinished_requests():
        step(s)
    assert s.num_preemptions > 0  # the chunk admitted too early is preempted later


def test_can_allocate_counts_the_hits_it_revives():
    pool = BlockPool(4, 4)
    kv = KVCacheManager(pool)
    a = req("a", list(range(10, 19)), 1)  # 9 tokens: 2 full blocks + 1
    assert kv.allocate_slots(a, 9)
    kv.free(a)  # 2 cached free blocks, 2 empty
    b = req("b", [*range(10, 19), 50, 51, 52, 53, 54, 55, 56], 1)  # 16 tokens: 4 blocks, 2 of them hits
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 2
    assert kv.can_allocate(b, 16 - 8, hits)  # 2 new + 2 revived = the 4 free blocks
    assert not kv.can_allocate(b, 16 - 8 + 1, hits)  # one token more needs a 5th block
    assert pool.num_free_blocks == 4 and pool.prefix_cache_queries == 9  # nothing changed


def test_vllm_frees_what_a_step_finishes_in_schedule_order():
    """A (admitted first, longer) and B finish in the same step; the worker samples shorter contexts first
    (B, then A). vLLM frees A's blocks first, so they are evicted first; kvscope's own rules free B's first."""
    orders = {}
    for rules in ("kvscope", "vllm"):
        s = make(rules, num_blocks=16)
        s.add_request(req("A", list(range(10, 22)), 2))
        s.add_request(req("B", list(range(40, 48)), 2))
        out = s.schedule()  # both prefill
        s.update_from_output(out, [out.requests[1], out.requests[0]], [7, 7])
        out = s.schedule()  # both decode their last token, B (8 computed) packed before A (12)
        blocks_of = {r.request_id: set(r.block_ids) for r in out.requests}
        s.update_from_output(out, [out.requests[1], out.requests[0]], [7, 7])
        assert not s.has_unfinished_requests()
        lru = list(s.kv.pool.free_queue.cached)
        orders[rules] = "".join(rid for b in lru for rid, ids in blocks_of.items() if b in ids)
    assert orders["vllm"] == "AAABB"
    assert orders["kvscope"] == "BBAAA"


def test_the_hash_index_keeps_duplicates_and_serves_one_once_the_first_is_evicted():
    h = BlockHash(123, (1, 2, 3, 4))
    for hash_index in (False, True):
        pool = BlockPool(3, 4)
        if hash_index:
            pool.use_hash_index()
        first, second = pool.allocate(2)
        pool.cache_chain([first], [h], None)
        pool.cache_chain([second], [h], None)
        assert (second.block_hash is not None) is hash_index  # vLLM caches the same contents twice
        pool.free([first, second])
        pool.allocate(2)  # the empty block, then: vLLM evicts the first (the duplicate waits in the LRU behind it);
        # kvscope's own rules hand out the uncached second block and keep the first
        assert pool.find_cached_prefix([h]) == ([second] if hash_index else [first])


def test_the_hash_index_serves_a_chain_whatever_block_held_its_parent():
    """The parent of a cached block was evicted and computed again in another block: vLLM finds the whole chain
    by its hashes; kvscope's own index serves only the parent (its verification wants the very block)."""
    p, c = BlockHash(1, (1, 2)), BlockHash(2, (3, 4))
    for hash_index in (False, True):
        pool = BlockPool(3, 2)
        if hash_index:
            pool.use_hash_index()
        parent, child = pool.allocate(2)
        pool.cache_chain([parent, child], [p, c], None)
        pool.free([parent])  # the parent alone goes back (another request still holds the child)
        pool.allocate(1)  # the empty block
        again = pool.allocate(1)[0]  # evicts the parent
        assert again is parent and pool.find_cached_prefix([p, c]) == []
        pool.cache_chain([again], [p], None)  # the same tokens computed again
        assert pool.find_cached_prefix([p, c]) == ([again, child] if hash_index else [again])


def test_vllm_counts_a_preempted_requests_lookup_apart():
    """vLLM's ``vllm:prefix_cache_hits`` leaves out the lookups of preempted requests admitted again (its
    ``PrefixCacheStats.preempted_hits``): with ``preempted_hits_apart`` the same schedule counts them apart, and
    the two counts add up to kvscope's."""
    pools = {}
    for rules in ("kvscope", {"preempted_hits_apart": True}):
        s = make(rules, num_blocks=8)
        s.add_request(req("A", list(range(10, 22)), 8))
        s.add_request(req("B", list(range(30, 54)), 2))
        while s.has_unfinished_requests():
            step(s)
        assert s.num_preemptions > 0  # kvscope's admission: B is preempted and admitted again
        pools[str(rules)] = s.kv.pool
    own, apart = pools["kvscope"], pools[str({"preempted_hits_apart": True})]
    assert own.preempted_prefix_cache_queries == own.preempted_prefix_cache_hits == 0
    assert apart.preempted_prefix_cache_queries > 0
    assert apart.prefix_cache_queries < own.prefix_cache_queries
    assert apart.prefix_cache_queries + apart.preempted_prefix_cache_queries == own.prefix_cache_queries
    assert apart.prefix_cache_hits + apart.preempted_prefix_cache_hits == own.prefix_cache_hits
    assert VLLM_RULES.preempted_hits_apart and not KVSCOPE_RULES.preempted_hits_apart
