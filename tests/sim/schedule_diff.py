"""The differential test's two sides and its scenarios: random workloads (``scenarios``), kvscope's scheduler run on
one as the simulator builds it (``kvscope_schedule``), vLLM's real ``Scheduler`` run on all of them in one
subprocess of the vLLM virtualenv (``vllm_schedules``, driving ``vllm_schedule_driver.py``), and the first step
where two schedules part (``first_difference``).

A schedule is a list of steps, each ``{"tokens": [[id, n], ...] (schedule order), "preempted": [ids, sorted],
"admitted": [[id, computed tokens at admission (the prefix-cache hit)], ...]}``; the loop that makes one is the
same on both sides (the driver's doc): arrivals by step, one fake token per request that reaches the end of its
known tokens, outputs ending at ``max_tokens``.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

from kvscope.engine.config import EngineConfig
from kvscope.engine.core.kv_groups import single_group
from kvscope.engine.request import Request, SamplingParams
from kvscope.sim.build import simulated_scheduler
from kvscope.sim.worker import SimWorker
from kvscope.utils.clock import VirtualClock

DRIVER = Path(__file__).with_name("vllm_schedule_driver.py")
FAKE_TOKEN = 7  # the driver's
MAX_STEPS = 20000
KINDS = ("all_at_once", "staggered", "shared_prefix", "tight_pool", "long_prompts")


def scenario(seed: int, kind: str) -> dict[str, Any]:
    """One random scenario of ``kind`` (see ``KINDS``): every request fits the whole pool (prompt plus outputs),
    so neither engine refuses one; pools of a few blocks over what one request needs preempt."""
    rng = random.Random(f"{kind}-{seed}")
    block_size = rng.choice((4, 8, 16))
    budget = rng.choice((16, 32, 48, 64, 128))
    max_num_seqs = rng.choice((2, 4, 8, 16))
    budget = max(budget, max_num_seqs)  # vLLM refuses a token budget below max_num_seqs
    n = rng.randint(4, 14)
    long = kind == "long_prompts"
    prompt_hi = budget * 3 if long else rng.choice((24, 48, 96))
    prompt_lo = budget + 1 if long else 1
    out_hi = rng.choice((1, 4, 12, 24))
    prefixes = [[rng.randrange(10, 500) for _ in range(rng.randint(block_size, 4 * block_size))] for _ in range(3)]
    requests = []
    for i in range(n):
        length = rng.randint(prompt_lo, max(prompt_lo, prompt_hi))
        prompt = [rng.randrange(10, 500) for _ in range(length)]
        if kind == "shared_prefix" or (kind != "long_prompts" and rng.random() < 0.3):
            prompt = rng.choice(prefixes) + prompt[: max(1, length // 2)]
        if rng.random() < 0.15 and requests:  # an identical prompt again
            prompt = list(rng.choice(requests)["prompt"])
        arrival = 0 if kind in ("all_at_once", "tight_pool") else rng.randint(0, 3 * n)
        requests.append({"id": f"r{i}", "prompt": prompt, "max_tokens": rng.randint(1, out_hi),
                         "arrival_step": arrival})
    longest = max(len(r["prompt"]) + r["max_tokens"] for r in requests)
    need = -(-longest // block_size)
    spare = rng.choice((0, 1, 2, 4)) if kind == "tight_pool" else rng.choice((1, 3, 8, 32))
    return {"name": f"{kind}-{seed}", "block_size": block_size, "num_blocks": need + spare,
            "max_num_seqs": max_num_seqs, "max_num_batched_tokens": budget, "max_model_len": 1024,
            "enable_prefix_caching": rng.random() < 0.85, "requests": requests}


def scenarios(count: int) -> list[dict[str, Any]]:
    """``count`` scenarios, the kinds taking turns."""
    return [scenario(i // len(KINDS), KINDS[i % len(KINDS)]) for i in range(count)]


class _NoTime:
    """A step-time model of no time (the differential compares schedules only)."""

    name = "none"

    def predict(self, features: Any) -> float:
        return 0.0

    def describe(self) -> dict[str, Any]:
        return {"kind": "none"}


def kvscope_schedule(sc: dict[str, Any], rules: Any = "vllm") -> dict[str, Any]:
    """kvscope's schedule of a scenario: the simulator's scheduler (``simulated_scheduler``) under ``rules``, its
    model-free worker picking who samples (``SimWorker.prepare``, the packing order a simulated step has)."""
    config = EngineConfig(block_size=sc["block_size"], num_blocks=sc["num_blocks"], max_num_seqs=sc["max_num_seqs"],
                          max_num_batched_tokens=sc["max_num_batched_tokens"], max_model_len=sc["max_model_len"],
                          enable_prefix_caching=sc.get("enable_prefix_caching", True), scheduler_rules=rules)
    scheduler = simulated_scheduler(config, sc["num_blocks"], sc["max_model_len"])
    worker = SimWorker(_NoTime(), VirtualClock(), sc["block_size"], sc["num_blocks"], 1, single_group(1), FAKE_TOKEN)
    pending = sorted(enumerate(sc["requests"]), key=lambda p: (p[1]["arrival_step"], p[0]))
    steps: list[dict[str, Any]] = []
    step = 0
    while pending or scheduler.has_unfinished_requests():
        if not scheduler.has_unfinished_requests() and pending[0][1]["arrival_step"] > step:
            step = pending[0][1]["arrival_step"]
        while pending and pending[0][1]["arrival_step"] <= step:
            r = pending.pop(0)[1]
            params = SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True)
            scheduler.add_request(Request(r["id"], list(r["prompt"]), params, arrival_time=float(step)))
        out = scheduler.schedule()
        if out.failed:
            return {"steps": steps, "error": f"kvscope failed {[r.request_id for r in out.failed]}"}
        steps.append({"tokens": [[r.request_id, n] for r, n in zip(out.requests, out.num_tokens)],
                      "preempted": sorted(r.request_id for r in out.preempted),
                      "admitted": sorted([r.request_id, r.num_computed_tokens] for r in out.admitted)})
        sampled = worker.prepare(out).sample_requests
        scheduler.update_from_output(out, sampled, [FAKE_TOKEN] * len(sampled))
        step += 1
        if len(steps) > MAX_STEPS:
            return {"steps": steps, "error": f"no end after {MAX_STEPS} steps"}
    return {"steps": steps, "error": None}


def vllm_schedules(python: Path, batch: list[dict[str, Any]], timeout: float = 600) -> list[dict[str, Any]]:
    """vLLM's schedules of all ``batch`` in one run of the driver (one import of vLLM, a few seconds of work)."""
    proc = subprocess.run([str(python), str(DRIVER)], input=json.dumps({"scenarios": batch}), capture_output=True,
                          text=True, timeout=timeout, env=_driver_env())
    if proc.returncode != 0:
        raise RuntimeError(f"the vLLM driver exited {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)["schedules"]


def _driver_env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(VLLM_LOGGING_LEVEL="ERROR", OMP_NUM_THREADS="1", VLLM_TARGET_DEVICE="cpu")
    return env


def first_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """None when the two schedules are the same step for step; else where and how they part."""
    for name, s in (("kvscope", ours), ("vllm", theirs)):
        if s["error"]:
            return f"{name}: {s['error']}"
    for i, (a, b) in enumerate(zip(ours["steps"], theirs["steps"])):
        if a != b:
            return f"step {i}: kvscope {a} != vllm {b}"
    if len(ours["steps"]) != len(theirs["steps"]):
        return f"kvscope ran {len(ours['steps'])} steps, vllm {len(theirs['steps'])}"
    return None
