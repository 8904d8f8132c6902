"""Which run a run comes from: a recorded run's identity (``run_identity``), written into the metadata of a
simulation that replays it (``meta["simulated"]["replay"]["run"]``: ``kvscope simulate --replay RUN``), and read
back by ``kvscope compare`` (``replayed_run``), which then knows the simulation of a run as such: the same
requests on a simulated engine, not a different workload, model or device.

Also the kind of system a run measured (``system_of``: colocated or P/D with its layout), read defensively from
``meta["pd"]`` (a P/D run's, ``kvscope.pd.recorder``), so a comparison can say when it compares unlike systems.
Standard library only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

IDENTITY_KEYS = ("model", "host", "created_unix_s", "t0_ns")  # together: one recorded run


def prompts_digest(events: Any) -> tuple[int, str | None]:
    """(number of queued requests, a SHA-256 of their prompts' token ids, whatever their order: the same
    prompts submitted in another order are the same workload); the digest is ``None`` when a queued request
    did not record its ids (an old file, a watched server)."""
    each: list[str] = []
    n, complete = 0, True
    for event in events:
        if getattr(event, "kind", None) != "queued":
            continue
        n += 1
        ids = getattr(event, "prompt_token_ids", None)
        if ids is None:
            complete = False
            continue
        each.append(hashlib.sha256(",".join(str(int(t)) for t in ids).encode()).hexdigest())
    if not complete or not n:
        return n, None
    return n, hashlib.sha256(" ".join(sorted(each)).encode()).hexdigest()


def run_identity(meta: Mapping[str, Any], events: Any, path: str | None = None) -> dict[str, Any]:
    """What identifies a recorded run (JSON values): where it was read from, its model, host, creation time
    and clock origin, and its requests (count and prompts digest)."""
    n, digest = prompts_digest(events)
    identity: dict[str, Any] = {key: meta.get(key) for key in IDENTITY_KEYS}
    identity.update(path=path if path is not None else meta.get("source"), requests=n, prompts_sha256=digest)
    return identity


def replay_identity(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The identity of the run a simulated run replays (``None``: not a replay, or an older file)."""
    simulated = meta.get("simulated")
    replay = simulated.get("replay") if isinstance(simulated, Mapping) else None
    run = replay.get("run") if isinstance(replay, Mapping) else None
    return run if isinstance(run, Mapping) else None


def is_replay_of(meta: Mapping[str, Any], original: Mapping[str, Any]) -> bool:
    """Whether the run of ``meta`` is a simulation replaying the recorded run of ``original``'s meta."""
    identity = replay_identity(meta)
    if identity is None or "simulated" in original:
        return False
    known = [key for key in IDENTITY_KEYS if identity.get(key) is not None]
    return bool(known) and all(identity.get(key) == original.get(key) for key in known)


def replayed_run(metas: Sequence[Mapping[str, Any]], index: int) -> int | None:
    """The index among ``metas`` of the run that run ``index`` replays, if it is there."""
    for j, other in enumerate(metas):
        if j != index and is_replay_of(metas[index], other):
            return j
    return None


def system_of(meta: Mapping[str, Any]) -> str:
    """"colocated", or "P/D <layout>" for a disaggregated run (``meta["pd"]``, read defensively); a
    simulated one says so too."""
    pd = meta.get("pd")
    layout = pd.get("layout") if isinstance(pd, Mapping) else None
    if not layout:
        simulated = meta.get("simulated")
        sim_pd = simulated.get("pd") if isinstance(simulated, Mapping) else None
        layout = sim_pd.get("layout") if isinstance(sim_pd, Mapping) else None
    return f"P/D {layout}" if layout else "colocated"
