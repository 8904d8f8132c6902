"""Whether a kernel build folder may be trusted: the rule ssh applies to its keys, applied to what kvscope loads.

A build folder holds a shared library that ``torch.ops.load_library`` maps into the process (its constructors
run at once) and a ``build.ninja`` whose commands ninja runs. Anyone who can write either runs code as the user
of the next ``kvscope run`` (root included). So before a folder is used (``check_folder``) and before the
library in it is loaded (``check_contents``):

- the folder, and every entry in it (``lstat``: a planted link is its own entry), is owned by this process's
  user and is writable by nobody else: not by others, and by its group only where that group is the user's own
  (its primary group with no other members, as many systems make one per user);
- every folder above it, up to ``/``, is owned by this user or by root, and is writable by nobody else unless it
  has the sticky bit (``/tmp``: then no one else can rename or replace what this user made in it).

A folder that breaks a rule is refused with ``UntrustedBuildFolder`` naming the path, its owner and mode, and
the fix; the caller then keeps the torch path (``cpu_paged.load``). Standard library only.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat


class UntrustedBuildFolder(ValueError):
    """A build folder, a file in it or a folder above it could have been written by another user."""


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int, uid: int) -> bool:
    """Is ``gid`` the user's own group: their primary group, with no other member?"""
    try:
        user = pwd.getpwuid(uid)
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    return user.pw_gid == gid and members <= {user.pw_name}


def _refuse(path: str, why: str) -> UntrustedBuildFolder:
    return UntrustedBuildFolder(f"{path} {why}: kvscope never loads a kernel that another user could have written "
                                "(as ssh refuses such keys); set KVSCOPE_EXTENSIONS_DIR to a folder of your own "
                                "(mode 700), or fix the owner and mode")


def check_own(path: str, st: os.stat_result | None = None) -> None:
    """``path`` (not followed if a link) is this user's and writable by nobody else (module doc)."""
    st = st or os.lstat(path)
    uid = os.geteuid()
    if st.st_uid != uid:
        raise _refuse(path, f"is owned by {_user(st.st_uid)}, not by you ({_user(uid)})")
    if st.st_mode & stat.S_IWOTH:
        raise _refuse(path, f"is writable by every user (mode {stat.S_IMODE(st.st_mode):o})")
    if st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid, uid):
        raise _refuse(path, f"is writable by its group (gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):o})")


def check_above(folder: str) -> None:
    """Every folder above ``folder`` (resolved) is this user's or root's, and others cannot replace its entries."""
    uid = os.geteuid()
    path = os.path.dirname(os.path.realpath(folder))
    while True:
        st = os.stat(path)
        if st.st_uid not in (uid, 0):
            raise _refuse(path, f"(a folder above the kernel's) is owned by {_user(st.st_uid)}")
        open_to_others = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP
                                                      and not _private_group(st.st_gid, uid))
        if open_to_others and not st.st_mode & stat.S_ISVTX:
            raise _refuse(path, f"(a folder above the kernel's) is writable by other users without the sticky bit "
                                f"(mode {stat.S_IMODE(st.st_mode):o})")
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def check_folder(folder: str) -> None:
    """The build folder itself and the folders above it (module doc)."""
    check_own(os.path.realpath(folder))
    check_above(folder)


def check_contents(folder: str) -> None:
    """Every entry in the build folder, at any depth (the library, build.ninja, objects), is this user's alone."""
    for root, dirs, files in os.walk(os.path.realpath(folder)):
        for name in dirs + files:
            check_own(os.path.join(root, name))
