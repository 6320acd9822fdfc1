"""Atomic writes: the one way jaxil replaces a file or directory on disk.

Every writer puts its bytes into a hidden sibling
`.<name>.<host>-<pid>-<token>.tmp` and moves it over `<name>` with `os.replace`
(a directory is swapped in with two renames, see
[`atomic_dir`][jaxil.runs.io_atomic.atomic_dir]). A reader therefore sees the
old version or the new one, never a half-written one, and two processes (or
threads) writing the same path never share a temporary file.

A writer that is killed leaves its temporary behind, possibly as large as the
finished file. So before each write the temporaries of *dead* writers to the
same path are removed: those whose process no longer exists on this host,
those written by other hosts more than `STALE_AFTER_S` ago, and those in
the pre-`io_atomic` formats (`.<name>.<pid>.tmp` of a dead pid;
`.<name>.tmp`, `.<name>.<random>.tmp` and `.<name>.tmp-<hex>`, which
carry no owner). Temporaries of live writers are left alone.

[`check_file_writable`][jaxil.runs.io_atomic.check_file_writable] proves,
before the work that produces a file, that it can be written (the
directory-level check of run directories is
[`jaxil.runs.rundir.check_writable`][jaxil.runs.rundir.check_writable]).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Iterator, Union

PathLike = Union[str, os.PathLike]

# Another host's temporary is taken for dead after this long (no write of
# jaxil's takes a day; its pid cannot be checked from here).
STALE_AFTER_S = 24 * 3600.0

_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_OWNED = re.compile(r"^(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]+\.(?P<kind>tmp|old)$")
# Temporary names that earlier jaxil versions leave behind, recognised so that
# they are cleaned up too: `.x.<pid>.tmp` (owner known, host assumed this
# one); `.x.tmp`, mkstemp's `.x.<8 chars>.tmp` and the vault's
# `.x.tmp-<hex>` / `.x.old-<hex>` (no owner: always stale).
_LEGACY_PID = re.compile(r"^(?P<pid>\d+)\.tmp$")
_LEGACY = re.compile(r"^(tmp|[a-z0-9_]{8}\.tmp|(tmp|old)-[0-9a-f]{8})$")


def temp_sibling(path: PathLike, kind: str = "tmp") -> Path:
    """A fresh hidden name beside `path`, unique to this process and call."""
    path = Path(path)
    return path.with_name(f".{path.name}.{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}.{kind}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _is_stale(entry: Path, rest: str) -> bool:
    m = _LEGACY_PID.match(rest)
    if m is not None:
        return not _pid_alive(int(m["pid"]))
    m = _OWNED.match(rest)
    if m is None:
        return bool(_LEGACY.match(rest))
    if m["host"] == _HOST:
        return not _pid_alive(int(m["pid"]))
    try:
        age = time.time() - entry.lstat().st_mtime
    except FileNotFoundError:
        return False
    return age > STALE_AFTER_S


def _remove(entry: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def clear_stale(path: PathLike) -> list[Path]:
    """Remove what killed writes to `path` left beside it; return what was removed.

    A killed directory swap ([`atomic_dir`][jaxil.runs.io_atomic.atomic_dir])
    can leave the previous version as `.<name>.*.old` with nothing at `path`;
    that version is put back rather than deleted.
    """
    path = Path(path)
    prefix = f".{path.name}."
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix)]
    except FileNotFoundError:
        return []
    removed = []
    for name in sorted(names):
        entry = path.parent / name
        rest = name[len(prefix):]
        if not _is_stale(entry, rest):
            continue
        if rest.endswith("old") or rest.startswith("old-"):
            if not os.path.lexists(path):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(entry, path)  # the previous version, swapped out by a killed write
                continue
        _remove(entry)
        removed.append(entry)
    return removed


def check_free_space(path: PathLike, need: int, what: str = "the output") -> None:
    """Refuse, before the work that produces it, an output of up to `need`
    bytes at `path` on a disk with less free space.

    Raises:
      OSError: ENOSPC, one line naming the path, both sizes and the fix.
    """
    where = Path(path).absolute()
    probe = where if where.exists() else where.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        raise OSError(errno.ENOSPC,
                      f"not enough free space for {what} (up to {need / 2**20:.1f} MiB, "
                      f"{free / 2**20:.1f} MiB free)",
                      str(where))


def check_file_writable(path: PathLike, what: str = "output file", *, append: bool = False,
                        fix: str = "choose a path you can write to, or fix its permissions"
                        ) -> Path:
    """Prove that a file can be written at `path` before the work that
    produces it, or raise a one-line error naming it and the fix.

    Creates the parent directory and writes (then removes) a probe beside
    `path` under the name of this module's temporaries, which is what an
    atomic write needs. `append=True` (a file grown in place, such as an
    answer cache) also opens an existing file for appending; its content is
    untouched. `what` names the path in the message (e.g. `"--out"`),
    `fix` says what to do.

    Raises:
      IsADirectoryError: `path` is a directory.
      PermissionError: `path` cannot be written (read-only, a parent is a
        file, ...).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a directory; give a file path such as "
                                f"{path / 'out'}")
    probe = temp_sibling(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
        if append and path.exists():
            with open(path, "ab"):
                pass
    except OSError as e:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise PermissionError(f"{what} {path} is not writable ({e.strerror or e}); {fix}") from None
    return path


def fsync_dir(d: PathLike) -> None:
    """Make a rename inside `d` durable (where the platform allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_file(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: PathLike, *, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary file path; when the block succeeds, it replaces `path`.

    The caller writes (and closes) the file at the yielded path. On success it
    is fsynced (`fsync=True`) and moved over `path` with `os.replace`; on any
    exception it is deleted and `path` is untouched. Leftovers of killed writes
    to `path` are removed first
    ([`clear_stale`][jaxil.runs.io_atomic.clear_stale]).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file path inside it")
    path.parent.mkdir(parents=True, exist_ok=True)
    clear_stale(path)
    tmp = temp_sibling(path)
    try:
        yield tmp
        if fsync:
            _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    if fsync:
        fsync_dir(path.parent)


def atomic_write_bytes(path: PathLike, data: bytes, *, fsync: bool = True) -> Path:
    """Write `data` to `path` atomically (see
    [`atomic_path`][jaxil.runs.io_atomic.atomic_path]); return the path."""
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: PathLike, text: str, *, fsync: bool = True) -> Path:
    """Write `text` (UTF-8) to `path` atomically (see
    [`atomic_path`][jaxil.runs.io_atomic.atomic_path]); return the path."""
    return atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


@contextlib.contextmanager
def atomic_dir(path: PathLike) -> Iterator[Path]:
    """Yield a temporary directory path (not yet created); when the block
    succeeds, it replaces the directory `path`.

    The swap is two renames (old version aside, new one in) and then the old
    version is deleted; a kill between the renames leaves the old version
    aside, and the next write to `path` puts it back first. On an exception
    the temporary is deleted and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clear_stale(path)
    tmp = temp_sibling(path)
    old = temp_sibling(path, "old")
    try:
        yield tmp
        if os.path.lexists(path):
            os.rename(path, old)
        os.rename(tmp, path)
    except BaseException:
        _remove(tmp)
        if os.path.lexists(old) and not os.path.lexists(path):
            os.rename(old, path)
        raise
    _remove(old)
    fsync_dir(path.parent)
