"""The on-disk kernel cache: location, content keys, entries, publishing, per-key locks.

Layout under `knobs.cache_dir()` (created with user-only permissions):

    kernels/<key[:2]>/<key>/<name>.so     the artifact
    kernels/<key[:2]>/<key>/<name>.cpp    the source it was built from, for people to read
    kernels/<key[:2]>/<key>/meta.json     written last: the commit marker, with the checksum
    locks/<key>.lock                      one flock per key (released by the kernel on death)
    tmp/                                  private build and staging directories (same filesystem)
    failed/<name>.cpp, <name>.log         sources and compiler output of failed builds
    tuning/<machine>.json                 the tuning database (runtime/dispatch/tuning.py)

The root and each of these directories must belong to the user and not be writable by group or
others (runtime/building/cache_owner.py): root() checks them before anything is read or written there,
and check_entry an entry's directory and its shard before the artifact is read.

An entry counts only when meta.json is there and the artifact's sha256 matches it. Entries
appear atomically: they are assembled in a staging directory under tmp/ (artifact and source
first, meta.json last) and renamed into place in one step, so a reader sees all or nothing.
Existing artifacts are never modified in place, so a process that has loaded one is never
disturbed by another process replacing or removing the entry.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterator

from convgen.codegen.errors import CacheError
from convgen.codegen.keys import canonical_json, sha256_text

from . import cache_owner
from .. import knobs
from ..stats import bump

_SUBDIRS = ("kernels", "locks", "tmp", "failed", "tuning")
_KEY_SCHEMA = "convgen-artifact-v1"
_META = "meta.json"
_STALE_TMP_S = 24 * 3600.0


# ---------------------------------------------------------------------------------- location


# A directory that stands in for the kernel cache in this thread (and the tasks it starts), and the
# variable that places it: the generic tier's (runtime/dispatch/tiers.py) keeps its libraries apart.
_rooted: contextvars.ContextVar[tuple[Path, str] | None] = contextvars.ContextVar("convgen_cache_root", default=None)


@contextlib.contextmanager
def rooted(path: Path, setting: str) -> Iterator[Path]:
    """Within the block, this thread's cache is `path` (placed by the environment variable `setting`,
    named in errors): built, looked up and locked there with the cache's own rules."""
    token = _rooted.set((path, setting))
    try:
        yield path
    finally:
        _rooted.reset(token)


def root() -> Path:
    """The cache directory, created (user-only permissions) with its subdirectories.

    Before anything there is read or written, the root and each subdirectory must be the user's
    own and not writable by group or others (runtime/building/cache_owner.py); once they have passed, a
    call costs one stat per directory until one of them is replaced, removed, re-owned or
    re-moded. Raises CacheError
    naming CONVGEN_CACHE_DIR and the path when the directory cannot be used.
    """
    override = _rooted.get()
    path = override[0] if override else knobs.cache_dir()
    directories = [path, *(path / sub for sub in _SUBDIRS)]
    if cache_owner.known(directories):
        return path
    try:
        if not os.path.lexists(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path, 0o700)
                os.chmod(path, 0o700)  # the umask may have removed bits we wanted
            except FileExistsError:
                pass  # another process created it first
        elif not path.is_dir() and not path.is_symlink():
            _unusable(path, "it exists and is not a directory")
        cache_owner.check_dir(path)
        for sub in _SUBDIRS:
            directory = path / sub
            if not os.path.lexists(directory):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(directory, 0o700)
            cache_owner.check_dir(directory, "the kernel cache's subdirectory")
    except OSError as e:
        _unusable(path, e.strerror or str(e))
    if not os.access(path, os.W_OK | os.X_OK):
        _unusable(path, "it is not writable")
    cache_owner.remember(directories)
    return path


def _unusable(path: Path, reason: str):
    override = _rooted.get()
    name = override[1] if override else "CONVGEN_CACHE_DIR"
    what = "the generic kernels' directory" if override else "the kernel cache directory"
    setting = os.environ.get(name)
    where = f"{name}={setting!r}" if setting else f"{name} is not set"
    raise CacheError(
        f"{what} {str(path)!r} is not usable: {reason} ({where}). "
        f"Set {name} to a writable directory."
    )


# ---------------------------------------------------------------------------------- keys


