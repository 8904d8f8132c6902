"""kvscope.files: atomic writes, the writability probe, file modes from the umask, stdlib only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import pytest

from kvscope.files import atomic_write, unwritable


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")

    def fails(f):
        f.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(path, fails)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.json"]  # no temp file left behind
    atomic_write(path, lambda f: f.write("new"))
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["out.json"]


def test_atomic_write_creates_missing_folders(tmp_path):
    path = atomic_write(tmp_path / "a" / "b" / "run.json", lambda f: f.write("{}"))
    assert path.read_text() == "{}"


def test_concurrent_writers_each_leave_a_whole_file(tmp_path):
    path = tmp_path / "run.json"
    texts = [str(i) * 5000 for i in range(8)]
    threads = [threading.Thread(target=atomic_write, args=(path, lambda f, t=t: f.write(t))) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert path.read_text() in texts and os.listdir(tmp_path) == ["run.json"]


def test_unwritable_names_the_problem_and_leaves_nothing(tmp_path):
    assert unwritable(tmp_path / "run.json") is None and os.listdir(tmp_path) == []
    assert unwritable(tmp_path / "missing" / "run.json") == "No such file or directory"
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert unwritable(blocker / "run.json") == "Not a directory"


# In a child process: the umask is process-wide, and the test must not change it for anyone else.
UMASK_CHILD = """
import os, stat, sys
os.umask(0o027)
from kvscope.files import atomic_write
path = atomic_write(sys.argv[1], lambda f: f.write("x"))
print(oct(stat.S_IMODE(os.stat(path).st_mode)), oct(os.umask(0o027)))
"""


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_files_get_the_mode_open_would_give_and_the_umask_is_untouched(tmp_path):
    out = subprocess.run([sys.executable, "-c", UMASK_CHILD, str(tmp_path / "run.json")], check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    assert out == ["0o640", "0o27"]  # 0o666 & ~umask, like open(); the umask as the child set it
    with open(tmp_path / "plain", "w") as f:  # and in this process: the same mode as open() gives
        f.write("x")
    mine = atomic_write(tmp_path / "mine", lambda f: f.write("x"))
    assert stat.S_IMODE(os.stat(mine).st_mode) == stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)


def test_importing_it_pulls_in_no_heavy_package():
    code = ("import sys, kvscope.files; heavy = {'torch', 'numpy', 'pandas', 'bokeh'} & set(sys.modules); "
            "print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]"
