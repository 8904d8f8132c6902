"""Where and when the CPU kernel is built (kernels/cpu_build.py): a folder per build key (torch, compiler,
flags, CPU features), a notice whenever a build runs, one builder at a time. The locking tests build a fake
extension (a function that writes the ``.so``), so they take about a second; the last test checks the real
build that ``tests/conftest.py`` made at the start of the session."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import multiprocessing
import os
import shutil
import subprocess
import time

import pytest

from kvscope.kernels import cpu_build, cpu_paged


def _key(**changes) -> cpu_build.BuildKey:
    base = cpu_build.BuildKey(source="s" * 64, flags=("-O3", "-march=native"), torch="2.13.0 /venv-a/torch",
                              python="cpython-311", compiler="/usr/bin/g++-12 g++ 12.2.0", cpu="x86_64 0123")
    return dataclasses.replace(base, **changes)


def test_the_key_changes_with_each_thing_the_binary_depends_on():
    digests = {_key().digest(), _key(torch="2.13.0 /venv-b/torch").digest(),
               _key(torch="2.12.0 /venv-a/torch").digest(),
               _key(flags=("-O2", "-march=native")).digest(), _key(compiler="/usr/bin/clang++ 17").digest(),
               _key(cpu="x86_64 4567").digest(), _key(cpu="aarch64 0123").digest(), _key(source="t" * 64).digest(),
               _key(python="cpython-312").digest()}
    assert len(digests) == 9
    assert _key().digest() == _key().digest()


def test_the_cpu_features_come_from_the_flags_line(tmp_path):
    def features(flags: str) -> str:
        path = tmp_path / "cpuinfo"
        path.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
        return cpu_build.cpu_features(str(path))

    assert features("fpu sse avx2 avx512f") == features("avx512f fpu sse avx2")  # the order does not matter
    assert features("fpu sse avx2 avx512f") != features("fpu sse avx2")  # a missing feature does
    assert cpu_build.cpu_features(str(tmp_path / "missing"))  # no /proc/cpuinfo (macOS): still a key


def test_the_key_reads_the_compiler_and_torch_of_this_process(tmp_path, monkeypatch):
    fake = tmp_path / "fake-c++"
    fake.write_text("#!/bin/sh\necho 'fake-c++ (Test) 99.1'\n")
    fake.chmod(0o755)
    plain = cpu_build.current_key("src", ["-O3"])
    monkeypatch.setenv("CXX", str(fake))
    other = cpu_build.current_key("src", ["-O3"])
    assert other.compiler == f"{fake} fake-c++ (Test) 99.1"
    assert other.digest() != plain.digest()
    assert os.path.dirname(cpu_build.torch.__file__) in plain.torch
    assert cpu_build.current_key("src", ["-O2"]).digest() != other.digest()


def test_the_folder_is_keyed_under_kvscope_extensions_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSCOPE_EXTENSIONS_DIR", str(tmp_path))
    folder = cpu_build.build_folder("ext", _key())
    assert folder == str(tmp_path / f"ext_{_key().digest()}") and os.path.isdir(folder)
    assert cpu_build.build_folder("ext", _key(cpu="x86_64 9999")) != folder


def _fake_load(folder: str, log: str, seconds: float = 0.0):
    """A stand-in for ``load_inline``: builds (counted in ``log``) only where the library is missing."""

    def load() -> None:
        if not os.path.exists(os.path.join(folder, "fake.so")):
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
            time.sleep(seconds)
            with open(os.path.join(folder, "fake.so"), "w") as f:
                f.write("built")

    return load


def test_a_notice_prints_whenever_a_build_runs(tmp_path, capsys):
    folder, log = str(tmp_path / "ext"), str(tmp_path / "log")
    os.makedirs(folder)
    assert cpu_build.build_once(folder, "fake", _key(), _fake_load(folder, log))
    err = capsys.readouterr().err
    assert "building the CPU decode-attention kernel" in err and folder in err and "built" in err
    assert json.loads((tmp_path / "ext" / "key.json").read_text())["cpu"] == "x86_64 0123"
    assert not cpu_build.build_once(folder, "fake", _key(), _fake_load(folder, log))  # found: no build, no notice
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja is not on PATH")
def test_a_library_that_ninja_would_rebuild_counts_as_a_build(tmp_path):
    (tmp_path / "fake.so").write_text("old")
    (tmp_path / "in.txt").write_text("x")
    (tmp_path / "build.ninja").write_text("rule copy\n  command = cp $in $out\nbuild out.txt: copy in.txt\n")
    assert cpu_build.needs_build(str(tmp_path), "fake")  # out.txt is missing: ninja has work to do
    subprocess.run(["ninja", "-C", str(tmp_path)], check=True, capture_output=True, timeout=30)
    assert not cpu_build.needs_build(str(tmp_path), "fake")
    os.remove(tmp_path / "fake.so")
    assert cpu_build.needs_build(str(tmp_path), "fake")


def _build_in_child(folder: str, log: str, barrier, results) -> None:
    barrier.wait(timeout=30)
    results.put(cpu_build.build_once(folder, "fake", _key(), _fake_load(folder, log, seconds=1.0), wait_s=30))


def test_two_processes_started_at_once_build_once(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_build, "NOTICE_AFTER_S", 0.2)
    folder, log = str(tmp_path / "ext"), str(tmp_path / "log")
    os.makedirs(folder)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    children = [ctx.Process(target=_build_in_child, args=(folder, log, barrier, results)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
    assert [child.exitcode for child in children] == [0, 0]
    assert sorted(results.get(timeout=5) for _ in children) == [False, True]  # one built, one waited and loaded
    with open(log) as f:
        assert len(f.read().split()) == 1


def test_a_build_elsewhere_that_takes_too_long_falls_back_to_the_torch_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cpu_build, "NOTICE_AFTER_S", 0.05)
    folder, log = str(tmp_path / "ext"), str(tmp_path / "log")
    os.makedirs(folder)
    with open(f"{folder}.lock", "a+") as held:  # another process building (flock is per open file)
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        start = time.monotonic()
        with pytest.raises(cpu_build.BuildWaitTimeout, match="another process"):
            cpu_build.build_once(folder, "fake", _key(), _fake_load(folder, log), wait_s=0.3)
        assert time.monotonic() - start < 5
    assert "waiting for another process" in capsys.readouterr().err
    assert not os.path.exists(log)

    def timeout(*args, **kwargs):
        raise cpu_build.BuildWaitTimeout("another process has been building the kernel for 300 s")

    monkeypatch.setattr(cpu_build, "build_once", timeout)
    assert cpu_paged.load.__wrapped__() is False  # load() without its cache: the torch path


def test_a_killed_builds_torch_lock_file_does_not_block(tmp_path):
    folder, log = str(tmp_path / "ext"), str(tmp_path / "log")
    os.makedirs(folder)
    (tmp_path / "ext" / "lock").write_text("")  # torch's FileBaton, left by a build killed mid-way
    assert cpu_build.build_once(folder, "fake", _key(), _fake_load(folder, log))
    assert not (tmp_path / "ext" / "lock").exists()


def test_the_real_kernel_is_built_in_its_keyed_folder():
    if not cpu_paged.load():
        pytest.skip("the C++ kernel cannot be built here (no compiler or ninja)")
    key = cpu_build.current_key(cpu_paged._SOURCE, cpu_paged.build_flags())
    folder = cpu_build.build_folder(cpu_paged.NAME, key)
    assert os.path.exists(os.path.join(folder, f"{cpu_paged.NAME}.so"))
    assert not cpu_build.needs_build(folder, cpu_paged.NAME)
    assert os.path.basename(folder) == f"{cpu_paged.NAME}_{key.digest()}"
