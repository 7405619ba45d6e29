"""Making a file system change durable, for the places that promise something survives a crash
(a capture confirms its slot, a lake's metastore is marked created, only after this), a
user's output file replaced whole or not at all, and the file lock that keeps two writers of
one thing apart across processes."""

from __future__ import annotations

import fcntl
import os
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
        temporary.replace(path)
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
