"""Where the CPU kernel (``cpu_paged.py``) is built, and by whom: one folder per build key, one builder at a time.

The folder is keyed by what the binary depends on (``BuildKey``): the C++ source, the compiler flags,
torch's version and install path, the Python ABI, the compiler (its resolved path and ``--version``) and
the CPU (its machine type and feature flags: the kernel is built with ``-march=native`` and must never be
loaded on a CPU without those features). Two virtualenvs, two checkouts or two machines sharing a home
folder each get their own build instead of rebuilding one folder in turn. The folder is
``<root>/kvscope_cpu_paged_<digest>`` under ``$KVSCOPE_EXTENSIONS_DIR`` if set, else under torch's
extension cache (``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions/py<ver>_<device>``); its
``key.json`` records the key.

``build_once`` holds an exclusive ``fcntl`` lock on ``<folder>.lock`` while it builds or loads: a second
process waits for the first one's build (saying so after a second), then finds it done; past ``WAIT_S`` it
gives up with ``BuildWaitTimeout`` and the caller keeps the torch path. The kernel frees the lock when a
process dies, so a killed build never blocks the next one (torch's own ``lock`` file, which a killed build
leaves behind and which torch then waits on forever, is removed while the lock is held). A notice is printed
to stderr whenever a build will run: the ``.so`` is missing, or ninja has work to do (a dry run).

Trust (``build_trust.py``): the folder, its lock, everything in it and the folders above it must be this user's
alone (as ssh requires of its keys), checked before the folder is used and again before the library is loaded;
else ``UntrustedBuildFolder`` and the torch path. ``$KVSCOPE_EXTENSIONS_DIR`` is expanded (``~``, ``~user``) and
refused if it names no folder that can exist (``~nosuchuser/x``); a folder kvscope creates there is mode 700.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .build_trust import check_contents, check_folder, check_own

WAIT_S = 300.0  # how long a process waits for another one's build before it keeps the torch path
NOTICE_AFTER_S = 1.0  # a wait shorter than this (another process loading a built kernel) goes unsaid


class BuildWaitTimeout(TimeoutError):
    """Another process held the build lock for longer than the wait allows."""


@dataclass(frozen=True, slots=True)
class BuildKey:
    """What a built kernel depends on; ``digest()`` names its folder."""

    source: str  # sha256 of the C++ source
    flags: tuple[str, ...]
    torch: str  # version and install folder
    python: str  # the interpreter's ABI tag (cpython-311)
    compiler: str  # resolved path and the first line of its --version
    cpu: str  # machine type and sha256 of the CPU's feature flags

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def current_key(source: str, flags: list[str]) -> BuildKey:
    """The key of a build of ``source`` with ``flags`` in this process, on this machine."""
    return BuildKey(
        source=hashlib.sha256(source.encode()).hexdigest(),
        flags=tuple(flags),
        torch=f"{torch.__version__} {os.path.dirname(os.path.realpath(torch.__file__))}",
        python=sys.implementation.cache_tag or sys.version,
        compiler=compiler_id(),
        cpu=cpu_features(),
    )


def compiler_id() -> str:
    """torch's C++ compiler (``$CXX``, else ``c++``): its resolved path and version line; "missing" if absent."""
    name = os.environ.get("CXX", "c++")
    path = shutil.which(name)
    if path is None:
        return f"{name}: missing"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"{os.path.realpath(path)} {out.splitlines()[0] if out else '?'}"


