"""Bad prompts among good ones, bad trace files given to ``kvscope view``, and an output file that
cannot be written at the end of a run.

The decision for prompts (docs/reliability.md): ``Engine.generate`` refuses a whole batch up front
(``prompt 3: ...``), as a library call should; a background run (``%kvscope``, ``%%kvscope``,
``kvscope run --prompts``) fails only the request that cannot run, with a message naming its line,
and runs the others: nobody loses a long run's results to one line, and the report shows which.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output
from reliability_util import FIGURES, assert_every_request_ended, assert_files_valid, tiny_engine, workload

import kvscope
from kvscope import Engine, SamplingParams
from kvscope.cli.main import main
from kvscope.runs.background.live import LiveRun, Outputs

pytestmark = pytest.mark.timeout(120)
LONG = "tell me about paged attention " * 12  # about 100 tokens of the tiny tokenizer
GOOD = ["Hello world", "What is a KV cache?"]


def _alone(prompts: list[str], max_tokens: int) -> list[list[int]]:
    engine = Engine("tiny", num_blocks=64, max_model_len=48, telemetry=False)
    return [engine.generate([p], SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0].token_ids
            for p in prompts]



def test_a_too_long_prompt_in_a_cell_fails_alone(ip):
    cell = f"{GOOD[0]}\n\n{LONG}\n{GOOD[1]}\n"
    with capture_output() as captured:
        run = ip.run_cell_magic("kvscope", "--max-model-len 48 --output-len 4 --ignore-eos --num-blocks 64 --wait -o",
                                cell)
    assert run.status == "finished"
    reasons = [o.finish_reason for o in run.outputs]
    assert reasons == ["length", "error", "length"], reasons
    error = run.outputs[1].error
    assert error.startswith("line 3 of the cell: the prompt has ") and "the model allows at most 47" in error
    assert [run.outputs[i].token_ids for i in (0, 2)] == _alone(GOOD, 4)  # the others ran as if alone
    assert f"1 request failed (first: {error})" in captured.stdout
    assert_every_request_ended(run, {"length", "error"})


def test_a_too_long_prompt_in_a_prompts_file_fails_alone(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{GOOD[0]}\n{LONG}\n\n{GOOD[1]}\n", encoding="utf-8")
    prefix = tmp_path / "run"
    code = main(["run", "--prompts", str(prompts), "--max-model-len", "48", "--output-len", "4", "--ignore-eos",
                 "--num-blocks", "64", "--out", str(prefix), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("kvscope: error: 1 of 3 requests failed (the files hold the run); first: line 2 of "
                          "prompts.txt: the prompt has "), err
    run = kvscope.load(f"{prefix}.trace.json")
    assert_files_valid(run, trace=Path(f"{prefix}.trace.json"), metrics=Path(f"{prefix}.metrics.jsonl"),
                       html=Path(f"{prefix}.html"))
    assert assert_every_request_ended(run, {"length", "error"}) == {"length": 2, "error": 1}
    assert run.summary()["output_tokens"] == 8


def test_generate_still_refuses_the_whole_batch_up_front():
    engine = tiny_engine(max_model_len=48)
    with pytest.raises(ValueError, match=r"prompt 1: the prompt has \d+ tokens but the model allows at most 47"):
        engine.generate(["Hello", LONG, "world"])
    assert engine.step_index == 0 and not engine.has_unfinished_requests()


def _chrome_trace() -> str:
    return json.dumps({"traceEvents": [{"name": "aten::mm", "ph": "X", "ts": 1, "dur": 2, "pid": 7, "tid": 7}],
                       "displayTimeUnit": "ms"})


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, str]:
    run = LiveRun(tiny_engine(), workload(2, out=4), dashboard=False).start().wait(timeout=60)
    folder = tmp_path_factory.mktemp("saved")
    return {"trace": run.save_trace(folder / "t.json").read_text(),
            "metrics": run.save_metrics(folder / "m.jsonl").read_text()}


@pytest.mark.parametrize(("name", "make", "why"), [
    ("cut.trace.json", lambda s: s["trace"][: s["trace"].rindex("}")], r"truncated JSON"),
    ("cut-in-a-string.json", lambda s: s["trace"][: s["trace"].index('"kvscope engine"') + 5], r"truncated JSON"),
    ("cut.metrics.jsonl", lambda s: "\n".join(s["metrics"].splitlines()[:-1]) + "\n", r"truncated \(no end line"),
    ("empty.json", lambda s: "", r"the file is empty"),
    ("notes.json", lambda s: "these are my notes, not JSON", r"not valid JSON"),
    ("profile.json", lambda s: _chrome_trace(), r"a Chrome/Perfetto trace from another tool"),
    ("list.json", lambda s: "[1, 2, 3]", r"JSON list, not a kvscope trace"),
    ("newer.json", lambda s: s["trace"].replace('"version":1', '"version":99'), r"version 99 is newer"),
])
def test_view_refuses_bad_trace_files(saved, tmp_path, capsys, name, make, why):
    path = tmp_path / name
    path.write_text(make(saved), encoding="utf-8")
    code = main(["view", str(path)])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    FIGURES["bad inputs refused in one line"] += 1
    assert err.startswith(f"kvscope: error: {path}: "), err  # names the file ...
    assert re.search(why, err), (why, err)  # ... and the problem
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no report, no temp file


def test_a_file_that_cannot_be_written_loses_nothing_else(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the trace's folder should be")
    files = Outputs(trace=blocker / "run.trace.json", metrics=tmp_path / "run.metrics.jsonl",
                    html=tmp_path / "run.html")
    run = LiveRun(tiny_engine(), workload(3, out=6), outputs=files, dashboard=False).start().wait(timeout=60)
    assert run.status_text == "finished · could not write trace"
    assert set(run.files.errors) == {"trace"} and "not-a-folder" in run.files.errors["trace"]
    assert set(run.files.written) == {"metrics", "html"}
    assert_files_valid(run, metrics=files.metrics, html=files.html)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder", "run.html", "run.metrics.jsonl"]
    assert blocker.read_text() == "a file where the trace's folder should be"


def test_a_bad_line_is_named_by_the_files_own_line_number(tmp_path, capsys):
    """Only \\n (and \\r\\n) end a line: a prompt holding U+2028, a form feed or a lone CR is one prompt, so
    the line the error names is the line an editor shows (str.splitlines() used to make it line 5)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(f"{GOOD[0]}\u2028still line 1\x0cand\rthis\r\n{LONG}\n{GOOD[1]}\n".encode())
    code = main(["run", "--prompts", str(prompts), "--max-model-len", "48", "--output-len", "2", "--ignore-eos",
                 "--num-blocks", "64", "--out", str(tmp_path / "run"), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "1 of 3 requests failed" in err and "first: line 2 of prompts.txt: the prompt has" in err, err
    run = kvscope.load(tmp_path / "run.trace.json")
    assert run.meta["texts"][run.requests.request_id.iloc[0]]["prompt"] == f"{GOOD[0]}\u2028still line 1\x0cand\rthis"
    FIGURES["bad inputs refused in one line"] += 1


def test_prompts_from_a_pipe(tmp_path):
    """`--prompts /dev/stdin` reads the pipe (it is no regular file, and was once called missing)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "kvscope.cli.main", "run", "--prompts", "/dev/stdin",
                           "--output-len", "2", "--num-blocks", "32", "--out", str(tmp_path / "run"), "-q"],
                          input=f"{GOOD[0]}\n\n{GOOD[1]}\n", capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr
    run = kvscope.load(tmp_path / "run.metrics.jsonl")
    assert sorted(t["prompt"] for t in run.meta["texts"].values()) == sorted(GOOD)
