"""Scheduler: one token budget, chunked prefill, preemption order, requests that can never fit."""

from kvscope.engine.config import EngineConfig
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.core.scheduler import Scheduler
from kvscope.engine.request import Request, RequestStatus, SamplingParams


def make(num_blocks=16, block_size=4, budget=16, max_seqs=8, max_model_len=1000, **kw):
    cfg = EngineConfig(
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=max_seqs,
        **kw,
    )
    pool = BlockPool(num_blocks, block_size, cfg.enable_prefix_caching)
    return Scheduler(cfg, KVCacheManager(pool), max_model_len), pool


def req(rid, n, max_tokens=4, first=100):
    return Request(rid, list(range(first, first + n)), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def fake_step(sched: Scheduler, out: SchedulerOutput, token: int = 7) -> list[Request]:
    """A step without a model: the requests that reach the end of their tokens (what the runner
    samples) each get ``token``, handed to ``update_from_output``. Returns the finished requests."""
    sampled = [r for r, n in zip(out.requests, out.num_tokens) if r.num_computed_tokens + n == r.num_tokens]
    return sched.update_from_output(out, sampled, [token] * len(sampled)).finished


def test_budget_is_shared_and_long_prompts_are_chunked():
    sched, _ = make(budget=16)
    for i, n in enumerate([10, 10, 10]):
        sched.add_request(req(f"r{i}", n, first=100 * (i + 1)))
    out = sched.schedule()
    assert [(r.request_id, n) for r, n in zip(out.requests, out.num_tokens)] == [("r0", 10), ("r1", 6)]
    assert out.total_num_tokens == 16 and [r.request_id for r in sched.waiting] == ["r2"]
    fake_step(sched, out)
    out = sched.schedule()  # r0 decodes (1), r1 finishes its prompt (4), r2 gets the rest (11)
    assert [(r.request_id, n) for r, n in zip(out.requests, out.num_tokens)] == [
        ("r0", 1),
        ("r1", 4),
        ("r2", 10),
    ]
    assert out.is_decode == [True, False, False]


def test_max_num_seqs_caps_running():
    sched, _ = make(max_seqs=2, budget=100)
    for i in range(4):
        sched.add_request(req(f"r{i}", 3, first=10 * i))
    out = sched.schedule()
    assert len(out.requests) == 2 and len(sched.running) == 2 and len(sched.waiting) == 2


def test_preempts_most_recently_admitted_and_requeues_it_first():
    sched, pool = make(num_blocks=5, block_size=4, budget=64, enable_prefix_caching=False)
    a, b, c = req("a", 8, first=100), req("b", 7, first=200), req("c", 3, first=300)
    for r in (a, b, c):
        sched.add_request(r)
    out = sched.schedule()  # a: 2 blocks, b: 2 blocks, c: 1 block -> all 5
    assert [r.request_id for r in out.requests] == ["a", "b", "c"]
    fake_step(sched, out)  # a has 9 tokens (needs a 3rd block), b has 8, c has 4
    out = sched.schedule()  # a needs a 3rd block: c, the last admitted, is preempted
    assert [r.request_id for r in out.preempted] == ["c"]
    assert c.status is RequestStatus.PREEMPTED and c.block_ids == [] and c.num_computed_tokens == 0
    assert sched.waiting[0] is c and c.num_preemptions == 1
    assert [r.request_id for r in out.requests] == ["a", "b"] and out.admitted == []
    assert pool.num_used_blocks == sum(len(r.block_ids) for r in sched.running)


def test_request_that_never_fits_fails_alone():
    sched, _ = make(num_blocks=4, block_size=4)
    big, small = req("big", 10, max_tokens=10), req("small", 3)  # big needs 5 blocks > 4
    sched.add_request(big)
    sched.add_request(small)
    out = sched.schedule()
    assert out.failed == [big] and big.status is RequestStatus.FINISHED_ERROR
    assert "needs 5 blocks" in big.error and "whole KV pool has 4" in big.error
    assert [r.request_id for r in out.requests] == ["small"]


def test_no_chunking_waits_for_budget_and_refuses_prompts_over_it():
    sched, _ = make(budget=8, enable_chunked_prefill=False)
    sched.add_request(req("a", 5))
    sched.add_request(req("b", 5, first=200))
    sched.add_request(req("huge", 9, first=300))
    out = sched.schedule()
    assert [r.request_id for r in out.requests] == ["a"]  # b waits instead of being chunked
    fake_step(sched, out)
    sched.waiting.rotate(-1)  # put "huge" first
    out = sched.schedule()
    assert [r.request_id for r in out.failed] == ["huge"] and "chunked prefill is off" in out.failed[0].error


def test_prefix_hit_skips_cached_tokens_and_counts_them():
    sched, pool = make(num_blocks=16, block_size=4, budget=64)
    a = req("a", 10)
    sched.add_request(a)
    fake_step(sched, sched.schedule())
    b = Request("b", [*range(100, 109), 5, 5], SamplingParams(max_tokens=2))  # shares 2 full blocks
    sched.add_request(b)
    out = sched.schedule()
    i = out.requests.index(b)
    assert b.num_computed_tokens == 8 and out.num_tokens[i] == 3 and b.num_cached_tokens == 8
    assert b.block_ids[:2] == a.block_ids[:2] and pool.blocks[a.block_ids[0]].ref_cnt == 2
    assert pool.prefix_cache_hits == 8 and pool.prefix_cache_queries == 10 + 11


def test_full_prompt_hit_still_computes_the_last_token():
    sched, _ = make(num_blocks=16, block_size=4, budget=64)
    a = req("a", 8)
    sched.add_request(a)
    fake_step(sched, sched.schedule())
    b = req("b", 8)  # identical prompt
    sched.add_request(b)
    out = sched.schedule()
    assert b.num_computed_tokens == 4 and out.num_tokens[out.requests.index(b)] == 4


def test_finish_and_abort_free_everything():
    sched, pool = make(num_blocks=16, block_size=4, budget=64)
    rs = [req(f"r{i}", 5 + i, first=50 * i) for i in range(4)]
    for r in rs:
        sched.add_request(r)
    fake_step(sched, sched.schedule())
    sched.finish(rs[0], RequestStatus.FINISHED_ABORTED)
    sched.finish(rs[0], RequestStatus.FINISHED_ABORTED)  # idempotent
    while sched.has_unfinished_requests():
        fake_step(sched, sched.schedule())
    assert pool.num_free_blocks == pool.num_blocks
    assert all(b.ref_cnt == 0 for b in pool.blocks)


def test_update_from_output_advances_appends_and_stops():
    sched, pool = make(num_blocks=16, block_size=4, budget=64, max_model_len=9)
    sched.eos_token_ids = frozenset([2])
    stop = Request("stop", [10, 11, 12], SamplingParams(max_tokens=8, stop_token_ids=[5]))
    eos = Request("eos", [20, 21, 22], SamplingParams(max_tokens=8))
    ignore = Request("ignore", [30, 31, 32], SamplingParams(max_tokens=5, ignore_eos=True))
    long = Request("long", [40, 41, 42, 43, 44, 45, 46, 47], SamplingParams(max_tokens=8, ignore_eos=True))
    for r in (stop, eos, ignore, long):
        sched.add_request(r)
    out = sched.schedule()
    update = sched.update_from_output(out, [stop, eos, ignore, long], [5, 2, 2, 9])
    assert [r.num_computed_tokens for r in (stop, eos, ignore, long)] == [3, 3, 3, 8]
    assert update.requests == [stop, eos, ignore, long] and update.token_ids == [5, 2, 2, 9]
    assert update.finished == [stop, eos, long]  # long reached max_model_len=9
    assert [r.finish_reason for r in (stop, eos, long)] == ["stop", "stop", "length"]
    assert ignore.output_token_ids == [2] and not ignore.is_finished
    assert sched.running == [ignore] and all(not r.block_ids for r in update.finished)
    # max_tokens: ignore decodes until it has 5 outputs (8 tokens, under max_model_len)
    while not ignore.is_finished:
        fake_step(sched, sched.schedule(), token=2)
    assert ignore.num_output_tokens == 5 and ignore.finish_reason == "length"
    assert sched.running == [] and pool.num_free_blocks == pool.num_blocks


def test_schedule_starts_a_fresh_step_for_the_kv_cache_manager():
    """Blocks cached while scheduling belong to that step only (what a failed step rolls back)."""
    sched, _ = make(num_blocks=16, block_size=4, budget=64)
    sched.add_request(req("a", 8))
    out = sched.schedule()
    assert len(sched.kv.cached_this_step) == 2
    fake_step(sched, out)
    sched.schedule()  # a decode: no new full block
    assert sched.kv.cached_this_step == []


def _trace(general: bool, seed: int = 3) -> tuple[list, list, int]:
    """A seeded run with shared prefixes, drafts-free decodes and a pool small enough to preempt: the steps
    (scheduled, preempted, finished), the block events, and how often ``allocate_slots`` ran. ``general``:
    the KV manager's written-out one-group paths off (every call takes the general ``_allocate``)."""
    import random

    rng = random.Random(seed)
    sched, pool = make(num_blocks=14, block_size=4, budget=24, max_seqs=6)
    if general:
        sched.kv._one_full_group = False
    events, calls = [], [0]
    pool.listeners.append(lambda kind, b: events.append((kind, b)))
    allocate = sched.kv.allocate_slots

    def counted(*args):
        calls[0] += 1
        return allocate(*args)

    sched.kv.allocate_slots = counted
    shared = [rng.randrange(30) for _ in range(8)]
    for i in range(14):
        prompt = shared[: rng.choice([0, 4, 8])] + [rng.randrange(30) for _ in range(rng.randrange(2, 11))]
        sched.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=rng.randrange(1, 12), ignore_eos=True)))
    steps = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        done = fake_step(sched, out, token=rng.randrange(30))
        steps.append(([(r.request_id, n) for r, n in zip(out.requests, out.num_tokens)],
                      [r.request_id for r in out.preempted], [r.request_id for r in done]))
    return steps, events, calls[0]