def artifact_key(
    source_text: str,
    command: list[str],
    compiler_identity: str,
    target_key: str,
    version: str,
) -> str:
    """The content key of a built artifact: every ingredient that can change the binary.

    source_text: the complete translation unit.
    command: the full compile command in its canonical form (placeholders, not temp paths).
    compiler_identity: the compiler's resolved path and `--version` output.
    target_key: Target.key() (ISA or GPU arch and its parameters).
    version: convgen's version.
    """
    return sha256_text(
        _KEY_SCHEMA, source_text, canonical_json(list(command)), compiler_identity, target_key, version
    )


# ---------------------------------------------------------------------------------- entries


def is_key(text: str) -> bool:
    """Whether `text` looks like a key from artifact_key() (a lowercase sha256 hex digest)."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def entry_dir(key: str) -> Path:
    """Where the entry for `key` lives (whether or not it exists)."""
    if not is_key(key):
        raise CacheError(f"invalid cache key {key!r}; expected a lowercase sha256 hex digest")
    return root() / "kernels" / key[:2] / key


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_entry(directory: Path) -> tuple[Path | None, str | None]:
    """(artifact path, None) for a valid entry; (None, problem) for a bad one; (None, None) if absent."""
    if not directory.exists():
        return None, None
    cache_owner.check_dir(directory.parent, "the kernel cache's shard directory")
    cache_owner.check_dir(directory, "the kernel cache entry")
    meta_path = directory / _META
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "meta.json is missing"
    except (OSError, ValueError) as e:
        return None, f"meta.json is unreadable ({e})"
    if not isinstance(meta, dict) or not {"artifact", "sha256", "key"} <= meta.keys():
        return None, "meta.json lacks the artifact, sha256 or key field"
    if meta["key"] != directory.name:
        return None, f"meta.json names key {meta['key']!r}, not the directory's"
    artifact = directory / str(meta["artifact"])
    if artifact.parent != directory:
        return None, f"meta.json names an artifact outside the entry: {meta['artifact']!r}"
    try:
        digest = file_sha256(artifact)
    except OSError as e:
        return None, f"artifact {artifact.name} is unreadable ({e.strerror or e})"
    if digest != meta["sha256"]:
        return None, f"artifact {artifact.name} has sha256 {digest[:16]}..., meta.json says {str(meta['sha256'])[:16]}..."
    return artifact, None


def report_corrupt(directory: Path, problem: str) -> None:
    """Warn that an entry is corrupt and will be rebuilt, and count it."""
    bump("corrupt_rebuilt")
    warnings.warn(
        f"convgen: cache entry {directory} is corrupt ({problem}); rebuilding it",
        RuntimeWarning,
        stacklevel=3,
    )


def lookup(key: str) -> Path | None:
    """The artifact of a valid entry, else None. A corrupt entry is reported with a warning
    (naming its path) and None is returned so the caller rebuilds it."""
    directory = entry_dir(key)
    artifact, problem = check_entry(directory)
    if problem is not None:
        report_corrupt(directory, problem)
    return artifact


def read_meta(key: str) -> dict | None:
    """The metadata of the entry for `key`, or None when there is none readable."""
    try:
        return json.loads((entry_dir(key) / _META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def private_dir(prefix: str) -> Path:
    """A fresh private directory under <cache>/tmp (same filesystem as the entries)."""
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-{prefix}-", dir=root() / "tmp"))


def publish(key: str, name: str, artifact: Path, source: Path, meta: dict) -> Path:
    """Move a built artifact and its source into the entry for `key`; returns the artifact path.

    `artifact` and `source` must be on the cache's filesystem (build them under private_dir()).
    The caller must hold key_lock(key). Any previous (corrupt) entry is replaced.
    """
    final = entry_dir(key)
    stage = private_dir(f"entry-{key[:12]}")
    try:
        so_path = stage / f"{name}{artifact.suffix}"
        os.replace(artifact, so_path)
        os.replace(source, stage / f"{name}{source.suffix}")
        record = dict(meta)
        record.update(
            name=name,
            key=key,
            artifact=so_path.name,
            source=f"{name}{source.suffix}",
            sha256=file_sha256(so_path),
            size=so_path.stat().st_size,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        )
        _write_atomic(stage / _META, json.dumps(record, indent=2, sort_keys=True) + "\n")
        final.parent.mkdir(mode=0o700, exist_ok=True)
        _remove_entry(final)
        os.rename(stage, final)
    except OSError as e:
        raise CacheError(f"could not publish cache entry {final}: {e}") from e
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return final / so_path.name


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _remove_entry(directory: Path) -> bool:
    """Take an entry out of the cache atomically (rename away, then delete)."""
    if not directory.exists():
        return False
    trash = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-trash-", dir=directory.parents[2] / "tmp"))
    try:
        os.replace(directory, trash / "entry")
    except FileNotFoundError:
        return False  # someone else removed it first
    finally:
        shutil.rmtree(trash, ignore_errors=True)
    return True


def remove(key: str) -> bool:
    """Remove the entry for `key` (e.g. an artifact that would not load). Takes the key's lock."""
    with key_lock(key):
        return _remove_entry(entry_dir(key))


