"""A kernel build folder another user could have written is never used (issue 38 item 2): ownership and modes
checked like ssh's keys (kernels/build_trust.py) before the folder is used and before its library is loaded;
``$KVSCOPE_EXTENSIONS_DIR`` is expanded or refused, never made into a literal ``~user`` folder."""

from __future__ import annotations

import logging
import os

import pytest

from kvscope.kernels import cpu_build, cpu_paged
from kvscope.kernels.build_trust import UntrustedBuildFolder

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def _key() -> cpu_build.BuildKey:
    return cpu_build.BuildKey(source="s" * 64, flags=("-O3",), torch="t", python="cpython-311", compiler="c",
                              cpu="x86_64 0")


def _loader(calls: list[str]):
    return lambda: calls.append("loaded")


@pytest.fixture
def root(tmp_path, monkeypatch):
    folder = tmp_path / "ext"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("KVSCOPE_EXTENSIONS_DIR", str(folder))
    return folder


def test_a_folder_of_mine_is_used_and_made_private(root):
    folder = cpu_build.build_folder("ext", _key())
    assert os.stat(folder).st_mode & 0o777 == 0o700
    calls: list[str] = []
    assert cpu_build.build_once(folder, "ext", _key(), _loader(calls)) is True
    assert calls == ["loaded"]


@as_root
def test_a_root_owned_by_another_user_is_refused(root):
    os.chown(root, NOBODY, NOBODY)
    with pytest.raises(UntrustedBuildFolder, match=r"ext \(a folder above the kernel.s\) is owned by nobody"):
        cpu_build.build_folder("ext", _key())


@as_root
def test_a_planted_library_is_never_loaded(root):
    """The attack: a consistent entry, then the library swapped by another user (same name, same mtime)."""
    folder = cpu_build.build_folder("ext", _key())
    lib = os.path.join(folder, "ext.so")
    with open(lib, "w") as f:
        f.write("planted")
    os.chown(lib, NOBODY, NOBODY)
    calls: list[str] = []
    with pytest.raises(UntrustedBuildFolder, match=r"ext.so is owned by nobody"):
        cpu_build.build_once(folder, "ext", _key(), _loader(calls))
    assert calls == []


@pytest.mark.parametrize("what", ["folder", "library", "root", "link"])
def test_anything_writable_or_linked_by_others_is_refused(root, what):
    folder = cpu_build.build_folder("ext", _key())
    lib = os.path.join(folder, "ext.so")
    with open(lib, "w") as f:
        f.write("x")
    if what == "folder":
        os.chmod(folder, 0o777)
    elif what == "library":
        os.chmod(lib, 0o666)
    elif what == "root":
        os.chmod(root, 0o777)  # others could rename the folder and put theirs in its place
    else:
        os.symlink("/tmp", os.path.join(folder, "build.ninja.d"))
        if os.geteuid() == 0:
            os.lchown(os.path.join(folder, "build.ninja.d"), NOBODY, NOBODY)
        else:
            pytest.skip("a link owned by another user needs root")
    calls: list[str] = []
    with pytest.raises(UntrustedBuildFolder, match="kvscope never loads a kernel that another user could have written"):
        cpu_build.build_once(folder, "ext", _key(), _loader(calls))
    assert calls == []


def test_a_sticky_world_writable_folder_above_is_fine(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /tmp
    monkeypatch.setenv("KVSCOPE_EXTENSIONS_DIR", str(shared / "mine"))
    folder = cpu_build.build_folder("ext", _key())
    assert cpu_build.build_once(folder, "ext", _key(), lambda: None) is True


def test_an_unknown_user_in_the_extensions_dir_is_refused_not_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVSCOPE_EXTENSIONS_DIR", "~nosuchuser-kvscope/x")
    with pytest.raises(ValueError, match="'~nosuchuser-kvscope' names no user"):
        cpu_build.build_folder("ext", _key())
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KVSCOPE_EXTENSIONS_DIR", "~/ext")  # ~ is expanded
    assert cpu_build.build_folder("ext", _key()).startswith(str(tmp_path / "ext") + os.sep)


@as_root
def test_the_kernel_loader_falls_back_to_torch_and_says_why(root, monkeypatch, caplog):
    os.chown(root, NOBODY, NOBODY)
    monkeypatch.setattr(cpu_build, "build_once", lambda *a, **k: pytest.fail("a refused folder was used"))
    cpu_paged.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=cpu_paged.log.name):
            assert cpu_paged.load() is False
    finally:
        cpu_paged.load.cache_clear()
    assert "owned by nobody" in caplog.text and "using the torch path" in caplog.text
