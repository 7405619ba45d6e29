"""Recording the order of fsyncs, renames and acknowledgements, for the tests that check that
nothing is acknowledged before what it covers is on the disk.

Two ways: in-process, `SyncLog.install` wraps `os.fsync`, `os.replace` and `os.rename` (the
calls every Python write of the project makes) and the tests add their own marks (a slot
confirmed, a view changed) to the same list; across a process, `strace_events` reads what
`strace -f -y -e trace=fsync,fdatasync,rename,renameat,renameat2 -o FILE` recorded of a real
command (the tests that use it skip, saying why, when strace is not installed)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

STRACE = shutil.which("strace")
needs_strace = pytest.mark.skipif(
    STRACE is None, reason="strace is not installed (apt-get install strace): the in-process "
                           "fsync-order tests still run")
TRACED = "fsync,fdatasync,rename,renameat,renameat2"


@dataclass
class SyncLog:
    """What happened, in order: ("fsync", path), ("rename", source, target), or a test's own
    mark (name, detail)."""

    events: list[tuple[str, ...]] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> SyncLog:
        fsync, replace, rename = os.fsync, os.replace, os.rename

        def traced_fsync(fd: Any) -> None:
            number = fd if isinstance(fd, int) else fd.fileno()
            try:
                path = os.readlink(f"/proc/self/fd/{number}")
            except OSError:
                path = f"fd:{number}"
            fsync(fd)
            self.events.append(("fsync", path))

        def wrap(real: Callable[..., None]) -> Callable[..., None]:
            def traced(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
                real(src, dst, *args, **kwargs)
                self.events.append(("rename", os.path.abspath(src), os.path.abspath(dst)))
            return traced

        monkeypatch.setattr(os, "fsync", traced_fsync)
        monkeypatch.setattr(os, "replace", wrap(replace))
        monkeypatch.setattr(os, "rename", wrap(rename))
        return self

    def mark(self, name: str, detail: str = "") -> None:
        self.events.append((name, detail))

    def synced(self, before: int | None = None) -> set[str]:
        """The paths fsync'd (among the first `before` events), a file synced under a
        temporary name and renamed after under its final name."""
        return synced_paths(self.events[:before])

    def index(self, name: str, *, start: int = 0) -> int:
        """The position of the first event `name` at or after `start`."""
        return next(i for i, e in enumerate(self.events) if i >= start and e[0] == name)

    def positions(self, name: str) -> list[int]:
        return [i for i, e in enumerate(self.events) if e[0] == name]

    def renamed_to(self, target: Path | str, *, start: int = 0) -> int:
        """The position of the first rename onto `target` at or after `start`."""
        target = os.path.abspath(target)
        return next(i for i, e in enumerate(self.events)
                    if i >= start and e[0] == "rename" and e[2] == target)

    def fsync_of(self, path: Path | str) -> int:
        path = os.path.abspath(path)
        return next(i for i, e in enumerate(self.events) if e[0] == "fsync" and e[1] == path)


def synced_paths(events: Iterable[tuple[str, ...]]) -> set[str]:
    """The paths `events` fsync'd, followed through the renames after the fsync."""
    synced: set[str] = set()
    for event in events:
        if event[0] == "fsync":
            synced.add(event[1])
        elif event[0] == "rename" and event[1] in synced:
            synced.add(event[2])
    return synced


def files_under(directory: Path) -> set[str]:
    """Every regular file under `directory`, as absolute paths."""
    return {str(p.resolve()) for p in directory.rglob("*") if p.is_file()}


_CALL = re.compile(r"^\d+\s+(\w+)\((.*)")
_FD = re.compile(r"^\d+<(.*?)>")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_DIRFD = re.compile(r"(?:AT_FDCWD|\d+)<(.*?)>")


def strace_command(trace: Path) -> list[str]:
    assert STRACE is not None
    return [STRACE, "-f", "-y", "-qq", "-e", f"trace={TRACED}", "-o", str(trace)]


def strace_events(trace: Path) -> list[tuple[str, ...]]:
    """The calls `strace -f -y` recorded in `trace`, in the order they were made, as SyncLog
    events: ("fsync", path) for fsync and fdatasync, ("rename", source, target) for the
    renames (relative names joined to their directory descriptor's path)."""
    events: list[tuple[str, ...]] = []
    for line in trace.read_text(errors="replace").splitlines():
        found = _CALL.match(line)
        if found is None:
            continue  # a "resumed" half, an exit or a signal line
        call, args = found.groups()
        if call in ("fsync", "fdatasync"):
            fd = _FD.match(args)
            if fd is not None:
                events.append(("fsync", fd.group(1)))
        elif call == "rename":
            names = _QUOTED.findall(args)
            if len(names) >= 2:
                events.append(("rename", *_absolute([names[0], names[1]], [None, None])))
        elif call in ("renameat", "renameat2"):
            names = _QUOTED.findall(args)
            dirs = _DIRFD.findall(args)
            if len(names) >= 2:
                events.append(("rename", *_absolute(names[:2], [*dirs, None, None][:2])))
    return events


def _absolute(names: Iterable[str], dirs: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(n if n.startswith("/") or d is None else os.path.join(d, n)
                 for n, d in zip(names, dirs, strict=True))
