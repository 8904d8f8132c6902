"""One trial: a deployment simulated at one arrival rate, its requests timed and judged against the SLO.

The loop is ``LiveRun``'s without the thread (the same engine API, on a virtual clock that starts at 0): submit
every request whose arrival time has come, step, and when nothing is left to run jump the clock to the next
arrival. Each request's times come from the engine itself: a single engine's step deltas (first token, finish)
at the clock's time after the step, or a router's finished requests (``PDRequest``: its first token on the
instance that finished it, its end). TTFT and E2E count from the arrival time, as vLLM's do.

Every 64 steps and at every finish the ``Tally`` is told what failed; once the SLO is lost for sure (the
early-stop rule, ``kvscope.search.slo``) the trial stops and says so; the term lost first is what broke, the same
whether the trial stops there or runs on (``early_stop=False``, the tests' check of the rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, is_dataclass, replace

from kvscope.engine.engine import Engine
from kvscope.engine.request import SamplingParams
from kvscope.pd.router import Router
from kvscope.runs.workload.items import with_arrivals
from kvscope.search.deployment import Deployment
from kvscope.search.slo import SLO, Tally, Verdict, judge
from kvscope.utils.clock import VirtualClock

CHECK_EVERY = 64  # steps between the overdue checks of unfinished requests


@dataclass(slots=True)
class Trial:
    """A trial's outcome: the verdict, and what it cost to simulate."""

    rate: float
    verdict: Verdict
    num_finished: int
    num_steps: int
    simulated_s: float


def run_trial(dep: Deployment, slo: SLO, rate: float, early_stop: bool = True) -> Trial:
    """Simulate ``dep`` at ``rate`` requests/s (Poisson or the problem's ``--arrival``, seeded) until every
    request finished or (``early_stop``) the SLO is lost."""
    if is_dataclass(dep.step_model):  # a fresh copy: a fitted model's scatter draws start from its seed each trial
        dep = replace(dep, step_model=replace(dep.step_model))  # type: ignore[type-var]
    items = with_arrivals(dep.items, rate, dep.arrival, dep.seed)
    total = len(items)
    clock = VirtualClock(0)
    engine = dep.engine(clock, [i.arrival_s for i in items])
    tally = Tally(slo, total)
    limits = slo.thresholds()
    soonest = min(limits.values())
    arrival: dict[str, int] = {}  # request id -> arrival (ns), while unfinished, in arrival order
    first: dict[str, int] = {}  # a single engine's first tokens, while unfinished
    counts: dict[str, int] = {}  # a single engine's tokens so far, while unfinished
    values: dict[str, list[float]] = {"ttft": [], "itl": [], "e2e": []}
    router = engine if isinstance(engine, Router) else None
    role_key = None
    if router is not None:
        role_key = f"{'kv_consumer' if dep.pd is not None else 'kv_both'}_first_token_ns"
    nxt, steps, lost, seen, stopped = 0, 0, None, 0, False

    def finish(rid: str, first_ns: int | None, end_ns: int, num_tokens: int) -> None:
        arr = arrival.pop(rid)
        first.pop(rid, None)
        if first_ns is None or num_tokens == 0:  # failed (an error, a refused transfer): every threshold missed
            ttft = itl = e2e = math.inf
        else:
            ttft, e2e = (first_ns - arr) / 1e9, (end_ns - arr) / 1e9
            itl = (end_ns - first_ns) / 1e9 / (num_tokens - 1) if num_tokens > 1 else 0.0
        values["ttft"].append(ttft)
        values["itl"].append(itl)
        values["e2e"].append(e2e)
        tally.finished(rid, ttft, itl, e2e)

    while True:
        now = clock.now_ns()
        while nxt < total and round(items[nxt].arrival_s * 1e9) <= now:
            item = items[nxt]
            params = item.params if isinstance(item.params, SamplingParams) else SamplingParams()
            request = engine.make_request(item.prompt, params, f"r{nxt}")
            engine.add_request(request)
            arrival[request.request_id] = round(item.arrival_s * 1e9)
            nxt += 1
        if not engine.has_unfinished_requests():
            if nxt >= total:
                break
            clock.sleep_until_ns(round(items[nxt].arrival_s * 1e9))
            continue
        out = engine.step()
        steps += 1
        before = len(values["ttft"])
        now = clock.now_ns()
        if router is None:
            assert isinstance(engine, Engine)
            for d in out:
                if d.token_id is not None:
                    rid = d.request_id
                    counts[rid] = counts.get(rid, 0) + 1
                    if rid not in first:
                        first[rid] = now
                if d.finished:
                    finish(d.request_id, first.get(d.request_id), now, counts.pop(d.request_id, 0))
        else:
            done = router.done
            for req in done[seen:]:
                tokens = len(req.request.output_token_ids)
                finish(req.request_id, req.first_token_ns, req.finished_ns or now, tokens)
            seen = len(done)
        if steps % CHECK_EVERY == 0 or len(values["ttft"]) > before:
            for rid, arr in list(arrival.items()):
                waited = (now - arr) / 1e9
                if waited <= soonest:
                    break  # in arrival order: the later ones waited less
                if router is not None:
                    started = role_key in router.requests[rid].timeline if rid in router.requests else True
                else:
                    started = rid in first
                tally.overdue(rid, waited, started)
            if lost is None:
                lost = tally.lost()
                if lost is not None and early_stop:
                    stopped = True
                    break
    verdict = judge(slo, values, total, lost, stopped)
    return Trial(rate, verdict, len(values["ttft"]), steps, clock.now_ns() / 1e9)

