"""A followed table's lag for `status` (`ingest --follow`, see `follow.py`): how many files of
its directory no committed micro-batch has read, and how long the oldest of them has waited
(0 when caught up). A directory listing and one small file of the checkpoint, no Spark, so the
JVM-free `status` asks it too.

The files a committed batch `n` had read are in Spark's offsets log of the checkpoint the
table's last commit names (`offsets/<n>`: its last line is the source's offset, the sorted list
of files seen). Files are named there as the source names them (absolute paths under the
followed directory), and listed as it lists them (hidden and `_` names skipped).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from changelake.lake.layout import SourceOffsets

SPARK_OFFSETS = ("spark", "offsets")
KIND = "files"
"""`SourceOffsets.kind` of a followed directory."""


@dataclass(frozen=True, slots=True)
class FollowLag:
    """`status` of a followed table: its directory, the last committed micro-batch, the files
    not yet committed and the age in seconds of the oldest of them (None, with `error`, when
    the directory or the checkpoint cannot be read)."""

    source: str
    batch: int
    files_behind: int | None
    seconds_behind: float | None
    error: str | None = None


def committed_files(checkpoint: Path, batch: int) -> set[str]:
    """The files the source had handed out up to batch `batch` (Spark's offsets log)."""
    path = checkpoint.joinpath(*SPARK_OFFSETS, str(batch))
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return set(json.loads(lines[-1])["files"])


def listed_files(directory: Path) -> list[Path]:
    """The files the `materialize-cdc` source would read under `directory`."""
    return [f for f in directory.rglob("*")
            if f.is_file() and not any(part.startswith((".", "_"))
                                       for part in f.relative_to(directory).parts)]


def follow_lag(offsets: SourceOffsets, now: float | None = None) -> FollowLag:
    """The lag of a table whose last commit recorded `offsets` (a followed directory's)."""
    mark = offsets.stream
    assert mark is not None
    source = Path(offsets.address)
    try:
        seen = committed_files(Path(mark.directory), mark.batch)
    except (OSError, ValueError, KeyError, IndexError) as error:
        return FollowLag(str(source), mark.batch, None, None,
                         f"checkpoint {mark.directory} unreadable: {error}")
    try:
        behind = [f for f in listed_files(source) if str(f) not in seen]
        stamps = [f.stat().st_mtime for f in behind]
    except OSError as error:
        return FollowLag(str(source), mark.batch, None, None,
                         f"directory unreadable: {error}")
    now = time.time() if now is None else now
    seconds = round(max(0.0, now - min(stamps)), 3) if stamps else 0.0
    return FollowLag(str(source), mark.batch, len(behind), seconds)


def follow_status(offsets: SourceOffsets | None) -> dict[str, Any] | None:
    """`follow_lag` as the plain record a `TableStatus` carries (None: not a followed table)."""
    if offsets is None or offsets.stream is None or offsets.kind != KIND:
        return None
    return asdict(follow_lag(offsets))
