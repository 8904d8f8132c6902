"""The engine's thread policy (kvscope/engine/threads.py): the adapt rule on a simulated machine (an injected clock
and load, no real contention), and an engine whose threads change mid-run: same tokens, changes in the metadata."""

from __future__ import annotations

import torch

from kvscope import Engine, SamplingParams
from kvscope.engine import threads as policy_module
from kvscope.engine.threads import ThreadPolicy
from kvscope.runs.result.run import Run


class Machine:
    """A 2-core machine: a step of ``tokens`` takes ``base`` x tokens / speed, where the speed of 1 or 2 threads
    depends on whether another process is busy (2 spinning threads on shared cores are slower than 1)."""

    def __init__(self) -> None:
        self.t, self.busy, self.threads = 0.0, False, 2
        self.SPEED = {(1, False): 1.0, (2, False): 1.8, (1, True): 0.7, (2, True): 0.3}

    def clock(self) -> float:
        return self.t

    def load(self) -> float:
        return 1.0 if self.busy else 0.05

    def set_threads(self, n: int) -> None:
        self.threads = n

    def step(self, policy: ThreadPolicy, index: int) -> None:
        tokens = 8 + index % 24  # decode batches of changing size
        seconds = 2e-3 * tokens / self.SPEED[(self.threads, self.busy)]
        self.t += seconds
        policy.step_done(index, False, tokens, seconds)


def make_policy(machine: Machine, threads: int = 2) -> ThreadPolicy:
    machine.threads = threads
    return ThreadPolicy(mode="adaptive", reason="test", cores=2.0, max_threads=2, threads=threads,
                        set_threads=machine.set_threads, load=machine.load, clock=machine.clock)


def run_for(machine: Machine, policy: ThreadPolicy, seconds: float, start: int) -> tuple[int, dict[int, float]]:
    """Steps for ``seconds`` of machine time; (the next step index, seconds spent at each thread count)."""
    end, i, spent = machine.t + seconds, start, {1: 0.0, 2: 0.0}
    while machine.t < end:
        before, n = machine.t, machine.threads
        machine.step(policy, i)
        spent[n] += machine.t - before
        i += 1
    return i, spent


def test_a_slowdown_under_load_drops_threads_and_quiet_brings_them_back() -> None:
    machine = Machine()
    policy = make_policy(machine)
    i, quiet = run_for(machine, policy, 5.0, 0)
    assert policy.threads == 2 and quiet[2] > 0.95 * sum(quiet.values())  # quiet: 2 threads, no change
    assert policy.num_changes == 0

    machine.busy = True  # another process starts: 2 threads get 3x slower than expected
    i, loaded = run_for(machine, policy, 30.0, i)
    assert policy.threads == 1
    first = policy.changes[0]
    assert first["threads"] == 1 and "expected time at 2 threads" in first["reason"]
    assert first["t_s"] < 5.0 + 3 * 0.5 + 0.2  # within a few windows of the load starting
    assert loaded[1] > 0.8 * sum(loaded.values())  # probes back up are rare and short (backoff)
    probes = [c for c in policy.changes if c["reason"].startswith("probe")]
    backs = [c for c in policy.changes if c["reason"].startswith("back")]
    assert probes and len(backs) == len(probes)  # every probe of 2 threads under load failed and went back
    assert all(b["threads"] == 1 for b in backs)

    machine.busy = False  # the other process ends: a probe finds 2 threads faster and keeps them
    i, after = run_for(machine, policy, 5.0, i)
    assert policy.threads == 2
    assert any(c["reason"].startswith("kept") and c["threads"] == 2 for c in policy.changes)
    assert after[2] > 0.7 * sum(after.values())


def test_a_load_that_does_not_slow_the_steps_changes_nothing() -> None:
    machine = Machine()
    machine.SPEED.update({(2, True): 1.8, (1, True): 1.0})  # the load sits on cores we do not need
    policy = make_policy(machine)
    machine.busy = True
    run_for(machine, policy, 10.0, 0)
    assert policy.threads == 2
    kept_or_back = [c for c in policy.changes if not c["reason"].startswith("probe")]
    assert all(c["threads"] == 2 for c in kept_or_back)  # a probe of 1 thread is slower: back to 2


def test_a_fixed_policy_never_changes_threads() -> None:
    machine = Machine()
    calls = []
    policy = ThreadPolicy(mode="fixed", reason="the user's: OMP_NUM_THREADS=2", cores=2.0, max_threads=2, threads=2,
                          set_threads=calls.append, load=machine.load, clock=machine.clock)
    machine.busy = True
    run_for(machine, policy, 10.0, 0)
    assert calls == [] and policy.describe()["changes"] == [] and policy.describe()["mode"] == "fixed"


def test_thread_changes_mid_run_keep_tokens_identical_and_are_in_the_metadata(monkeypatch, tmp_path) -> None:
    """Greedy tokens do not depend on the thread count (the policy may change it at any step); each change is in
    the run metadata with its step."""
    prompts = [[(7 * i + j) % 200 + 3 for j in range(5 + 3 * i)] for i in range(6)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        steady = [o.token_ids for o in Engine("tiny").generate(prompts, params)]
        engine = Engine("tiny")
        assert engine.run_metadata()["thread_policy"]["mode"] == "fixed"  # the tests' OMP_NUM_THREADS=1

        t = [0.0]
        flips = iter([2, 1, 2, 1, 2, 1, 2, 1] * 4)

        def clock() -> float:
            t[0] += 0.3  # every step ends a window: a decision per step
            return t[0]

        policy = ThreadPolicy(mode="adaptive", reason="test", cores=2.0, max_threads=2, threads=1,
                              set_threads=torch.set_num_threads, load=lambda: 1.5, clock=clock)
        policy._decide = lambda step, now: policy._change(step, now, next(flips), "test flip")  # type: ignore
        engine.threads, policy.on_change = policy, engine._threads_changed
        monkeypatch.setattr(policy_module, "MIN_WINDOW_STEPS", 1)
        switched = [o.token_ids for o in engine.generate(prompts, params)]
    finally:
        torch.set_num_threads(before)
    assert switched == steady
    meta = engine.recorder.meta["thread_policy"]
    assert meta["num_changes"] >= 5 and {c["threads"] for c in meta["changes"]} == {1, 2}
    assert [c["step"] for c in meta["changes"]] == sorted(c["step"] for c in meta["changes"])
    assert engine.recorder.snapshot()[2]["thread_policy"]["changes"] == meta["changes"]
    path = Run.from_engine(engine).save_metrics(tmp_path / "run.jsonl")  # a saved run keeps them, and loads back
    assert Run.load(path).meta["thread_policy"]["changes"] == meta["changes"]


def test_a_new_run_on_the_same_engine_starts_its_changes_afresh() -> None:
    machine = Machine()
    policy = make_policy(machine)
    machine.busy = True
    run_for(machine, policy, 5.0, 0)
    assert policy.threads == 1 and policy.num_changes >= 1
    policy.new_run()
    assert policy.num_changes == 1 and policy.changes == [
        {"step": 0, "t_s": 0.0, "threads": 1, "reason": "a new run on the same engine"}]