def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The machine type and a hash of the first CPU's feature flags (``flags`` on x86, ``Features`` on Arm);
    where there is no ``/proc/cpuinfo``, the processor name and torch's vector capability."""
    flags = ""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                field, _, value = line.partition(":")
                if field.strip() in ("flags", "Features"):
                    flags = " ".join(sorted(value.split()))
                    break
    except OSError:
        pass
    if not flags:
        flags = f"{platform.processor()} {torch.backends.cpu.get_cpu_capability()}"
    return f"{platform.machine()} {hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def build_folder(name: str, key: BuildKey) -> str:
    """``<root>/<name>_<digest>``, created and checked (``build_trust``): the root is ``$KVSCOPE_EXTENSIONS_DIR``,
    else torch's cache."""
    folder_name = f"{name}_{key.digest()}"
    root = os.environ.get("KVSCOPE_EXTENSIONS_DIR")
    if not root:
        from torch.utils.cpp_extension import _get_build_directory

        folder = _get_build_directory(folder_name, verbose=False)  # creates it
    else:
        folder = os.path.join(extensions_root(root), folder_name)
        os.makedirs(folder, mode=0o700, exist_ok=True)
    check_folder(folder)
    return folder


def extensions_root(root: str) -> str:
    """``$KVSCOPE_EXTENSIONS_DIR`` as an absolute path, ``~`` and ``~user`` expanded; a ``~`` that names no
    user (it would become a folder named ``~nosuchuser``) is a ``ValueError``."""
    expanded = os.path.expanduser(root)
    if expanded.startswith("~"):
        raise ValueError(f"KVSCOPE_EXTENSIONS_DIR={root!r}: {expanded.split(os.sep)[0]!r} names no user on this "
                         "machine (give an absolute path, or ~ for your home)")
    return os.path.abspath(expanded)


def needs_build(folder: str, name: str) -> bool:
    """Will loading build? The library is missing, or ninja (a dry run of the folder's build.ninja) has
    work to do (a header of torch changed under the same version and path, say)."""
    if not os.path.exists(os.path.join(folder, f"{name}.so")):
        return True
    ninja = shutil.which("ninja")
    if ninja is None or not os.path.exists(os.path.join(folder, "build.ninja")):
        return False
    try:
        done = subprocess.run([ninja, "-C", folder, "-n"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode != 0 or "no work to do" not in done.stdout


def build_once(folder: str, name: str, key: BuildKey, load: Callable[[], None], wait_s: float | None = None) -> bool:
    """Run ``load`` (build if needed, then load) holding the folder's lock; True if it built. A notice goes to
    stderr before a build and after it. Raises ``BuildWaitTimeout`` past ``wait_s`` (``WAIT_S``) of waiting."""
    lock_path = f"{folder}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a+") as lock:
        check_own(lock_path, os.fstat(fd))
        _acquire(lock.fileno(), folder, WAIT_S if wait_s is None else wait_s)
        try:
            check_folder(folder)
            check_contents(folder)  # nothing in it another user could have written (build_trust.py)
            stale = os.path.join(folder, "lock")  # torch's baton: left behind by a killed build
            if os.path.exists(stale):
                os.remove(stale)
            build = needs_build(folder, name)
            if build:
                print(f"kvscope: building the CPU decode-attention kernel for this torch, compiler and CPU "
                      f"(~30-60 s, once per build key) in {folder}", file=sys.stderr, flush=True)
            start = time.monotonic()
            load()
            if build:
                print(f"kvscope: built the CPU decode-attention kernel in {time.monotonic() - start:.0f} s",
                      file=sys.stderr, flush=True)
                with open(os.path.join(folder, "key.json"), "w", encoding="utf-8") as f:
                    json.dump(asdict(key), f, indent=1)
            return build
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _acquire(fd: int, folder: str, wait_s: float) -> None:
    """An exclusive flock on ``fd``, polled; a notice once the wait passes ``NOTICE_AFTER_S``."""
    start = time.monotonic()
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waited = time.monotonic() - start
            if waited >= wait_s:
                raise BuildWaitTimeout(f"another process has been building the kernel in {folder} for "
                                       f"{waited:.0f} s") from None
            if not told and waited >= NOTICE_AFTER_S:
                print(f"kvscope: waiting for another process building the CPU decode-attention kernel in {folder} "
                      f"(up to {wait_s:.0f} s, then the torch path)", file=sys.stderr, flush=True)
                told = True
            time.sleep(0.05)
