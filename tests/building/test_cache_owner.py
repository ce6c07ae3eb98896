"""The cache's owner (DESIGN.md "Command-line dtypes and the cache's owner", runtime/building/cache_owner.py).

A cache root or subdirectory that another user owns, or that group or others may write, is
refused with a CacheError naming CONVGEN_CACHE_DIR, the path, its owner and mode, and the fix,
before anything is read or written there:

- a root owned by another user (mode 0700 and 0777), through cache.root(), a convolution that
  needs a kernel, and `convgen cache info` (exit 1, one line naming CONVGEN_CACHE_DIR);
- a root writable by group or others; a root that passed once and is then made world-writable;
- each subdirectory (kernels, locks, tmp, failed, tuning) made world-writable;
- the eager launcher (not loaded; `convgen setup` exits 1) and the tuning database;
- a symlink as the root pointing to another user's directory, a symlink owned by another user,
  a subdirectory that is a symlink to a world-writable directory; a symlink of the user's own
  to the user's own directory is accepted.

Another user's directory is made with os.chown to uid 65534 when the tests run as root; run by
anyone else they use a directory that root owns ("/" or the system's temporary directory) and
skip, saying so, only where no such directory has the mode a case needs (or where a symlink
must be given to another user, which only root can do).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import convgen
from convgen.building import cache, cache_owner
from convgen.codegen.errors import CacheError

OTHER_UID = 65534   # "nobody"
SUBDIRS = ("kernels", "locks", "tmp", "failed", "tuning")


@pytest.fixture(autouse=True)
def fresh_check():
    cache_owner.forget()
    yield
    cache_owner.forget()


def foreign_dir(tmp_path: Path, world_writable: bool) -> Path:
    """A directory owned by another user: made by root with chown, or, for anyone else, one root owns."""
    if os.geteuid() == 0:
        path = tmp_path / "others"
        path.mkdir(mode=0o700)
        os.chown(path, OTHER_UID, OTHER_UID)
        os.chmod(path, 0o777 if world_writable else 0o700)
        return path
    for candidate in ("/tmp", "/var/tmp", "/"):
        st = os.stat(candidate)
        if st.st_uid != os.geteuid() and bool(st.st_mode & stat.S_IWOTH) == world_writable:
            return Path(candidate)
    pytest.skip(f"not root, so chown to another uid is impossible, and no directory of another user with "
                f"world_writable={world_writable} exists here")


def refused(match_path: Path, *patterns: str) -> str:
    with pytest.raises(CacheError) as info:
        cache.root()
    message = str(info.value)
    for expected in ("CONVGEN_CACHE_DIR", str(match_path), *patterns):
        assert expected in message, f"{expected!r} missing from: {message}"
    return message


@pytest.mark.parametrize("world_writable", [False, True], ids=["0700", "0777"])
def test_root_owned_by_another_user_is_refused_before_any_write(tmp_path, monkeypatch, world_writable):
    path = foreign_dir(tmp_path, world_writable)
    before = sorted(os.listdir(path))
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    owner = os.stat(path).st_uid
    message = refused(path, f"owned by uid {owner}", f"{stat.S_IMODE(os.stat(path).st_mode):04o}", "chown")
    assert f"uid {os.geteuid()}" in message   # who it must belong to
    assert sorted(os.listdir(path)) == before, "something was written into the refused directory"


def test_a_convolution_and_the_cli_refuse_it_too(tmp_path, monkeypatch):
    path = foreign_dir(tmp_path, world_writable=True)
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    # a problem no other test builds, so its kernel is in no in-process table
    x, w = torch.randn(1, 3, 9, 7), torch.randn(2, 3, 4, 2)
    with pytest.raises(CacheError, match="CONVGEN_CACHE_DIR"):
        convgen.conv2d(x, w, dilation=(2, 1))
    proc = subprocess.run([sys.executable, "-m", "convgen", "cache", "info"], capture_output=True, text=True,
                          env=dict(os.environ), stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "CONVGEN_CACHE_DIR" in proc.stderr and str(path) in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("mode, writers", [(0o777, "group and others"), (0o770, "group"), (0o703, "others")])
def test_root_writable_by_group_or_others_is_refused(tmp_path, monkeypatch, mode, writers):
    path = tmp_path / "cache"
    path.mkdir()
    os.chmod(path, mode)
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    refused(path, f"writable by {writers}", f"{mode:04o}", "chmod go-w")
    assert os.listdir(path) == []
    os.chmod(path, 0o700)   # the fix the message gives
    assert cache.root() == path and sorted(os.listdir(path)) == sorted(SUBDIRS)


def test_root_that_passed_is_checked_again_when_its_mode_changes(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    assert cache.root() == path and stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert cache.root() == path   # remembered
    os.chmod(path, 0o777)
    refused(path, "writable by group and others")


@pytest.mark.parametrize("sub", SUBDIRS)
def test_world_writable_subdirectory_is_refused(tmp_path, monkeypatch, sub):
    path = tmp_path / "cache"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    cache.root()
    cache_owner.forget()
    os.chmod(path / sub, 0o777)
    refused(path / sub, "subdirectory", "writable by group and others", "0777")


def test_symlink_root_to_another_users_directory_is_refused(tmp_path, monkeypatch):
    target = foreign_dir(tmp_path, world_writable=False)
    link = tmp_path / "cache"
    link.symlink_to(target)
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(link))
    refused(link, "symbolic link", f"points to {os.path.realpath(target)!r}", f"owned by uid {os.stat(target).st_uid}")


def test_symlink_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("giving a symlink to another uid (os.lchown) needs root")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "cache"
    link.symlink_to(mine)
    os.lchown(link, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(link))
    refused(link, f"symbolic link (to {str(mine)!r}) owned by uid {OTHER_UID}", "rm ")


def test_subdirectory_symlinked_to_a_world_writable_directory_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    cache.root()
    cache_owner.forget()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (path / "kernels").rmdir()
    (path / "kernels").symlink_to(shared)
    refused(path / "kernels", "symbolic link", f"points to {str(shared)!r}", "writable by group and others")


def test_symlink_to_own_private_directory_is_accepted(tmp_path, monkeypatch):
    mine = tmp_path / "elsewhere"
    mine.mkdir(mode=0o700)
    link = tmp_path / "cache"
    link.symlink_to(mine)
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(link))
    assert cache.root() == link
    assert sorted(os.listdir(mine)) == sorted(SUBDIRS)


def test_entry_directory_is_checked_before_its_artifact_is_read(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    key = "ab" * 32
    entry = cache.entry_dir(key)
    entry.mkdir(parents=True)
    os.chmod(entry, 0o777)
    with pytest.raises(CacheError, match="CONVGEN_CACHE_DIR") as info:
        cache.lookup(key)
    assert str(entry) in str(info.value) and "writable by group and others" in str(info.value)


def test_eager_launcher_and_tuning_database_are_refused_too(tmp_path, monkeypatch, capsys):
    from convgen import cli
    from convgen.api import eager
    from convgen.dispatch import tuning
    from convgen.codegen.target import host_cpu

    path = foreign_dir(tmp_path, world_writable=True)
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    with eager._lock:
        eager._loaded.pop(str(path), None)
    assert eager.module() is None   # nothing loaded from there: eager calls take the Python path
    assert cli.main(["setup"]) == 1
    assert "CONVGEN_CACHE_DIR" in capsys.readouterr().err
    problem = cli.problem_from_args(cli.parser().parse_args(["show", "--input", "1,2,5,5", "--weight", "3,2,3,3"]))
    with pytest.raises(CacheError, match="CONVGEN_CACHE_DIR"):
        tuning.recorded(problem, host_cpu())


def test_a_removed_or_replaced_subdirectory_is_noticed(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    cache.root()
    (path / "tmp").rmdir()
    assert cache.root() == path and (path / "tmp").is_dir()   # recreated, as before the check existed
    os.rename(path / "locks", path / "old-locks")
    (path / "locks").mkdir()
    os.chmod(path / "locks", 0o777)
    refused(path / "locks", "writable by group and others")


def test_a_subdirectory_that_passed_is_checked_again_when_its_mode_changes(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(path))
    cache.root()
    os.chmod(path / "kernels", 0o777)   # no forget(): the remembered identity no longer matches
    refused(path / "kernels", "writable by group and others")
