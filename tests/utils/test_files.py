"""kvscope.utils.files: atomic writes, the writability probe, file modes from the umask, the output checks (identity,
no folder or device), temp files removed at exit, stdlib only."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvscope.utils.files import (
    OutputPathError,
    atomic_write,
    check_outputs,
    not_a_file,
    same_file,
    unwritable,
)


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
from kvscope.utils.files import atomic_write
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
    code = ("import sys, kvscope.utils.files; heavy = {'torch', 'numpy', 'pandas', 'bokeh'} & set(sys.modules); "
            "print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]"


# ---- outputs: never an input, another output, a folder or a device -------------------------------------
def test_same_file_is_identity_not_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("a prompt")
    (tmp_path / "sub").mkdir()
    os.link(tmp_path / "p.txt", tmp_path / "hard.txt")
    os.symlink(tmp_path / "p.txt", tmp_path / "soft.txt")
    for other in ("p.txt", "./p.txt", "sub/../p.txt", str(tmp_path / "p.txt"), "hard.txt", "soft.txt"):
        assert same_file("p.txt", other), other
    assert not same_file("p.txt", "new.txt") and not same_file("new.txt", "p.txt")
    assert same_file("new.txt", "./sub/../new.txt")  # two outputs not written yet: the same path
    assert not same_file("new.txt", "other.txt")


def test_check_outputs_refuses_an_input_by_identity(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a prompt")
    os.symlink(prompts, tmp_path / "link.html")
    for output in (prompts, tmp_path / "link.html", tmp_path / "sub" / ".." / "p.txt"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(OutputPathError, match=r"--html '.*' is the same file as --prompts '.*p.txt'; writing it "
                                                  r"would destroy that input"):
            check_outputs({"--prompts": prompts}, {"--trace": tmp_path / "t.json", "--html": output})
    assert prompts.read_text() == "a prompt"
    check_outputs({"--prompts": prompts}, {"--trace": tmp_path / "t.json", "--html": None})  # None: not asked for


def test_check_outputs_refuses_two_outputs_on_one_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputPathError, match=r"--trace 'x' and --metrics '\./x' are the same file"):
        check_outputs({}, {"--trace": "x", "--metrics": "./x"})
    Path("x").write_text("old")
    os.link("x", "y")
    with pytest.raises(OutputPathError, match=r"--trace 'x' and --metrics 'y' are the same file"):
        check_outputs({}, {"--trace": "x", "--metrics": "y"})
    check_outputs({}, {"--trace": "x", "--metrics": "z"})


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_check_outputs_refuses_what_is_no_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for path, what in (("/dev/null", "a character device"), (tmp_path / "fifo", r"a named pipe \(FIFO\)"),
                       (tmp_path, "a folder")):
        with pytest.raises(OutputPathError, match=rf"^--html '{re.escape(str(path))}' is {what}, not a regular file"):
            check_outputs({}, {"--html": path})
    assert not_a_file(tmp_path / "absent") is None and not_a_file("/dev/null") == "a character device"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_atomic_write_never_replaces_a_fifo_a_folder_or_a_device(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    targets = [tmp_path / "fifo", tmp_path / "folder"]
    if os.geteuid() == 0:  # as root os.replace would replace even a device node with a regular file
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append(tmp_path / "null")
    for path in targets:
        before = os.lstat(path).st_mode
        with pytest.raises(OSError, match="not a regular file") as caught:
            atomic_write(path, lambda f: f.write("report"))
        assert caught.value.filename == str(path)
        assert os.lstat(path).st_mode == before  # still what it was
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in targets)  # and no temp file


def test_errors_name_the_users_path_not_the_temp_file(tmp_path, monkeypatch):
    with pytest.raises(OSError) as caught:  # no file can be created in /proc, root included
        atomic_write("/proc/kvscope-test.json", lambda f: f.write("x"))
    assert caught.value.filename == "/proc/kvscope-test.json" and ".tmp" not in str(caught.value)

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))

    monkeypatch.setattr(os, "replace", cross_device)
    with pytest.raises(OSError, match="Invalid cross-device link") as caught:
        atomic_write(tmp_path / "run.json", lambda f: f.write("x"))
    assert caught.value.filename == str(tmp_path / "run.json") and ".tmp" not in str(caught.value)
    assert os.listdir(tmp_path) == []


# A write cut off by the end of the process (a second Ctrl-C: the writer is a daemon thread).
CUT_OFF_CHILD = """
import sys, threading, time
from kvscope.utils.files import atomic_write
started = threading.Event()
def slow(f):
    f.write("half a report")
    started.set()
    time.sleep(60)
threading.Thread(target=atomic_write, args=(sys.argv[1], slow), daemon=True).start()
started.wait(30)
print("writing", flush=True)
"""


def test_a_write_cut_off_by_the_exit_leaves_no_temp_file(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CUT_OFF_CHILD, str(tmp_path / "run.html")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "writing", proc.stderr
    assert os.listdir(tmp_path) == []  # neither the file (never finished) nor its temp file
