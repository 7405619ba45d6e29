"""Folders and files only this user can reach, under the machine's shared temporary folder.

Two things of changelake's live there: the compiled jar's fallback folder (`spark.jvm`: a jar
found there is loaded into every Spark session) and the JVM's log (the CLI's, one per process:
it holds Spark's messages, which quote input). In a folder anyone may write (`/tmp`), a name
can be taken first by another user: a folder they made (and fill), or a symbolic link to a
file of ours. So each folder is made with mode 0700, or, where it exists, used only if it is a
real folder (not a link) of this user's that no one else could have written to; and a file is
opened with `O_NOFOLLOW` and mode 0600.

Nothing here imports pyspark: the CLI uses it before any Spark command starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import time
from pathlib import Path

from changelake.errors import ChangelakeError


class PrivateFolderError(ChangelakeError):
    """A folder changelake keeps private files in is not private to this user."""


def temporary_folder(name: str) -> Path:
    """`<the machine's temporary folder>/<name>-<uid>`: this user's, made or checked by
    `private_folder` when it is first used."""
    return Path(tempfile.gettempdir()) / f"{name}-{os.geteuid()}"


def private_folder(path: Path) -> Path:
    """`path` as a folder only this user can enter: made with mode 0700 (its parent must
    exist), or an existing one that is a real folder (no link) owned by this user and
    writable by no one else; a mode that lets others read or enter it is narrowed to 0700.
    `PrivateFolderError` otherwise, saying what to do."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        reason = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a folder"
        raise _refused(path, reason)
    if info.st_uid != os.geteuid():
        raise _refused(path, f"owned by uid {info.st_uid}, not by you (uid {os.geteuid()})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refused(path, f"writable by others (mode {stat.S_IMODE(info.st_mode):04o}), so "
                             "its files may not be yours")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700, follow_symlinks=False)
    return path


def _refused(path: Path, reason: str) -> PrivateFolderError:
    return PrivateFolderError(f"{path}: changelake keeps private files in this folder, but it "
                              f"is {reason}; remove it (or set TMPDIR to a folder of your own)")


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A file descriptor for `path` (in a `private_folder`), never through a symbolic link,
    created with mode 0600."""
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)


LOG_NAME = re.compile(r"spark-(\d+)\.log")
KEEP_LOGS_SECONDS = 7 * 24 * 3600
"""How long the log of a command that failed (or was killed) is kept: its error line may name
it. A command that succeeds removes its own at exit."""


def sweep_logs(folder: Path, *, now: float | None = None) -> list[Path]:
    """Remove the JVM logs in `folder` (`spark-PID.log`) older than `KEEP_LOGS_SECONDS` whose
    process is gone; the ones removed."""
    now = time.time() if now is None else now
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            found = LOG_NAME.fullmatch(entry.name)
            if found is None or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime < KEEP_LOGS_SECONDS:
                    continue
                if process_alive(int(found[1])):
                    continue
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process `pid` exists (one of another user's counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
