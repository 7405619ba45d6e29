"""Making a file system change durable, for the places that promise something survives a crash
(a capture confirms its slot, a lake's metastore is marked created, only after this), and the
file lock that keeps two writers of one thing apart across processes."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """Flush `directory`'s entries (a file created, renamed or removed in it) to the disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
