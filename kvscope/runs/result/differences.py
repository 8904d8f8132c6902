"""What sets compared runs apart: settings that differ, what makes them unlike (warnings), how they relate (notes).

``Comparison.differences``, ``.warnings`` and ``.notes`` (``kvscope.runs.result.comparison``) are these functions of
its runs, labels and summaries; ``lineage.py`` says which run a replay comes from and which system a run is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvscope.runs.result.lineage import prompts_digest, replayed_run, system_of
from kvscope.runs.result.run import Run


def setting_differences(runs: Sequence[Run]) -> dict[str, list[Any]]:
    """Engine settings (and the model) whose values differ between the runs: name -> value per run."""
    rows = [{"model": r.meta.get("model"), "device": r.meta.get("device"), **(r.meta.get("config") or {})}
            for r in runs]
    keys = dict.fromkeys(k for row in rows for k in row)
    return {k: [row.get(k) for row in rows] for k in keys if len({repr(row.get(k)) for row in rows}) > 1}


def unlike_warnings(labels: Sequence[str], runs: Sequence[Run], summaries: Sequence[dict[str, Any]]) -> list[str]:
    """What makes the runs not like for like, one sentence each."""
    out = []

    def listed(values) -> str:
        return ", ".join(f"{label}: {value}" for label, value in zip(labels, values))

    metas: list[Mapping[str, Any]] = [r.meta for r in runs]
    systems = [system_of(m) for m in metas]
    if len(set(systems)) > 1:
        out.append(f"unlike systems ({listed(systems)}): a P/D run spreads requests over instances, so its "
                   "throughput and latency are not a colocated engine's; compare end-to-end figures only"
                   + _records_from(labels, metas))
    models = [m.get("model", "?") for m in metas]
    if len(set(models)) > 1:
        out.append(f"different models ({listed(models)}): throughput and latency differ for that reason too")
    else:
        shapes = [_shape(m) for m in metas]
        if len(set(shapes)) > 1:
            out.append("the model has different shapes or dtypes in these runs (KV bytes per token: "
                       f"{listed(s[0] for s in shapes)}; layers x KV heads x head size, dtype: "
                       f"{listed(f'{s[1]} x {s[2]} x {s[3]}, {s[5]}' for s in shapes)})")
    workloads = [workload_signature(r) for r in runs]
    digests = [prompts_digest(r.events) for r in runs]
    if len({w[0] for w in workloads}) > 1:
        out.append(f"different workloads: {listed(f'{w[0]} requests' for w in workloads)}")
    elif (all(d[1] is not None for d in digests) and len({d[1] for d in digests}) > 1) or \
            (any(d[1] is None for d in digests) and len(set(workloads)) > 1):  # token ids where known, else texts
        out.append("different workloads: the same number of requests, but different prompts")
    devices = [m.get("device", "?") for m in metas]
    for i in range(len(metas)):  # a replay's simulated device stands in for its run's: no warning for it
        j = replayed_run(metas, i)
        if j is not None:
            devices[i] = devices[j]
    if len(set(devices)) > 1:
        out.append(f"different devices ({listed(devices)})")
    for label, run, s in zip(labels, runs, summaries):
        dropped = run.meta.get("num_steps_dropped", 0)
        if dropped:
            out.append(f"{label}: the recorder dropped its first {dropped} steps; its numbers cover the rest")
        if s["finished"] < s["requests"]:
            out.append(f"{label}: {s['requests'] - s['finished']} of {s['requests']} requests did not finish")
    return out


def replay_notes(labels: Sequence[str], runs: Sequence[Run]) -> list[str]:
    """What relates the runs without making them unlike, one sentence each: a simulation that replays
    another run of the comparison (its requests, on the run's engine settings but those it changed)."""
    out = []
    metas: list[Mapping[str, Any]] = [r.meta for r in runs]
    for i, meta in enumerate(metas):
        j = replayed_run(metas, i)
        if j is None:
            continue
        simulated = _mapping(meta.get("simulated"))
        replay = _mapping(simulated.get("replay"))
        changed = _mapping(replay.get("changed"))
        what = "; ".join(f"{name} {c.get('run')} -> {c.get('replay')}" for name, c in changed.items()
                         if isinstance(c, dict))
        timed = simulated.get("step_model_from") or "a step-time model"
        out.append(f"{labels[i]} is a simulation replaying {labels[j]}: its requests on a simulated "
                   f"engine (step times: {timed}), "
                   + (f"what-if: {what}" if what else "with the run's engine settings (its differences from "
                      "the run are the simulator's error)"))
    return out


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _shape(meta: Mapping[str, Any]) -> tuple:
    """What sizes the KV cache: bytes per token, layers, KV heads, head size, query heads, dtype (a replay's
    spec has no per-layer list: the per-layer details are not compared)."""
    spec = _mapping(meta.get("spec"))
    return (meta.get("kv_bytes_per_token"), *(spec.get(k) for k in ("num_layers", "num_kv_heads", "head_dim",
                                                                       "num_heads", "dtype")))


def _records_from(labels: Sequence[str], metas: Sequence[Mapping[str, Any]]) -> str:
    """Which instance a P/D run's step figures come from (``meta["pd"]["records_from"]``), if it says."""
    said = []
    for label, meta in zip(labels, metas):
        source = _mapping(meta.get("pd")).get("records_from")
        if source:
            said.append(f"{label}'s step figures are instance {source}'s")
    return f" ({'; '.join(said)})" if said else ""


def workload_signature(run: Run) -> tuple[int, tuple]:
    """(number of requests, per request: prompt length and prompt text when known), in submission order."""
    texts = run.meta.get("texts") or {}
    requests = run.requests
    prompts = tuple(
        (int(n), (texts.get(rid) or {}).get("prompt"))
        for rid, n in zip(requests["request_id"], requests["num_prompt_tokens"])
    ) if len(requests) else ()
    return len(prompts), prompts

