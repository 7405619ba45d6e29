"""Making a file system change durable, for the places that promise something survives a crash
(a capture confirms its slot, a lake's metastore is marked created, only after this)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """Flush `directory`'s entries (a file created, renamed or removed in it) to the disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
