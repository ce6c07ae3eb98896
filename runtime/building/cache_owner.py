"""Whose cache it is: convgen reads and loads only from cache directories that no other user can write.

The kernel cache holds compiled libraries that convgen loads into the process, so a directory
another user owns, or one that group or others may write, would let them run code as you. The
rule (DESIGN.md "Command-line dtypes and the cache's owner"): the cache root and each of its
directories must be owned by the current (effective) user and not writable by group or others;
otherwise `CacheError` names CONVGEN_CACHE_DIR, the path, its owner and mode, and the fix.

A symbolic link is followed, and its target must pass; the link itself must belong to the user
or to root (root's links are the system's), since whoever owns a link can point it elsewhere.

runtime/building/cache.py calls `check_dir` for the root and its subdirectories before it reads or writes
anything there, and for an entry's directory before its artifact is read. Once the root and its
subdirectories have passed, their identities (device, inode, owner and mode, and the link's) are
remembered, so later calls cost one stat per directory (a few µs, on cache accesses only, never on
a call whose kernel is in memory), and the full check (which also recreates a missing
subdirectory) runs again when one of them is replaced, removed, re-owned or re-moded
(`known` / `remember`).
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Sequence

from ..codegen.errors import CacheError

_GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH

_lock = threading.Lock()
_passed: dict[tuple, tuple] = {}   # (root, its subdirectories) -> their identities when they last passed


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o} ({stat.filemode(st.st_mode)})"


def _refuse(subject: str, problem: str, fix: str):
    setting = os.environ.get("CONVGEN_CACHE_DIR")
    where = f"CONVGEN_CACHE_DIR={setting!r}" if setting else "CONVGEN_CACHE_DIR is not set, so this is the default"
    raise CacheError(
        f"{subject} is not safe to use ({where}): {problem}. convgen loads compiled libraries from "
        f"its cache, so the cache and every directory in it must be owned by you ({_owner(os.geteuid())}) and not "
        f"writable by group or others. Fix: {fix}, or set CONVGEN_CACHE_DIR to a directory of your own "
        f"(convgen creates it with mode 0700).")


def check_dir(path: Path, what: str = "the kernel cache directory") -> os.stat_result:
    """The stat of directory `path` (a symlink followed) when it is the user's own and not writable
    by group or others; CacheError otherwise, or when it cannot be examined."""
    me = os.geteuid()
    subject = f"{what} {str(path)!r}"
    try:
        link = os.lstat(path)
        st = os.stat(path) if stat.S_ISLNK(link.st_mode) else link
    except OSError as e:
        _refuse(subject, f"it cannot be examined ({e.strerror or e})", "make it a directory you own")
    fix_path = str(path)
    if stat.S_ISLNK(link.st_mode):
        fix_path = os.path.realpath(path)
        if link.st_uid not in (me, 0):
            _refuse(subject, f"it is a symbolic link (to {fix_path!r}) owned by {_owner(link.st_uid)}, who can "
                             f"point it anywhere", f"remove the link (rm {str(path)!r})")
        subject = f"{subject}, a symbolic link that points to {fix_path!r},"
    if not stat.S_ISDIR(st.st_mode):
        _refuse(subject, "it is not a directory", f"remove it (rm {fix_path!r})")
    if st.st_uid != me:
        _refuse(subject, f"it is owned by {_owner(st.st_uid)}, mode {_mode(st)}",
                f"if it is yours to take, chown {me} {fix_path!r} && chmod 700 {fix_path!r}")
    if st.st_mode & _GROUP_OR_OTHER_WRITE:
        writers = " and ".join(who for bit, who in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others"))
                               if st.st_mode & bit)
        _refuse(subject, f"it is writable by {writers} (owner {_owner(st.st_uid)}, mode {_mode(st)})",
                f"chmod go-w {fix_path!r} (chmod 700 keeps it private)")
    return st


def _identity(path: Path) -> tuple | None:
    try:
        link = os.lstat(path)
        st = os.stat(path) if stat.S_ISLNK(link.st_mode) else link
    except OSError:
        return None
    return (link.st_dev, link.st_ino, link.st_uid, link.st_mode, st.st_dev, st.st_ino, st.st_uid, st.st_mode)


def known(paths: Sequence[Path]) -> bool:
    """Whether the directories `paths` (a root and its subdirectories) passed together before and
    each is still the same directory, with the same owner and mode."""
    key = tuple(str(p) for p in paths)
    with _lock:
        passed = _passed.get(key)
    return passed is not None and passed == tuple(_identity(p) for p in paths)


def remember(paths: Sequence[Path]) -> None:
    """Note that the directories `paths` passed, as they are now."""
    key = tuple(str(p) for p in paths)
    identities = tuple(_identity(p) for p in paths)
    with _lock:
        if None in identities:
            _passed.pop(key, None)
        else:
            _passed[key] = identities


def forget() -> None:
    """Check every root again on its next use (for tests)."""
    with _lock:
        _passed.clear()