def test_written_out_paths_schedule_and_emit_exactly_as_the_general_path():
    """``_schedule_running``'s skip (``slots_ready``) and ``allocate_slots``' one-group path change no step,
    no block event and no order against the general code; they only make fewer calls."""
    for seed in (3, 4):
        fast, general = _trace(False, seed), _trace(True, seed)
        assert fast[0] == general[0] and fast[1] == general[1]
        assert any(step[1] for step in fast[0]) and any(kind == "hit" for kind, _ in fast[1])  # preempted, hits
        assert fast[2] < general[2]


def test_a_request_that_preempts_itself_ends_the_running_loop():
    """The running requests a step schedules are the first ones of ``running``: when the last one needs a block and
    nobody after it is left to preempt, it is preempted itself and the step keeps the ones before it."""
    sched, pool = make(num_blocks=4, block_size=4, budget=64, enable_prefix_caching=False)
    a, b = req("a", 7, first=100), req("b", 8, first=200)
    sched.add_request(a)
    sched.add_request(b)
    fake_step(sched, sched.schedule())  # a: 2 blocks (room for its 8th token), b: 2 blocks, full
    out = sched.schedule()  # b's 9th token needs a 3rd block: b is the most recently admitted
    assert out.requests == [a] and out.num_tokens == [1] and out.is_decode == [True] and out.total_num_tokens == 1
    assert out.preempted == [b] and b.status is RequestStatus.PREEMPTED and list(sched.waiting) == [b]
    assert sched.running == [a] and pool.num_used_blocks == 2 and out.admitted == []


