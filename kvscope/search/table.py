"""A search's results as people act on them: the table (one row per configuration; ``write_csv``), the best
configuration (``best``, by ``--objective``) and the ``vllm serve`` command that would run it (``serve_line``).

The CSV's columns: one per space key (named as in ``--space``), then ``gpus``, ``usd_per_hour``, ``goodput_rps``
(requests per second), ``goodput_per_gpu``, ``requests_per_usd`` (goodput x 3600 / USD per hour), one column per
SLO term (its percentile at the goodput rate, seconds), ``attained`` (the share of requests meeting every
threshold there), ``capped`` (held at the bisection's maximum rate), ``broke_first`` (the SLO term that failed
first above the goodput: why this configuration cannot serve more), ``broke_at_rps``, ``best`` (1 on the chosen
row) and ``error`` (a configuration that cannot run). Numbers are written with 6 significant digits, so two
searches of one problem write the same bytes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shlex
from collections.abc import Sequence
from pathlib import Path

from kvscope.search.goodput import Outcome
from kvscope.search.slo import SLO
from kvscope.utils.files import atomic_write

OBJECTIVES = ("per_dollar", "per_gpu", "goodput")


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.6g}"


def score(o: Outcome, objective: str) -> float:
    if o.error is not None:
        return -math.inf
    if objective == "per_dollar":
        return o.per_dollar_hour if o.per_dollar_hour is not None else o.per_gpu
    return o.per_gpu if objective == "per_gpu" else o.goodput


def best(outcomes: Sequence[Outcome], objective: str = "per_dollar") -> Outcome | None:
    """The configuration with the highest ``objective`` (``per_dollar`` falls back to per GPU where no cost is
    known); ties go to the higher goodput, then to the earlier configuration. ``None`` if none has a goodput."""
    if objective not in OBJECTIVES:
        raise ValueError(f"--objective {objective!r} must be one of {', '.join(OBJECTIVES)}")
    ok = [o for o in outcomes if o.error is None and o.goodput > 0]
    if not ok:
        return None
    return max(ok, key=lambda o: (score(o, objective), o.goodput, -o.point.index))


def columns(keys: Sequence[str], slo: SLO) -> list[str]:
    return [*keys, "gpus", "usd_per_hour", "goodput_rps", "goodput_per_gpu", "requests_per_usd",
            *(t.name for t in slo.terms), "attained", "capped", "broke_first", "broke_at_rps", "best", "error"]


def rows(outcomes: Sequence[Outcome], slo: SLO, chosen: Outcome | None) -> list[list[str]]:
    out = []
    for o in sorted(outcomes, key=lambda o: o.point.index):
        pct = [_num(o.percentiles.get(t.name)) for t in slo.terms]
        out.append([*o.point.texts, str(o.num_gpus or ""), _num(o.usd_per_hour), _num(o.goodput), _num(o.per_gpu),
                    _num(o.per_dollar_hour), *pct, _num(o.attained), str(int(o.capped)), o.broke or "",
                    _num(o.broke_at), str(int(o is chosen)), o.error or ""])
    return out


def csv_text(outcomes: Sequence[Outcome], keys: Sequence[str], slo: SLO, chosen: Outcome | None) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns(keys, slo))
    writer.writerows(rows(outcomes, slo, chosen))
    return buf.getvalue()


def write_csv(path: str | Path, outcomes: Sequence[Outcome], keys: Sequence[str], slo: SLO,
              chosen: Outcome | None) -> None:
    text = csv_text(outcomes, keys, slo, chosen)
    atomic_write(Path(path), lambda f: f.write(text))


def serve_line(model: str, o: Outcome, defaults: dict[str, object] | None = None) -> str:
    """The ``vllm serve`` command(s) of ``o``'s configuration: vLLM's flags for its engine options, tensor
    parallelism and replicas (``--data-parallel-size``: vLLM's own replicas behind one API server); a P/D layout
    is one command per role (NIXL's connector, a proxy in front routes between them)."""
    values = dict(defaults or {})
    values.update(zip(o.point.keys, o.point.values))
    flags = []
    for key, flag in (("block_size", "--block-size"), ("max_num_seqs", "--max-num-seqs"),
                      ("max_num_batched_tokens", "--max-num-batched-tokens"),
                      ("kv_memory", "--kv-cache-memory-bytes"), ("num_blocks", "--num-gpu-blocks-override")):
        if values.get(key) is not None:
            flags.append(f"{flag} {values[key]}")
    for key, flag in (("chunked_prefill", "--enable-chunked-prefill"), ("prefix_caching", "--enable-prefix-caching")):
        if values.get(key) is not None:
            flags.append(flag if values[key] else flag.replace("--enable", "--no-enable"))
    if (values.get("tp") or 1) > 1:
        flags.append(f"--tensor-parallel-size {values['tp']}")
    base = " ".join(["vllm serve", shlex.quote(model), *flags])
    replicas = values.get("replicas") or 1
    pd = values.get("pd")
    if pd is None:
        return base + (f" --data-parallel-size {replicas}" if replicas > 1 else "")
    p, _, d = str(pd).upper().rstrip("D").partition("P")
    conf = shlex.quote(json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}))
    return "\n".join([f"# {pd} x {replicas}: {int(p) * replicas} prefill and {int(d) * replicas} decode servers, "
                      "a P/D proxy in front (vLLM's disagg_proxy)",
                      f"{base} --kv-transfer-config {conf}   # each prefill server",
                      f"{base} --kv-transfer-config {conf}   # each decode server"])
