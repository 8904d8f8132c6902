"""Block pool + scheduler invariants under random operations (a hypothesis rule-based state machine).

The model is replaced by a fake that "writes" into each scheduled slot a fingerprint of the exact token
prefix that slot's K/V would encode. Checking those fingerprints after every step proves that no
prefix-cache hit, preemption or recompute ever lets a request read K/V computed for other tokens.

With ``speculative`` on, requests ready to decode get random drafts before each step (as the engine's
``Speculator`` gives them), the fake forward writes the drafts' fingerprints too, and a random number of
them is accepted: rejected drafts must be rolled back (tables cover exactly the computed tokens, every
computed slot holds its own prefix) and never reach the prefix cache.

With ``windows`` (KV cache groups, ``kvscope.engine.core.kv_groups``): one sliding group, or a full group and a
sliding one sharing the pool. Every group's table is checked the same way; a sliding group's null
entries must be only blocks that no later query reads, and every slot a query can still read must
hold its own prefix.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvscope.engine.config import EngineConfig, cdiv
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.kv_groups import NULL_BLOCK, KVCacheConfig, KVCacheGroupSpec
from kvscope.engine.core.scheduler import Scheduler
from kvscope.engine.request import Request, RequestStatus, SamplingParams

PREFIXES = [[], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9, 9, 9, 9]]
COUNTS = {"steps": 0, "ops": 0}  # tried in this run (figures for docs/reliability.md)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.sampled_from([1, 2, 4, 8]),
        num_blocks=st.integers(4, 40),
        budget=st.integers(1, 48),
        max_seqs=st.integers(1, 6),
        caching=st.booleans(),
        chunked=st.booleans(),
        weak_hash=st.sampled_from([None, "constant", "ignores-prefix", "mod-7"]),
        speculative=st.booleans(),
        windows=st.sampled_from([(None,), (None,), (3,), (8,), (None, 3), (None, 8)]),
    )
    def setup(self, block_size, num_blocks, budget, max_seqs, caching, chunked, weak_hash, speculative, windows):
        cfg = EngineConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            max_num_batched_tokens=budget,
            max_num_seqs=max_seqs,
            enable_prefix_caching=caching,
            enable_chunked_prefill=chunked,
        )
        self.pool = BlockPool(num_blocks, block_size, caching)
        # Hashes that collide all the time: verification alone must keep the KV right.
        if weak_hash == "constant":  # every block collides with every other
            self.pool.hash_fn = lambda parent, tokens: 0
        elif weak_hash == "ignores-prefix":  # same tokens after different prefixes collide
            self.pool.hash_fn = lambda parent, tokens: hash(tokens)
        elif weak_hash == "mod-7":  # different tokens collide
            self.pool.hash_fn = lambda parent, tokens: hash((parent, tokens)) % 7
        groups = [KVCacheGroupSpec((g,), w) for g, w in enumerate(windows)]
        kv_config = KVCacheConfig(groups, 1, tuple(range(len(groups))), (0,) * len(groups))
        self.windows = windows
        self.kv = KVCacheManager(self.pool, kv_config, budget)
        self.sched = Scheduler(cfg, self.kv, max_model_len=64)
        self.live: dict[str, Request] = {}
        self.speculative = speculative
        self.slots: dict[int, tuple[int, ...]] = {}  # slot -> token prefix its K/V encodes
        self.counter = 0

    # ---- operations ------------------------------------------------------------------------------
    @rule(
        prefix=st.sampled_from(PREFIXES),
        tail=st.lists(st.integers(10, 13), max_size=12),
        max_tokens=st.integers(1, 12),
    )
    def add(self, prefix, tail, max_tokens):
        tokens = prefix + tail or [10]
        self.counter += 1
        r = Request(f"r{self.counter}", tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        self.live[r.request_id] = r
        self.sched.add_request(r)

    @rule(token=st.integers(10, 13), data=st.data())
    def step(self, token, data):
        COUNTS["steps"] += 1
        if self.speculative:  # drafts for the requests ready to decode, within their length limits
            for r in self.sched.running:
                if r.num_computed_tokens == r.num_tokens - 1:
                    room = min(r.sampling_params.max_tokens - r.num_output_tokens - 1, 64 - 1 - r.num_tokens, 3)
                    n = max(room, 0)  # as many as fit, like a draft model (n-gram may give fewer: budget cuts)
                    r.spec_token_ids = data.draw(st.lists(st.integers(10, 13), min_size=n, max_size=n))
        out = self.sched.schedule()
        for r in out.failed:
            self.live.pop(r.request_id)
        bs = self.pool.block_size
        sampled = []
        drafts = out.scheduled_spec_decode_tokens
        for r, n in zip(out.requests, out.num_tokens):
            for window, table in zip(self.windows, r.block_tables):  # the step's first query still reads
                if window:  # keys num_computed_tokens - W + 1 on: none of their blocks may be gone
                    assert table.count(NULL_BLOCK) * bs <= max(0, r.num_computed_tokens - window + 1)
            seq = r.all_token_ids + drafts.get(r.request_id, [])  # what this step computes K/V for
            for pos in range(r.num_computed_tokens, r.num_computed_tokens + n):  # the fake forward pass
                for table in r.block_tables:
                    assert table[pos // bs] != NULL_BLOCK  # a slot written this step is held
                    slot = table[pos // bs] * bs + pos % bs
                    self.slots[slot] = tuple(seq[: pos + 1])
            if r.num_computed_tokens + n == len(seq):  # reaches its end: the runner samples it
                sampled.append(r)
        accepted = {rid: data.draw(st.integers(0, len(d))) for rid, d in drafts.items()}
        COUNTS["drafts"] = COUNTS.get("drafts", 0) + sum(len(d) for d in drafts.values())
        update = self.sched.update_from_output(out, sampled, [token] * len(sampled), accepted)
        for r in update.finished:
            assert r.finish_reason == "length" and not any(r.block_tables) and r not in self.sched.running
            self.live.pop(r.request_id)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.sched.finish(self.live.pop(rid), RequestStatus.FINISHED_ABORTED)

    @precondition(lambda self: self.sched.running)
    @rule(data=st.data())
    def preempt(self, data):
        victim = data.draw(st.sampled_from(self.sched.running))
        self.sched.running.remove(victim)
        self.sched._preempt(victim)

    @rule()
    def fail_a_step(self):
        """A forward pass that raises after scheduling: the engine's rollback path."""
        out = self.sched.schedule()
        for r in out.failed:
            self.live.pop(r.request_id)
        self.kv.rollback_step()
        for r in out.requests:
            self.sched.finish(r, RequestStatus.FINISHED_ERROR, "boom")
            self.live.pop(r.request_id)

    # ---- invariants ------------------------------------------------------------------------------
    @invariant()
    def free_plus_used_is_total(self):
        COUNTS["ops"] += 1
        used = sum(1 for b in self.pool.blocks if b.ref_cnt > 0)
        assert self.pool.num_free_blocks + used == self.pool.num_blocks

    @invariant()
    def free_queue_holds_each_free_block_once(self):
        q = self.pool.free_queue
        ids = [b.block_id for b in q.empty] + list(q.cached)
        assert len(ids) == len(set(ids))
        assert set(ids) == {b.block_id for b in self.pool.blocks if b.ref_cnt == 0}
        assert all(b.block_hash is None for b in q.empty) and all(b.block_hash for b in q.cached.values())

    @invariant()
    def ref_counts_equal_table_holders(self):
        holders = [0] * self.pool.num_blocks
        for r in self.sched.running:
            for table in r.block_tables:
                for bid in table:
                    if bid != NULL_BLOCK:
                        holders[bid] += 1
        assert [b.ref_cnt for b in self.pool.blocks] == holders
        assert all(not any(r.block_tables) for r in self.sched.waiting)

    @invariant()
    def tables_cover_exactly_the_computed_tokens(self):
        for r in self.sched.running:
            for table in r.block_tables:
                assert len(table) == cdiv(r.num_computed_tokens, self.pool.block_size)

    @invariant()
    def windows_free_only_blocks_nobody_reads(self):
        bs = self.pool.block_size
        for r in self.sched.running:
            for window, table in zip(self.windows, r.block_tables):
                nulls = sum(1 for b in table if b == NULL_BLOCK)
                assert table[:nulls] == [NULL_BLOCK] * nulls  # a prefix of the table
                # the next query (at num_computed_tokens) reads keys from num_computed_tokens - W + 1 on
                first_read = r.num_computed_tokens - window + 1 if window else 0
                assert nulls * bs <= max(0, first_read)

    @invariant()
    def every_computed_slot_holds_its_own_prefix(self):
        bs = self.pool.block_size
        for r in self.sched.running:
            for pos in range(r.num_computed_tokens):
                for table in r.block_tables:
                    if table[pos // bs] == NULL_BLOCK:
                        continue
                    slot = table[pos // bs] * bs + pos % bs
                    assert self.slots.get(slot) == tuple(r.all_token_ids[: pos + 1])

    @invariant()
    def cached_hashes_match_block_tokens(self):
        bs = self.pool.block_size
        for key, block in self.pool.cached.items():
            assert (block.block_hash.value if block.group == 0 else (block.group, block.block_hash.value)) == key
            first = block.block_id * bs
            assert self.slots[first + bs - 1][-bs:] == block.block_hash.token_ids

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        for r in list(self.live.values()):
            self.sched.finish(r, RequestStatus.FINISHED_ABORTED)
        assert self.pool.num_free_blocks == self.pool.num_blocks  # nothing leaked
        assert all(b.ref_cnt == 0 for b in self.pool.blocks)
        assert all(n == 0 for n in self.pool.used_per_group.values())
        COUNTS["window_freed"] = COUNTS.get("window_freed", 0) + self.pool.num_window_freed_blocks


MACHINE_SETTINGS = settings(
    max_examples=200, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_scheduler_state_machine():
    """The machine, then (in the same test, so no test order is assumed) a check that it tried a few
    thousand operations over a thousand or more engine steps."""
    before = dict(COUNTS)
    run_state_machine_as_test(SchedulerMachine, settings=MACHINE_SETTINGS)
    ops, steps = COUNTS["ops"] - before["ops"], COUNTS["steps"] - before["steps"]
    assert ops >= 4000 and steps >= 1000, COUNTS
    # speculation was exercised (50-300 drafts a run)
    assert COUNTS.get("drafts", 0) - before.get("drafts", 0) >= 20, COUNTS
    assert COUNTS.get("window_freed", 0) - before.get("window_freed", 0) >= 20, COUNTS  # windows freed blocks
