"""Source databases of captured tables: which lake tables share one time domain, and up to
which time all of them are complete (the consistent frontier).

A capture records on every table it creates an `Origin` (see `layout.py`). Tables with the
same origin `source` have times of one domain (for PostgreSQL, the commit LSNs of one
database), so the least of their committed frontiers, F, is a time before which every
transaction of the source is in every one of them: reading each AS OF any T < F gives the
database as it was after its last transaction at or before T. Between F and a table's own
frontier that table is ahead of the others, and a read there would mix two states of the
database: AS OF there is refused for a captured table, naming F (`check_as_of`).

What depends on the kind of source (how a time is written in the source's notation, and what
the source says now about its replication slot) lives with the capture of that kind, found
through `KINDS`, so this module names no database and imports no driver. The live check runs
in a daemon thread with a deadline: `status` answers even when a source hangs.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from changelake.errors import LakeError
from changelake.lake.catalog import Lake
from changelake.lake.follow_lag import NOT_ASKED
from changelake.lake.layout import Origin, TableState
from changelake.redact import redact

#: Per kind of source, the module that knows it: `position(time) -> str` (a time in the
#: source's notation) and `probe(origin, timeout) -> SlotStatus` (its replication, now).
KINDS: dict[str, str] = {"postgres": "changelake.capture.postgres.consistency"}

DEFAULT_PROBE_SECONDS = 3.0


class ConsistencyError(LakeError):
    """A read across a source database's tables that they cannot answer consistently (a
    time beyond the consistent frontier), or a source the lake does not know."""


@dataclass(frozen=True, slots=True)
class SourceTables:
    """The lake tables of one source database, and their consistent frontier."""

    source: str  # the identity (Origin.source)
    kind: str
    name: str  # the database's name (as its tables recorded it; " / " between several)
    tables: tuple[str, ...]
    origins: tuple[Origin, ...]  # distinct origins: one per slot, publication or DSN used
    frontier: int | None  # the least committed frontier; None: every table is closed
    since: int  # the greatest `since`: before it some table's history is compacted away
    laggards: tuple[str, ...] = ()  # the tables whose frontier is `frontier`


@dataclass(frozen=True, slots=True)
class SlotStatus:
    """What the source says now about one replication slot: the position it has confirmed,
    the source's current position, and the WAL it holds back (`lag_bytes`). Unreachable:
    `reachable` False and the reason in `error`; any other trouble (a missing slot, another
    server behind the DSN) is in `error` too. Not asked (`status` without --live):
    `reachable` None and `error` `NOT_ASKED`. `dsn` is never shown with its secrets."""

    slot: str
    dsn: str
    reachable: bool | None
    confirmed: str | None = None
    current: str | None = None
    lag_bytes: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """`changelake status` per source database: its tables, their consistent frontier (the
    integer time, and in the source's notation: an LSN `X/Y` for PostgreSQL), and its
    slots' lag, asked live (`NOT_ASKED` when not asked)."""

    database: str
    source: str
    kind: str
    tables: list[str]
    frontier: list  # Antichain JSON: [t], or [] once every table is closed
    frontier_lsn: str | None
    slots: list[SlotStatus] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class SourceKind(Protocol):
    def position(self, time: int) -> str: ...

    def probe(self, origin: Origin, timeout: float) -> SlotStatus: ...


def kind_module(kind: str) -> SourceKind:
    if kind not in KINDS:
        raise ConsistencyError(f"source kind {kind!r} is unknown (known: {sorted(KINDS)})")
    return importlib.import_module(KINDS[kind])  # type: ignore[return-value]


def group_sources(states: Iterable[TableState]) -> list[SourceTables]:
    """The captured tables among `states`, grouped by source (tables without an origin are in
    no source), with each source's consistent frontier."""
    by_source: dict[str, list[TableState]] = {}
    for state in states:
        if state.origin is not None:
            by_source.setdefault(state.origin.source, []).append(state)
    found = []
    for source, members in sorted(by_source.items()):
        members.sort(key=lambda s: s.name)
        uppers = [s.upper for s in members if s.upper is not None]
        frontier = min(uppers) if uppers else None
        origins: list[Origin] = []
        for s in members:
            assert s.origin is not None
            if s.origin not in origins:
                origins.append(s.origin)
        names = sorted({o.name for o in origins})  # one, unless the database was renamed
        found.append(SourceTables(
            source=source, kind=origins[0].kind, name=" / ".join(names),
            tables=tuple(s.name for s in members), origins=tuple(origins), frontier=frontier,
            since=max(s.since for s in members),
            laggards=tuple(s.name for s in members if s.upper == frontier)))
    return found


def lake_states(lake: Lake) -> list[TableState]:
    return [lake.handle(name).state() for name in lake.tables()]


def sources(lake: Lake) -> list[SourceTables]:
    """Every source database the lake's tables were captured from."""
    return group_sources(lake_states(lake))


def find_source(lake: Lake, database: str, *, kind: str | None = None) -> SourceTables:
    """The source called `database` (its name, or its identity `Origin.source`)."""
    known = [s for s in sources(lake) if kind is None or s.kind == kind]
    chosen = [s for s in known if database == s.source or database in s.name.split(" / ")]
    if not chosen:
        names = ", ".join(f"{s.name} ({s.source})" for s in known) or "none"
        raise ConsistencyError(f"lake {lake.root} has no tables captured from database "
                               f"{database!r} (its source databases: {names})")
    if len(chosen) > 1:
        raise ConsistencyError(f"database name {database!r} is ambiguous in lake {lake.root}: "
                               f"it names {', '.join(s.source for s in chosen)}; pass one of "
                               "those identities instead")
    return chosen[0]


def position(kind: str, time: int | None) -> str | None:
    """`time` in the notation of the source kind (None: closed, or an unknown kind)."""
    if time is None or kind not in KINDS:
        return None
    return kind_module(kind).position(time)


def beyond_frontier(group: SourceTables, as_of: int, what: str) -> ConsistencyError:
    assert group.frontier is not None
    where = position(group.kind, group.frontier)
    return ConsistencyError(
        f"{what}: AS OF {as_of} is beyond the consistent frontier of database {group.name} "
        f"({group.source}): {group.frontier}" + (f" (LSN {where})" if where else "")
        + f"; {', '.join(group.laggards)} committed only through {group.frontier - 1}, so the "
        f"other tables of the database are not there yet; read AS OF at most "
        f"{group.frontier - 1}")


def check_as_of(state: TableState, as_of: int,
                states: Callable[[], Iterable[TableState]]) -> None:
    """Refuse AS OF `as_of` on a captured table where its source's other tables are not yet
    (see the module docstring). Beyond the table's own frontier the table's own error stands
    (`Table.as_of`); a table captured from no source has nothing to check. `states` gives
    the states of the lake's tables (read by Spark, or by the Arrow path), asked only for a
    captured table."""
    if state.origin is None or (state.upper is not None and as_of >= state.upper):
        return
    group = next(g for g in group_sources(states()) if g.source == state.origin.source)
    if group.frontier is not None and as_of >= group.frontier:
        raise beyond_frontier(group, as_of, f"table {state.name}")


def probe_slots(group: SourceTables, timeout: float = DEFAULT_PROBE_SECONDS, *,
                live: bool = True) -> list[SlotStatus]:
    """Ask the source about each of its slots, each within `timeout` seconds: a source that
    cannot be reached, or does not answer, is reported as such. Not `live`: each slot as
    recorded, not asked (`NOT_ASKED`), no connection made."""
    out = []
    seen: set[tuple[str, str]] = set()
    for origin in group.origins:
        slot, dsn = origin.details.get("slot", ""), origin.details.get("dsn", "")
        if (slot, dsn) in seen:
            continue
        seen.add((slot, dsn))
        out.append(_probe_with_deadline(origin, slot, dsn, timeout) if live else
                   SlotStatus(slot, redact(dsn), None, error=NOT_ASKED))
    return out


def _probe_with_deadline(origin: Origin, slot: str, dsn: str, timeout: float) -> SlotStatus:
    result: list[SlotStatus] = []
    known, dsn = dsn, redact(dsn)

    def run() -> None:
        try:
            result.append(kind_module(origin.kind).probe(origin, timeout))
        except Exception as error:  # a report, not a failure: status must go on
            result.append(SlotStatus(slot, dsn, False,
                                     error=f"unreachable: {redact(str(error), known=known)}"))

    worker = threading.Thread(target=run, name=f"probe {slot}", daemon=True)
    worker.start()
    worker.join(timeout + 2.0)  # the probe has its own timeouts; this one is the last resort
    if not result:
        return SlotStatus(slot, dsn, False,
                          error=f"unreachable: no answer within {timeout + 2.0:g} s")
    return result[0]


def source_status(group: SourceTables, *, live: bool = True,
                  timeout: float = DEFAULT_PROBE_SECONDS) -> SourceStatus:
    return SourceStatus(
        database=group.name, source=group.source, kind=group.kind, tables=list(group.tables),
        frontier=[] if group.frontier is None else [group.frontier],
        frontier_lsn=position(group.kind, group.frontier),
        slots=probe_slots(group, timeout, live=live))


def statuses(states: Sequence[TableState], *, live: bool = True,
             timeout: float = DEFAULT_PROBE_SECONDS) -> list[SourceStatus]:
    return [source_status(g, live=live, timeout=timeout) for g in group_sources(states)]
