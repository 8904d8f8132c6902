"""Faults of a 1P2D engine: a decode instance that refuses a transfer fails that request alone; one killed
mid-run fails the requests it held, naming itself; the others finish with the colocated tokens, and no
block leaks on the instances that are left."""

import os
import random
import signal

import pytest

from kvscope import Engine, PDEngine, SamplingParams

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def fresh_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 250) for _ in range(rng.randrange(9, 60))] for _ in range(n)]


@pytest.fixture()
def engine():  # one per test: the kill test leaves an instance dead, whatever order the tests run in
    e = PDEngine("tiny", pd="1P2D", block_size=8, num_blocks=128)
    yield e
    e.close()
    assert all(i.process.poll() is not None for i in e.instances.values())


def assert_no_leaks(engine) -> None:
    for name, s in engine.instance_stats().items():
        assert s["num_used_blocks"] == 0 and s["num_pinned"] == 0, name


def test_a_refused_transfer_fails_that_request_alone(engine):
    ref = Engine("tiny", block_size=8, num_blocks=128)
    prompts = fresh_prompts(4, seed=11)
    engine.instances["decode-1"].call("fault", "refuse")
    outs = engine.generate(prompts, PARAMS)
    refused = [o for o in outs if o.finish_reason == "error"]
    assert refused and len(refused) < len(outs)
    assert all("decode-1 refuses KV transfers" in o.error for o in refused)
    for out, r in zip(outs, ref.generate(prompts, PARAMS)):
        if out.finish_reason != "error":
            assert out.token_ids == r.token_ids
    assert any(not t.ok for t in engine.transfers)
    assert_no_leaks(engine)


def test_a_decode_instance_killed_mid_run(engine):
    ref = Engine("tiny", block_size=8, num_blocks=128)
    prompts = fresh_prompts(4, seed=12)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    outs = {}
    while not any(r.decode == "decode-1" for r in engine.requests.values()):
        outs.update({o.request_id: o for o in engine.step()})
    os.kill(engine.instances["decode-1"].info["pid"], signal.SIGKILL)
    while engine.has_unfinished_requests():
        outs.update({o.request_id: o for o in engine.step()})
    failed = [outs[i] for i in ids if outs[i].finish_reason == "error"]
    assert failed and all("decode-1" in o.error and "died" in o.error for o in failed)
    done = [(p, outs[i]) for p, i in zip(prompts, ids) if outs[i].finish_reason == "length"]
    assert done
    for p, out in done:
        assert out.token_ids == ref.generate([p], params)[0].token_ids
    assert not engine.instances["decode-1"].alive
    assert set(engine.instance_stats()) == {"prefill-0", "decode-0"}
    assert_no_leaks(engine)
    more = engine.generate(fresh_prompts(2, seed=13), PARAMS)  # the engine goes on with decode-0
    assert all(o.finish_reason == "length" for o in more)
