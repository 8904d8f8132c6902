"""Bad options to ``%kvscope`` and ``kvscope run`` that ``tests/test_magic.py`` and
``tests/test_cli.py`` do not try: each is refused before anything runs with one line naming the
option and the problem (a ``UsageError``; exit code 2), and nothing is started or written."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from reliability_util import FIGURES, threads_left

from kvscope.cli.main import main

pytestmark = pytest.mark.timeout(120)
UNWRITABLE = "/proc/kvscope-test.json"  # a folder nobody can create files in, root included (Linux)

# (options, what the message must say); {tmp} is a folder of files made by the ``inputs`` fixture.
# Both faces parse with kvscope/options/run.py and check with kvscope/runs/setup/prepare.py, so what both take is
# refused
# with the same line (tests/test_options.py checks that for every option); *_ONLY are the options one
# face has, and the refusals only one face can reach before anything starts.
SHARED = [
    ("--block-size 0", r"--block-size: '0' must be at least 1"),
    ("--block-size 512", r"512'? must be a power of two between 1 and 256"),
    ("--max-num-seqs 0", r"--max-num-seqs: '0' must be at least 1"),
    ("--max-num-batched-tokens -1", r"--max-num-batched-tokens: '-1' must be at least 1"),
    ("--max-model-len 0", r"--max-model-len: '0' must be at least 1"),
    ("--kv-memory 0", r"--kv-memory: size '0' must be positive"),
    ("--step-delay nan", r"--step-delay: 'nan' must be a number of seconds >= 0"),
    ("--step-delay -1", r"--step-delay: '-1' must be a number of seconds >= 0"),
    ("--top-k -1", r"top_k=-1 must be a non-negative integer"),
    ("--top-p 1.5", r"top_p=1.5 must be in \(0, 1\]"),
    ("--temperature inf", r"temperature=inf must be a finite number >= 0"),
    ("--temperature nan", r"temperature=nan must be a finite number >= 0"),
    ("--seed x", r"--seed: invalid int value: 'x'"),
    ("--output-len 0", r"--output-len/--max-new-tokens: length range '0': lengths must be at least 1"),
    ("--requests 1.5", r"--requests/-n: '1.5' is not a whole number"),
    ("--prefix-caching", r"--prefix-caching: expected one argument"),
    ("--model no-such-model", r"unknown model 'no-such-model': use 'tiny'"),
    ("--model=", r"unknown model ''"),
    ("--model {tmp}/no-config", r"model folder '.*no-config' has no config.json"),
    ("--prompts {tmp}/latin1.txt", r"prompts file '.*latin1.txt' is not UTF-8 text \(byte 6 cannot be decoded\)"),
    ("--prompts {tmp}/blank.txt", r"prompts file '.*blank.txt' has no prompts"),
    ("--prompts {tmp}", r"prompts file '.*' is a folder"),
    ("--num-blocks 0", r"--num-blocks: '0' must be at least 1"),
    # once refused by hand in the magic ("--shared-prefix must be >= 0", "--profile must be >= 0 steps")
    ("--shared-prefix -1", r"--shared-prefix: '-1' must be 0 or more"),
    ("--profile -1", r"--profile: '-1' must be 0 or more"),
    ("--frobnicate", r"unrecognized arguments: --frobnicate"),
    # once checked only with --out's paths in the CLI ("the html path ... is a folder", "cannot write the
    # trace file ..."): now by the option's own parser on both faces; --out's paths below
    ("--html {tmp}", r"--html: '.*' is a folder; give a file name"),
    (f"--trace {UNWRITABLE}", r"--trace: cannot write '/proc/kvscope-test.json' \(.+\); choose another folder"),
]
MAGIC_ONLY = [
    ("--rollover 0", r"--rollover: '0' must be at least 1"),
    ("--refresh 0", r"--refresh: '0' must be between 0.5 and 10"),
]
CLI_ONLY = [
    ("--out {tmp}/taken", r"the html path '.*taken.html' is a folder; give a file name"),
    ("--out /proc/kvscope-test --html {tmp}/r.html",
     r"cannot write the trace file '/proc/kvscope-test.trace.json' \(.+\); choose another"),
    # refused by the engine once the model is known: still before any step, still exit 2
    ("--max-model-len 100000", r"max_model_len=100000 exceeds what the model supports \(2048\)"),
    ("--kv-memory 10", r"the KV budget \(kv_cache_memory=10: 10 bytes\) cannot hold one block"),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "latin1.txt").write_bytes("ok\ncafé au lait\n".encode("latin-1"))
    (folder / "blank.txt").write_text("\n   \n\t\n")
    (folder / "no-config").mkdir()
    (folder / "taken.html").mkdir()  # --out {tmp}/taken: its html path is a folder
    return folder



def _one_line(message: str) -> str:
    assert message and "\n" not in message.strip() and "Traceback" not in message, message
    FIGURES["bad inputs refused in one line"] += 1
    return message


@pytest.mark.parametrize(("line", "why"), SHARED + MAGIC_ONLY)
def test_magic_refuses_bad_options(ip, inputs, line, why):
    before = set(threading.enumerate())
    line = line.format(tmp=inputs)
    with pytest.raises(UsageError, match=why) as caught:
        ip.run_line_magic("kvscope", f"{line} --wait -q -o")
    _one_line(str(caught.value))
    assert threads_left(before, timeout=0) == []  # no run was started


@pytest.mark.parametrize(("line", "why"), SHARED + CLI_ONLY)
def test_cli_refuses_bad_options(capsys, inputs, tmp_path, line, why):
    out = tmp_path / "out"
    out.mkdir()
    code = main(["run", "--out", str(out / "run"), "-q", *line.format(tmp=inputs).split(" ")])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    err = _one_line(captured.err)
    assert err.startswith("kvscope: error: "), err
    assert re.search(why, err), (why, err)
    assert captured.out == "" and list(out.iterdir()) == []  # nothing printed as a result, nothing written