# ---------------------------------------------------------------------------------- locks


@contextlib.contextmanager
def key_lock(key: str) -> Iterator[Path]:
    """Hold the build lock of `key` (flock on <cache>/locks/<key>.lock).

    The kernel releases the lock when the holder exits or is killed, so a dead builder never
    blocks anyone. Waits up to knobs.lock_timeout_s(), then raises CacheError.
    """
    entry_dir(key)  # validates the key and creates the directories
    path = root() / "locks" / f"{key}.lock"
    timeout = knobs.lock_timeout_s()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        deadline = time.monotonic() + timeout
        delay = 0.005
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    waited = True
                    bump("lock_waits")
                if time.monotonic() >= deadline:
                    raise CacheError(
                        f"timed out after {timeout:g} s waiting for the build lock {path}: another "
                        f"process is building the same kernel. Wait for it, or raise "
                        f"CONVGEN_LOCK_TIMEOUT (seconds)."
                    ) from None
                time.sleep(delay)
                delay = min(delay * 1.5, 0.2)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock


# ---------------------------------------------------------------------------------- maintenance


def entries() -> list[Path]:
    """Every entry directory currently in the cache."""
    kernels = root() / "kernels"
    return sorted(d for shard in kernels.iterdir() if shard.is_dir() for d in shard.iterdir() if d.is_dir())


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def info() -> dict:
    """Where the cache is, how many entries it holds and how many bytes it uses."""
    base = root()
    return {
        "dir": str(base),
        "entries": len(entries()),
        "bytes": _tree_bytes(base),
        "failed": len([p for p in (base / "failed").glob("*") if p.suffix in (".cpp", ".cu")]),
    }


def verify(remove: bool = False) -> list[tuple[Path, str]]:
    """(entry path, problem) for every bad entry; with remove=True the bad ones are deleted."""
    problems = []
    for directory in entries():
        _, problem = check_entry(directory)
        if problem is not None:
            problems.append((directory, problem))
            if remove:
                _remove_if_still_bad(directory)
    return problems


def _remove_if_still_bad(directory: Path) -> None:
    if not is_key(directory.name):  # junk that nobody builds: no lock needed
        _remove_entry(directory)
        return
    with key_lock(directory.name):
        # re-check: another process may have rebuilt it meanwhile
        if check_entry(directory)[1] is not None:
            _remove_entry(directory)


def clear() -> int:
    """Remove every entry, the failed-build files, abandoned temporary directories and the SIMT
    simulator's precompiled headers (`sim-pch/`, rebuilt by the next simulator build).

    Returns the number of entries removed. Processes that already loaded an artifact keep
    working (files are unlinked, never truncated); running builds are not disturbed.
    """
    removed = sum(_remove_entry(d) for d in entries())
    base = root()
    for f in (base / "failed").iterdir():
        with contextlib.suppress(OSError):
            f.unlink()
    for d in (base / "tmp").iterdir():
        if _abandoned(d):
            shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(base / "sim-pch", ignore_errors=True)   # the next simulator build makes it again
    return removed


def _abandoned(path: Path) -> bool:
    """A tmp directory whose creating process is gone (or that is older than a day)."""
    try:
        if time.time() - path.stat().st_mtime > _STALE_TMP_S:
            return True
        pid = int(path.name.split("-", 1)[0])
    except (OSError, IndexError, ValueError):
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
