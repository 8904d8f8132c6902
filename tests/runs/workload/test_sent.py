"""The prompts a load generator sent (kvscope watch --prompts): text lines, vllm bench serve's custom JSONL, token
ids; text tokenized as the server does, with kvscope's embedded tokenizers or a local folder only."""

from __future__ import annotations

import json

import pytest

from kvscope.models.loader import build_tiny_tokenizer
from kvscope.runs.workload.sent import load_tokenizer, read_sent_prompts, sent_prompt_ids


def test_lines_and_jsonl(tmp_path):
    (tmp_path / "p.txt").write_text("hello world\n\nsecond prompt\n")
    assert read_sent_prompts(tmp_path / "p.txt") == ["hello world", "second prompt"]
    rows = [{"prompt": "What is the capital of India?", "output_tokens": 10}, {"prompt_token_ids": [5, 6, 7]}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert read_sent_prompts(tmp_path / "p.jsonl") == ["What is the capital of India?", [5, 6, 7]]


@pytest.mark.parametrize("line", ['{"prompt_token_ids": [1, -2]}', '{"prompt_token_ids": []}', '{"other": 1}',
                                  '[1, 2]', 'not json', '{"prompt_token_ids": [true]}', '{"prompt": ""}'])
def test_a_bad_jsonl_line_is_named(tmp_path, line):
    (tmp_path / "p.jsonl").write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(ValueError, match="line 2"):
        read_sent_prompts(tmp_path / "p.jsonl")


def test_text_is_tokenized_as_vllms_completions_endpoint_does(tmp_path):
    (tmp_path / "p.txt").write_text("hello world\nabc\n")
    tok = build_tiny_tokenizer()
    assert sent_prompt_ids(tmp_path / "p.txt", "tiny") == [tok("hello world")["input_ids"], tok("abc")["input_ids"]]
    (tmp_path / "ids.jsonl").write_text('{"prompt_token_ids": [5, 6]}\n')
    assert sent_prompt_ids(tmp_path / "ids.jsonl") == [[5, 6]]  # ids need no tokenizer
    with pytest.raises(ValueError, match="give --tokenizer"):
        sent_prompt_ids(tmp_path / "p.txt")


def test_the_tokenizer_is_embedded_or_a_local_folder_never_a_download(tmp_path):
    with pytest.raises(ValueError, match="tiny, smollm2 or a local model folder"):
        load_tokenizer("HuggingFaceTB/SmolLM2-135M")
    build_tiny_tokenizer().save_pretrained(tmp_path / "tok")
    assert load_tokenizer(str(tmp_path / "tok"))("abc")["input_ids"] == build_tiny_tokenizer()("abc")["input_ids"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="does not load"):
        load_tokenizer(str(tmp_path / "empty"))
