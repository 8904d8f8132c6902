"""The first hour of a newcomer on the command line (issue 26): ``--out`` makes its own missing folder and no
other, blank lines of ``--prompts`` are counted and said, the progress bar's total is known from the start,
``plan --gpu-mem 40`` asks whether GiB was meant, and a folder named ``kvscope`` that shadows the package is
named."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.cli.main import main

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def usage_error(code: int, err: str, pattern: str) -> None:
    """Exit code 2 and one line, 'kvscope: error: ...', matching ``pattern``."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("kvscope: error: "), err
    assert re.search(pattern, err), (pattern, err)


def run_main(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


TINY_RUN = ["--requests", "2", "--prompt-len", "8", "--output-len", "2", "--num-blocks", "16"]


def test_out_makes_its_own_missing_folder_and_no_other(tmp_path, capsys):
    code = main(["run", *TINY_RUN, "--out", str(tmp_path / "runs" / "a")])
    err = capsys.readouterr().err
    assert code == 0 and f"created the folder '{tmp_path / 'runs'}' for --out" in err, err
    assert sorted(os.listdir(tmp_path / "runs")) == ["a.html", "a.metrics.jsonl", "a.trace.json"]
    assert main(["run", *TINY_RUN, "--out", f"{tmp_path / 'more'}/", "-q"]) == 0  # a folder as --out
    assert (tmp_path / "more" / "kvscope-run.html").is_file()
    usage_error(*run_main(capsys, "run", "--out", str(tmp_path / "x" / "y" / "a")),
                r"folder of --out '.*y' does not exist, nor does '.*x': kvscope makes only an output's own")
    (tmp_path / "file").write_text("")
    usage_error(*run_main(capsys, "run", "--out", str(tmp_path / "file" / "a")), r"is a file, not a folder")
    assert sorted(os.listdir(tmp_path)) == ["file", "more", "runs"]
    refused = subprocess.run([sys.executable, "-m", "kvscope.cli.main", "run", "--out", str(tmp_path / "new" / "a"),
                              "--model", "no-such-model", "-q"], capture_output=True, text=True, env=ENV, timeout=300)
    usage_error(refused.returncode, refused.stderr, "unknown model")
    assert not (tmp_path / "new").exists()  # made for the check, removed when the run was refused


def test_blank_prompt_lines_are_counted_and_said(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Hello\n\nWorld\n   \nAgain\n")  # the final newline ends line 5: no blank line 6
    args = ["run", "--prompts", str(prompts), "--output-len", "2", "--num-blocks", "16", "--out", str(tmp_path / "r")]
    assert main(args) == 0
    assert "p.txt: skipped 2 blank lines (lines 2, 4); 3 prompts, one per other line" in capsys.readouterr().err
    assert main([*args, "-q"]) == 0
    assert "skipped" not in capsys.readouterr().err
    import kvscope

    assert len(kvscope.load(tmp_path / "r.metrics.jsonl").requests) == 3


def test_the_progress_bar_counts_requests_whose_total_never_changes(monkeypatch):
    """The bar's total was the sum of max_tokens and became the tokens made at the end (566/632, then
    566/566) when EOS ended requests early; in requests it is known from the start."""
    from types import SimpleNamespace

    import tqdm.auto

    from kvscope.cli import run as cli_run
    from kvscope.runs.background.status import RunStatus

    bars = []

    class Bar:
        def __init__(self, total, **kwargs):
            self.total, self.n, self.totals = total, 0, [total]
            bars.append(self)

        def update(self, n):
            self.n += n
            self.totals.append(self.total)

        def set_postfix_str(self, *args, **kwargs) -> None:
            pass

        refresh = close = lambda self: None

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    kv = SimpleNamespace(block_usage=0.5)
    steps = [SimpleNamespace(num_output_tokens=3, num_finished=f, num_running=3 - f, num_waiting=0, kv=kv)
             for f in (0, 1, 0, 2)]

    class FakeRun:
        status, workload, num_finished, records = RunStatus.RUNNING, [object()] * 3, 0, []

        @property
        def done(self):
            if steps:
                self.records.append(steps.pop(0))
                self.num_finished = sum(r.num_finished for r in self.records)
                return False
            return True

    cli_run._watch(FakeRun(), quiet=False)
    assert len(bars) == 1 and set(bars[0].totals) == {3} and bars[0].n == 3


def test_plan_reads_a_bare_small_number_as_a_unit_left_out(capsys):
    usage_error(*run_main(capsys, "plan", "--model", "llama-7b", "--gpu-mem", "40"),
                r"--gpu-mem: '40' would be 40 bytes: did you mean 40GiB\?")
    usage_error(*run_main(capsys, "plan", "--model", "llama-7b", "--gpu-mem", "40GiB", "--reserve", "2"),
                r"--reserve: '2' would be 2 bytes: did you mean 2GiB\?")
    assert main(["plan", "--model", "llama-7b", "--gpu-mem", str(40 << 30), "--weights", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu_mem"] == 40 << 30


def test_a_folder_named_kvscope_that_shadows_the_package_is_named(tmp_path):
    """Python started in a folder holding a kvscope/ folder imports that instead of the package (before
    any of kvscope runs); the kvscope command, which gets the package, says which folder to rename."""
    script = Path(sys.executable).parent / "kvscope"
    if not script.exists():
        pytest.skip("the kvscope console script is not installed next to this python")
    (tmp_path / "kvscope").mkdir()
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=ENV, cwd=tmp_path,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("kvscope ")
    assert f"the folder {tmp_path / 'kvscope'} is not the kvscope package" in proc.stderr
    assert "rename that folder" in proc.stderr
    elsewhere = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=ENV,
                               cwd=tmp_path / "kvscope", timeout=60)
    assert elsewhere.returncode == 0 and "kvscope: warning" not in elsewhere.stderr
