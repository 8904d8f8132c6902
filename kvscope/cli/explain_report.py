"""What ``kvscope explain`` prints and writes (``--json``): a run's explanation, or vLLM's predicted prefix
cache for the same prompts. ``explain.py`` reads the command line and finds the run or the prompts."""

from __future__ import annotations

from typing import Any

from kvscope.cli.parser import CLIError


def _decode(tokenizer: Any):
    if tokenizer is None:
        return None
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def prompt_texts(meta: dict[str, Any]) -> dict[str, str]:
    """The run's prompt texts by request id (``meta["texts"]``, where its prompts were text)."""
    texts = meta.get("texts")
    if not isinstance(texts, dict):
        return {}
    return {rid: t["prompt"] for rid, t in texts.items() if isinstance(t, dict) and isinstance(t.get("prompt"), str)}


def explain_run(run, tokenizer: Any, top: int) -> tuple[dict[str, Any], str]:
    """A recorded (or simulated) run's explanation: prefix-cache misses by cause, the ``top`` divergence
    points, queue times by reason and the slow steps; the document and the text of ``kvscope explain``."""
    from kvscope.explain.prefix import prefix_misses
    from kvscope.explain.report import (
        add_text,
        explain_document,
        format_report,
        row_dicts,
        top_divergences,
        totals,
    )
    from kvscope.explain.waits import format_queue, queue_rows, queue_times, queue_totals

    try:
        rows = prefix_misses(run.records, run.events, {**run.meta, "t0_ns": run.t0_ns})
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    prompts = {e.request_id: list(e.prompt_token_ids) for e in run.events if e.kind == "queued"}
    dicts = row_dicts(rows)
    add_text(dicts, prompts, _decode(tokenizer), prompt_texts(run.meta))
    summary = totals(rows)
    last = run.records[-1].kv if run.records else None
    queries = last.prefix_cache_queries if last else sum(r.num_prompt_tokens for r in rows)
    hits = last.prefix_cache_hits if last else summary["tokens_hit"]
    points = top_divergences(dicts, top)
    waits = queue_times(run.records, run.events)
    queue = queue_totals(waits)
    doc = explain_document(
        dicts,
        queries,
        hits,
        engine="kvscope",
        block_size=int(run.meta["block_size"]),
        totals=summary,
        top_divergences=points,
        queue_totals=queue,
        queue=queue_rows(waits),
    )
    from kvscope.cli.explain_offline import slow_report

    slow, slow_text = slow_report(run)
    doc["slow_steps"] = slow
    return doc, "\n\n".join((format_report(summary, points, queries, hits), format_queue(queue), slow_text))


def explain_vllm(prompts: list[list[int]], bs: int, tokenizer: Any, top: int) -> tuple[dict[str, Any], str]:
    """What vLLM's prefix cache would serve of ``prompts`` (token ids) sent one after another, in blocks of
    ``bs`` tokens: the document and the text of ``kvscope explain --engine vllm``."""
    from kvscope.explain.report import add_text, explain_document, format_report, top_divergences
    from kvscope.explain.sharing import predict_vllm, share_prompts

    prediction = predict_vllm(prompts, bs)
    shares = share_prompts([(str(i), p) for i, p in enumerate(prompts)], bs)
    rows = [
        {
            "request_id": s.request_id,
            "num_prompt_tokens": s.num_prompt_tokens,
            "num_cached_tokens": hit,
            "num_reusable_tokens": s.num_reusable_tokens,
            "miss_cause": None,
            "diverged_at": s.diverged_at,
            "diverged_from": s.diverged_from,
        }
        for s, hit in zip(shares, prediction.hits)
    ]
    add_text(rows, {str(i): p for i, p in enumerate(prompts)}, _decode(tokenizer))
    points = top_divergences(rows, top)
    summary = {
        "num_requests": len(rows),
        "tokens_reusable": sum(r["num_reusable_tokens"] for r in rows),
        "tokens_missed": 0,
        "requests_by_cause": {},
        "tokens_missed_by_cause": {},
    }
    doc = explain_document(
        rows,
        prediction.prefix_cache_queries,
        prediction.prefix_cache_hits,
        engine="vllm",
        block_size=bs,
        top_divergences=points,
    )
    text = format_report(
        summary,
        points,
        prediction.prefix_cache_queries,
        prediction.prefix_cache_hits,
        title=f"vLLM prefix cache (predicted, block size {bs}, prompts sent one after another)",
    )
    return doc, text
