"""Outputs that would destroy inputs or each other: every output path of ``kvscope run``, ``%kvscope`` and
``kvscope view`` is checked before any work against every input (the prompts file, the trace being viewed, the
model folder's files) and every other output, as the same file by identity (links, hard links, other spellings),
and must be a regular file or absent (a folder, ``/dev/null``, a FIFO are refused); a folder given as ``--out``
takes the files inside it. Each refusal is one line naming both paths, and nothing is written or changed."""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from reliability_util import FIGURES

import kvscope
from kvscope import Engine, SamplingParams
from kvscope.cli.main import main
from kvscope.runs.result.run import Run

pytestmark = pytest.mark.timeout(120)
PROMPTS = "Hello there\nWhat is a KV cache?\n"


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """A working folder with a prompts file, a link and a hard link to it, a FIFO and a model folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text(PROMPTS)
    os.symlink("p.txt", tmp_path / "link.html")
    os.link(tmp_path / "p.txt", tmp_path / "hard.html")
    os.mkfifo(tmp_path / "pipe.json")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama"}')
    return tmp_path


@pytest.fixture
def no_engine(monkeypatch):
    """Fail the test if anything gets as far as building an engine: the checks come before any work."""
    def refuse(*args, **kwargs):
        raise AssertionError("an engine was built: the output check came too late")

    monkeypatch.setattr(Engine, "__init__", refuse)


def unchanged(folder: Path) -> None:
    assert (folder / "p.txt").read_text() == PROMPTS
    assert stat.S_ISFIFO(os.stat(folder / "pipe.json").st_mode)
    assert sorted(p.name for p in folder.iterdir()) == ["hard.html", "link.html", "model", "p.txt", "pipe.json"]
    assert os.listdir(folder / "model") == ["config.json"]


# (options, what the one line says): the same refusal from `kvscope run` and from %kvscope
CLASHES = [
    ("--prompts p.txt --html p.txt", r"--html 'p.txt' is the same file as --prompts 'p.txt'; writing it would destroy"),
    ("--prompts p.txt --trace ./sub/../p.txt", r"--trace '.*p.txt' is the same file as --prompts 'p.txt'"),
    ("--prompts p.txt --html link.html", r"--html 'link.html' is the same file as --prompts 'p.txt'"),
    ("--prompts p.txt --metrics hard.html", r"--metrics 'hard.html' is the same file as --prompts 'p.txt'"),
    ("--trace x.json --metrics ./x.json", r"--trace 'x.json' and --metrics '(\./)?x.json' are the same file"),
    ("--trace r.json --html r.json", r"--trace 'r.json' and --html 'r.json' are the same file"),
    ("--model model --html model/config.json", r"--html 'model/config.json' is the same file as the model folder's "
                                               r"config.json"),
    ("--html /dev/null", r"--html: '/dev/null' is a character device, not a regular file"),
    ("--trace pipe.json", r"--trace: 'pipe.json' is a named pipe \(FIFO\), not a regular file"),
    ("--metrics model", r"--metrics: 'model' is a folder"),
]


@pytest.mark.parametrize(("options", "why"), CLASHES, ids=[c[0] for c in CLASHES])
def test_run_and_magic_refuse_outputs_that_destroy(folder, no_engine, ip, capsys, options, why):
    (folder / "sub").mkdir()
    code = main(["run", *shlex.split(options), "--out", "out", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    cli_line = err.strip().removeprefix("kvscope: error: ")
    assert re.search(why, cli_line), (why, cli_line)
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("kvscope", f"{options} -q")
    assert str(caught.value) == cli_line.replace("'kvscope run --help'", "'%kvscope --help'")
    FIGURES["outputs refused before any work (both faces)"] += 1
    (folder / "sub").rmdir()
    unchanged(folder)


@pytest.mark.parametrize(("options", "why"), [
    ("--out p --trace p.html", r"--trace 'p.html' and the html file of --out 'p.html' are the same file"),
    ("--out model/config --metrics model/config.trace.json", r"are the same file"),
    ("--out p.txt --prompts p.txt.html", r"is the same file as --prompts"),  # (outputs are checked first)
])
def test_outputs_made_from_out_are_checked_too(folder, no_engine, capsys, options, why):
    code = main(["run", *shlex.split(options), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and re.search(why, err), err
    unchanged(folder)


def test_a_folder_given_as_out_takes_the_files_inside_it(folder, capsys):
    (folder / "runs").mkdir()
    code = main(["run", "--requests", "2", "--prompt-len", "8", "--output-len", "2", "--num-blocks", "16",
                 "--out", "runs", "-q"])
    assert code == 0, capsys.readouterr().err
    assert sorted(os.listdir(folder / "runs")) == ["kvscope-run.html", "kvscope-run.metrics.jsonl",
                                                   "kvscope-run.trace.json"]
    assert not [p for p in os.listdir(folder) if p.startswith("runs.")]  # nothing next to it
    assert len(kvscope.load(folder / "runs" / "kvscope-run.trace.json").requests) == 2
    code = main(["run", "--out", "missing/deeper/", "-q"])  # one missing folder is made (tests/cli/test_main.py)
    assert code == 2 and "the folder of --out 'missing/deeper' does not exist" in capsys.readouterr().err


@pytest.fixture
def trace(folder) -> Path:
    engine = Engine("tiny", num_blocks=16)
    engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=3, ignore_eos=True))
    return Run.from_engine(engine).save_trace(folder / "t.json")


@pytest.mark.parametrize(("output", "why"), [
    ("t.json", r"-o 't.json' is the same file as the trace 't.json'; writing it would destroy that input"),
    ("./t.json", r"-o '.*t.json' is the same file as the trace"),
    ("trace-link.html", r"-o 'trace-link.html' is the same file as the trace"),
    ("/dev/null", r"-o '/dev/null' is a character device, not a regular file"),
    ("pipe.json", r"-o 'pipe.json' is a named pipe \(FIFO\)"),
])
def test_view_refuses_an_output_that_is_its_trace_or_no_file(trace, folder, capsys, output, why):
    os.symlink("t.json", folder / "trace-link.html")
    before = trace.read_bytes()
    code = main(["view", "t.json", "-o", output])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and re.search(why, err), err
    assert trace.read_bytes() == before and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(os.listdir(folder)) == ["hard.html", "link.html", "model", "p.txt", "pipe.json", "t.json",
                                          "trace-link.html"]  # no report, no temp file
    FIGURES["outputs refused before any work (kvscope view)"] += 1


@pytest.mark.parametrize(("argv", "why"), [
    (["compare", "t.json", "t.json", "-o", "/dev/null"], r"the comparison path '/dev/null' is a character device"),
    (["compare", "t.json", "t.json", "-o", "c.html", "--csv", "pipe.json"], r"'pipe.json' is a named pipe"),
    (["compare", "t.json", "t.json", "-o", "trace-link.html"], r"is the input '.*t.json'"),
    (["sweep", "--block-size", "8,16", "--prompts", "p.txt", "-o", "p.txt"],
     r"-o 'p.txt' is the same file as --prompts 'p.txt'"),
    (["sweep", "--block-size", "8,16", "--prompts", "p.txt", "-o", "s.html", "--csv", "hard.html"],
     r"--csv 'hard.html' is the same file as --prompts 'p.txt'"),
])
def test_compare_and_sweep_check_their_outputs_before_any_work(trace, folder, no_engine, capsys, argv, why):
    os.symlink("t.json", folder / "trace-link.html")
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and re.search(why, err), err
    assert (folder / "p.txt").read_text() == PROMPTS
    assert sorted(os.listdir(folder)) == ["hard.html", "link.html", "model", "p.txt", "pipe.json", "t.json",
                                          "trace-link.html"]
    FIGURES["outputs refused before any work (compare, sweep)"] += 1
