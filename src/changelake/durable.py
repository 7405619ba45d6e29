"""Making a file system change durable, for the places that promise something survives a crash
(a capture confirms its slot, a lake's metastore is marked created, only after this), a
user's output file replaced whole or not at all, and the file lock that keeps two writers of
one thing apart across processes.

The rule: nothing is acknowledged to a source (a replication slot confirmed, Kafka group
offsets committed, a `--state` file a later run trusts) before the data it covers is on the
disk. Spark's writers and Delta's local log store close their files without `fsync`, so the
lake syncs what they wrote from the driver (`sync_tree`): a Hive-format table's new file sets
before the commit point (the view change) and the commit record after it; a Delta table's
changed parts after its log append, before the caller acknowledges anything. A file replaced
by rename is synced before the rename and its directory after (`replaced_whole`)."""

from __future__ import annotations

import fcntl
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def fsync_directory(directory: Path) -> None:
    """Flush `directory`'s entries (a file created, renamed or removed in it) to the disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path | str) -> None:
    """Flush the content of the file at `path` to the disk, whoever wrote it (on Linux an
    fsync of any descriptor of a file flushes all its dirty pages: Spark's writer closes its
    files without syncing them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://|file:", re.IGNORECASE)


def local_path(path: Path | str) -> Path | None:
    """`path` as a local path: a plain path, or a `file:` URI; None for another scheme
    (`s3a://`, `hdfs://`: its store says when a write is durable, not `fsync`)."""
    text = str(path)
    if _URI.match(text) is None:
        return Path(text)
    if not text.lower().startswith("file:"):
        return None
    return Path(re.sub(r"^file:(//)?", "", text, flags=re.IGNORECASE))


SYNC_SLACK_SECONDS = 2.0
"""How far before a commit's start a file's modification time may lie and still be synced as
written by it (`sync_tree(newer_than=)`): file systems stamp times from a coarse clock."""


def sync_tree(path: Path | str, top: Path | str | None = None, *,
              newer_than: float | None = None) -> int:
    """Make what was written at `path` durable before anything that relies on it is
    acknowledged: every regular file under `path` (or `path` itself), then every directory
    under it from the deepest up, then the directories from `path`'s parent up to `top`
    (inclusive; None: only `path`'s parent), so each new entry is on the disk in its parent.
    `newer_than` (a `time.time()`) limits the files and directories under `path` to those
    modified at or after it: the parts of a long-lived tree a commit changed (a directory's
    modification time moves when an entry is added, renamed or removed in it). Local paths only
    (see `local_path`); returns how many files and directories were synced."""
    local = local_path(path)
    if local is None:
        return 0
    local = Path(os.path.abspath(local))
    if not local.exists():
        return 0
    synced = 0

    def fresh(entry: Path) -> bool:
        return newer_than is None or entry.lstat().st_mtime >= newer_than

    if local.is_dir():
        directories: list[Path] = []
        for root, _dirs, files in os.walk(local, topdown=False):  # the deepest first
            here = Path(root)
            for name in files:
                entry = here / name
                if not entry.is_symlink() and entry.is_file() and fresh(entry):
                    fsync_file(entry)
                    synced += 1
            if here == local or fresh(here):
                directories.append(here)
        for directory in directories:  # each after every entry made in it
            fsync_directory(directory)
            synced += 1
    else:
        fsync_file(local)
        synced += 1
    stop = None if top is None else local_path(top)
    stop = local.parent if stop is None else Path(os.path.abspath(stop))
    parent = local.parent
    while local != stop:
        fsync_directory(parent)
        synced += 1
        if parent == stop or stop not in parent.parents:
            break  # at `top`, or `top` is not above `path`: its parent only
        parent = parent.parent
    return synced


@contextmanager
def replaced_whole(path: Path) -> Iterator[BinaryIO]:
    """A file to write `path`'s new content to: written beside it and renamed over it when the
    block ends without an error, so a failure half-way leaves no half-written file and does
    not clobber an earlier one. A `path` that exists and is not a regular file (`/dev/null`,
    a FIFO, `/dev/stdout`) is written in place: a rename would put a file where the device
    was (as root, in `/dev` itself)."""
    try:
        special = not stat.S_ISREG(path.stat().st_mode)
    except FileNotFoundError:
        special = False
    if special:
        with open(path, "wb") as fo:
            yield fo
        return
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as fo:
            yield fo
            fo.flush()
            os.fsync(fo.fileno())  # the content on the disk before the name points at it
        temporary.replace(path)
        fsync_directory(path.parent)  # and the rename too, before anyone is told
    finally:
        temporary.unlink(missing_ok=True)


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on the file `path` (created if missing), blocking until the
    holder is done. The kernel releases it when the process dies, so a kill -9 leaves no stale
    lock. `flock` belongs to an open file description: taking it twice in one process blocks
    forever."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def try_exclusive_lock(path: Path) -> Iterator[bool]:
    """`exclusive_lock` without waiting: yields True with the `flock` held for the block, or
    False at once where another holds it, or the file cannot be opened to lock (a directory
    this process may not write to)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock
