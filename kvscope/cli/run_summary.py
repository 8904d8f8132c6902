"""The summary ``kvscope run`` prints at the end: the headline numbers as a two-column table (a P/D run's
as the whole system, with each instance labelled), and the answers to the user's own prompts."""

from __future__ import annotations

import math

from kvscope.utils.units import fmt_bytes

ANSWER_PROMPT_CHARS = 70  # a prompt is shown on one line, cut here; the answer in full (as the run kept it)


def _ms(seconds: float) -> str:
    if seconds is None or math.isnan(seconds):
        return "–"
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"


def _outcomes(requests) -> str:
    """'9 completed, 2 aborted' from the requests' finish reasons (stop and length count as completed)."""
    reasons = requests.finish_reason.fillna("unfinished").replace({"stop": "completed", "length": "completed"})
    counts = reasons.value_counts()
    order = ["completed", "abort", "error", "unfinished"]
    names = {"abort": "aborted", "error": "errors"}
    return ", ".join(f"{counts[k]} {names.get(k, k)}" for k in order if k in counts) or "none"


def print_summary(run, title: str) -> None:
    """The run's headline numbers as a two-column table."""
    s = run.summary() if run.records else {}
    meta = run.meta
    if not s:
        print(f"{title}: nothing ran")
        return
    per_block = meta.get("kv_bytes_per_block") or 0
    hit = s["prefix_cache_hit_rate"]
    rows = [
        ("model", f"{meta.get('model', '?')} on {meta.get('device', '?')}"),
        ("requests", f"{s['requests']} ({_outcomes(run.requests)}), {s['steps']} steps, "
                     f"at most {s['peak_running']} running at once"),
        ("output tokens", f"{s['output_tokens']:,} in {s['duration_s']:.1f} s"),
        ("tokens/s", f"{s['output_tokens_per_s']:,.1f} output, {s['total_tokens_per_s']:,.1f} incl. prefill"),
        ("TTFT p50 / p99", f"{_ms(s['ttft_p50_s'])} / {_ms(s['ttft_p99_s'])}"),
        ("ITL p50 / p99", f"{_ms(s['itl_p50_s'])} / {_ms(s['itl_p99_s'])}"),
        ("peak KV usage", f"{s['peak_block_usage']:.0%} of {meta.get('num_blocks', '?')} blocks x "
                          f"{meta.get('block_size', '?')} tokens ({fmt_bytes(s['peak_kv_bytes'])} of "
                          f"{fmt_bytes(meta.get('num_blocks', 0) * per_block)}); static reservation would need "
                          f"{fmt_bytes(s['peak_static_reservation_bytes'])}"),
        ("fragmentation", f"{s['mean_fragmentation']:.1%} mean, {s['peak_fragmentation']:.1%} peak "
                          "(unused slots in used blocks)"),
        ("preemptions", f"{s['preemptions']}"),
        ("prefix cache hits", "–" if hit != hit else
         f"{hit:.0%} ({s['prefix_cache_hits']:,} of {s['prefix_cache_queries']:,} prompt tokens found cached)"),
    ]
    if isinstance(meta.get("pd"), dict):  # a P/D run: the system end to end, then each instance as such
        rows = _pd_rows(rows, s, meta["pd"])
    if s.get("spec_num_drafts"):  # speculative decoding ran
        rows.append(("speculation", f"{s['spec_acceptance_rate']:.0%} of {s['spec_num_draft_tokens']:,} draft tokens "
                                    f"accepted, {s['spec_mean_acceptance_length']:.2f} tokens per verification"))
    print(title)
    width = max(18, *(len(name) for name, _ in rows))
    for name, value in rows:
        print(f"  {name:<{width}} {value}")


def _pd_rows(rows: list[tuple[str, str]], s: dict, pd: dict) -> list[tuple[str, str]]:
    """A P/D run's table: tokens and prefix-cache hits of the whole system (``kvscope.pd.summary``), the step
    figures labelled with the instance they are of, the transfers, and a line per instance."""
    main = pd.get("records_from", "decode-0")
    names = {"requests": "requests (all)", "output tokens": "output tokens (end to end)",
             "tokens/s": "tokens/s (end to end)", "peak KV usage": f"peak KV usage ({main})",
             "fragmentation": f"fragmentation ({main})", "preemptions": f"preemptions ({main})"}
    out = [(names.get(k, k), v.replace(" steps, at most", f" steps on {main}, at most") if k == "requests" else v)
           for k, v in rows]
    out[0] = (out[0][0], f"{out[0][1]}; P/D {pd.get('layout', '?')}")
    if "decode_prefix_cache_hits" in s:
        hit = s["prefix_cache_hit_rate"]
        out[-1] = ("prefix cache hits", ("–" if hit != hit else f"{hit:.0%} ({s['prefix_cache_hits']:,} of "
                                         f"{s['prefix_cache_queries']:,} prompt tokens, prefill side)")
                   + f"; transferred or held blocks served the decode side {s['decode_prefix_cache_hits']:,} "
                     "tokens (not hits)")
    p50, p99 = s.get("kv_transfer_time_p50_s", math.nan), s.get("kv_transfer_time_p99_s", math.nan)
    out.append(("KV transfers", f"{s.get('kv_transfers', 0)} made, {s.get('kv_transfer_failures', 0)} failed: "
                                f"{s.get('kv_transfer_blocks', 0):,} blocks moved "
                                f"({fmt_bytes(s.get('kv_transfer_bytes', 0))}), "
                                f"{s.get('kv_transfer_held_blocks', 0):,} already held; "
                                f"{_ms(p50)} / {_ms(p99)} p50 / p99"))
    for inst in pd.get("instances", []):
        name = inst.get("name", "?") if isinstance(inst, dict) else "?"
        if f"{name}_steps" not in s:
            continue
        line = (f"{s[f'{name}_steps']:,} steps, {s.get(f'{name}_output_tokens', 0):,.0f} tokens out, "
                f"{s.get(f'{name}_computed_prefill_tokens', 0):,.0f} prefill tokens computed, TTFT p50 "
                f"{_ms(s.get(f'{name}_ttft_p50_s'))} (its own queue to its first token)")
        if not inst.get("alive", True):
            line += f"; GONE: {inst.get('dead')}"
        out.append((f"{name} (instance)", line))
    return out


def print_answers(run) -> None:
    """Each prompt of ``--prompts`` and the model's answer, in the order of the file (``meta["texts"]``,
    each cut at ``kvscope.telemetry.export.MAX_TEXT`` characters by the run)."""
    texts = run.meta.get("texts") or {}
    if not texts:
        return
    print("answers")
    for i, text in enumerate(texts.values(), 1):
        prompt = " ".join(str(text.get("prompt") or "").split())
        if len(prompt) > ANSWER_PROMPT_CHARS:
            prompt = prompt[:ANSWER_PROMPT_CHARS - 1] + "…"
        answer = str(text.get("output") or "").strip() or "(no text: the answer was empty or special tokens)"
        print(f"  [{i}] {prompt}")
        print("      " + answer.replace("\n", "\n      "))
    print()
