"""The requests table of reports and replays: one row per request, with its prompt and output text.

Text is user data (prompts can hold anything, ``<script>`` included). It only ever reaches the page
through Bokeh's ``StringFormatter``, which sets it as text, never as HTML; nothing here uses an
HTML template formatter.
"""

from __future__ import annotations

import math

import pandas as pd
from bokeh.models import ColumnDataSource, DataTable, NumberFormatter, StringFormatter, TableColumn

from kvscope.telemetry.export import MAX_TEXT

from ..theme import FULL_WIDTH


def request_texts(meta: dict) -> dict[str, dict[str, str | None]]:
    """Request id -> {"prompt", "output"} from a run's ``meta["texts"]`` (a live run puts them there,
    and saved files keep them; a prompt given as token ids has ``None``)."""
    return dict(meta.get("texts") or {})


def _clip(text: str | None) -> str:
    if text is None:
        return ""
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def table_data(requests: pd.DataFrame, texts: dict[str, dict[str, str | None]]) -> dict[str, list]:
    def col(name: str, default=math.nan) -> list:
        return requests[name].tolist() if name in requests else [default] * len(requests)

    ids = col("request_id", "")
    prompts, outputs = [], []
    for rid, n_prompt in zip(ids, col("num_prompt_tokens", 0)):
        text = texts.get(rid, {})
        prompt = text.get("prompt")
        prompts.append(_clip(prompt) if prompt is not None else f"({n_prompt} prompt tokens, no text)")
        outputs.append(_clip(text.get("output")))
    ms = [v * 1e3 if v == v else math.nan for v in col("ttft_s")]
    return {
        "request": ids, "prompt": prompts, "output": outputs,
        "prompt_tokens": col("num_prompt_tokens", 0), "output_tokens": col("num_output_tokens", 0),
        "cached_tokens": col("num_cached_tokens", 0), "ttft_ms": ms,
        "preemptions": col("num_preemptions", 0),
        "finish": [str(v) if v == v else "" for v in col("finish_reason", "")],
    }


class RequestsTable:
    """A ``DataTable`` of every request of a finished run: its ``requests`` frame (``Run.requests``)
    and its texts (``request_texts(run.meta)``)."""

    name = "requests_table"
    title = "Requests"

    def __init__(self, requests: pd.DataFrame, texts: dict[str, dict[str, str | None]],
                 width: int = FULL_WIDTH, height: int = 260) -> None:
        self.source = ColumnDataSource(table_data(requests, texts))
        text = StringFormatter()
        number = NumberFormatter(format="0,0")
        columns = [
            TableColumn(field="request", title="request", width=70, formatter=text),
            TableColumn(field="prompt", title="prompt", width=300, formatter=text),
            TableColumn(field="output", title="output", width=300, formatter=text),
            TableColumn(field="prompt_tokens", title="prompt tok", width=70, formatter=number),
            TableColumn(field="output_tokens", title="output tok", width=70, formatter=number),
            TableColumn(field="cached_tokens", title="cached tok", width=70, formatter=number),
            TableColumn(field="ttft_ms", title="TTFT ms", width=70, formatter=NumberFormatter(format="0,0.0")),
            TableColumn(field="preemptions", title="preempt", width=55, formatter=number),
            TableColumn(field="finish", title="finish", width=55, formatter=text),
        ]
        self.model = DataTable(source=self.source, columns=columns, width=width, height=height,
                               index_position=None, sortable=True)