def test_drafts_that_fit_are_scheduled_after_the_decode_token_and_dropped_before_preempting():
    sched, _ = make(num_blocks=16, block_size=4, budget=3)
    a = req("a", 3, max_tokens=8)
    sched.add_request(a)
    fake_step(sched, sched.schedule())
    a.spec_token_ids = [1, 2, 3]
    out = sched.schedule()  # a budget of 3: the decode token and 2 drafts
    assert out.num_tokens == [3] and out.scheduled_spec_decode_tokens == {"a": [1, 2]} and out.is_decode == [True]
    assert a.spec_token_ids == []  # taken, whatever was scheduled

    sched, _ = make(num_blocks=2, block_size=4, budget=16)
    a = req("a", 4, max_tokens=2)
    sched.add_request(a)
    fake_step(sched, sched.schedule())
    a.spec_token_ids = [1, 2, 3, 4]  # 5 tokens from position 4 need a 3rd block: the pool has 2
    out = sched.schedule()
    assert out.num_tokens == [1] and out.scheduled_spec_decode_tokens == {} and out.preempted == []


def test_stop_conditions_in_order_and_a_speculative_stop_drops_what_follows():
    sched, _ = make(num_blocks=16, block_size=4, budget=64, max_model_len=5)
    sched.eos_token_ids = frozenset([2])
    both = Request("both", [10, 11, 12, 13, 14], SamplingParams(max_tokens=1, stop_token_ids=[5]))
    eos = Request("eos", [20, 21], SamplingParams(max_tokens=8, ignore_eos=True))
    for r in (both, eos):
        sched.add_request(r)
    update = sched.update_from_output(sched.schedule(), [both, eos], [5, 2])
    # a stop token beats max_tokens and max_model_len; ignore_eos goes on past EOS
    assert update.finished == [both] and both.finish_reason == "stop" and not eos.is_finished

    spec = Request("spec", [30, 31, 32], SamplingParams(max_tokens=8, stop_token_ids=[7], ignore_eos=True))
    sched.add_request(spec)
    fake_step(sched, sched.schedule(), token=9)  # eos decodes, spec prefills and gets 9
    spec.spec_token_ids = [7, 8]
    out = sched.schedule()
    assert out.scheduled_spec_decode_tokens == {"spec": [7, 8]}
    update = sched.update_from_output(out, [eos, spec], [4, 6], num_accepted={"spec": 2})
    assert update.token_ids == [4, 7] and update.spec_accepted == {"spec": []} and update.finished == [eos, spec]
    assert spec.output_token_ids == [9, 7] and spec.finish_reason == "stop" and not spec.block_ids
    assert eos.output_token_ids == [2, 9, 4] and eos.finish_reason == "length"  # max_model_len 5 reached
