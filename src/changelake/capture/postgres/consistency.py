"""One PostgreSQL database's lake tables as one time domain: their origin, their consistent
frontier, reads of all of them AS OF one transaction, and the slot's lag, asked live.

The promise: every lake table a capture creates records where it comes from (`origin`): the
server's system identifier and the database's OID (the identity: it survives renames of the
database and tells two servers apart), the database name, the slot, the publication and the
DSN without its password. Tables with one identity share the database's commit LSNs as
times, so the least of their frontiers (`consistent_frontier`) is a transaction every one of
them holds completely, and `database_as_of` reads all of them as of any time before it: one
state of the database, as a transaction at or before that LSN left it.

A restart refuses lake tables that came from another database (`check_tables`): their times
would mean other transactions. The generic part (grouping by identity, the status lines, the
AS OF check of `snapshot`) is `changelake.lake.sources`, which finds `position` and `probe`
here by the origin's kind.

`probe` asks the server how far the slot has confirmed (`confirmed_flush_lsn`) and how far its
WAL goes (`pg_current_wal_lsn()`): the difference is the WAL the slot holds back. It connects
with a short `connect_timeout` and `statement_timeout`, so a status never waits long on a
database it cannot reach (and `sources` adds a deadline of its own).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import psycopg2
import psycopg2.extensions
from pyspark.sql import DataFrame

from changelake.capture.postgres.pgoutput import format_lsn
from changelake.capture.postgres.source import Source, SourceError, driver_error, kept_dsn
from changelake.lake.catalog import Lake
from changelake.lake.layout import Origin, TableState
from changelake.lake.sources import (
    DEFAULT_PROBE_SECONDS,
    ConsistencyError,
    SlotStatus,
    beyond_frontier,
    find_source,
)
from changelake.redact import redact

KIND = "postgres"


def identity(system_identifier: object, database_oid: object) -> str:
    return f"{KIND}:{system_identifier}:{database_oid}"


def origin(source: Source) -> Origin:
    """Where `source`'s tables come from (see the module docstring), asked of the server."""
    with source.conn.cursor() as c:
        c.execute("SELECT (SELECT system_identifier FROM pg_control_system())::text, oid "
                  "FROM pg_database WHERE datname = current_database()")
        system, oid = c.fetchone()
    return Origin(KIND, identity(system, oid), source.database, {
        "system_identifier": str(system), "database_oid": str(oid),
        "slot": source.slot_name, "publication": source.publication,
        "dsn": kept_dsn(source.dsn)})


def check_tables(source: Source, states: Mapping[str, TableState | None]) -> None:
    """Refuse to resume into lake tables that cannot continue from this database's slot: a
    table captured from another database (its times are another server's LSNs), or one whose
    initial snapshot never committed (frontier still 0: streaming would leave it without its
    rows)."""
    here = origin(source)
    for name, state in states.items():
        if state is None:
            continue
        if state.origin is not None and state.origin.source != here.source:
            raise SourceError(
                f"lake table {name} was captured from database {state.origin.name!r} "
                f"({state.origin.source}), not from {here.name!r} ({here.source}) that "
                f"the DSN {here.details['dsn']!r} reaches: its times would mean other "
                "transactions")
        if state.upper == 0:
            raise SourceError(
                f"lake table {name}: its initial snapshot was never committed (frontier 0; "
                "the capture stopped while taking it): drop the captured lake tables and slot "
                f"{source.slot_name!r}, and capture again with --create-slot")


def position(time: int) -> str:
    """A lake time of a PostgreSQL capture (an LSN) as PostgreSQL prints LSNs."""
    return format_lsn(time)


def consistent_frontier(lake: Lake, tables: Iterable[str]) -> int | None:
    """The least committed frontier of `tables`: every transaction before it is in all of
    them, so reading each AS OF a time below it gives one state of the database."""
    uppers = [lake.table(t).state().upper for t in tables]
    open_ = [u for u in uppers if u is not None]
    return min(open_) if open_ else None


def database_as_of(lake: Lake, database: str, time: int | None = None) -> dict[str, DataFrame]:
    """Every lake table captured from `database` (its name, or its identity) as of one `time`
    (a commit LSN), by table name: one state of the database. `time` None is the latest
    consistent state, the consistent frontier minus one. A time at or beyond the consistent
    frontier is refused (some table is not there yet), and so is one before a table's `since`
    (its history there was compacted away)."""
    group = find_source(lake, database, kind=KIND)
    if time is None:
        if group.frontier is None:
            return {name: lake.table(name).current() for name in group.tables}
        time = group.frontier - 1
    elif group.frontier is not None and time >= group.frontier:
        raise beyond_frontier(group, time, f"database {group.name}")
    if time < group.since:
        raise ConsistencyError(
            f"database {group.name}: AS OF {time} is before the since of its tables "
            f"({group.since}" + (f", LSN {position(group.since)}" if group.since else "")
            + "): a table's history before it was compacted away, or the tables start there "
            "(no transaction is readable yet)")
    return {name: lake.table(name).as_of(time) for name in group.tables}


def probe(origin: Origin, timeout: float = DEFAULT_PROBE_SECONDS) -> SlotStatus:
    """The slot's confirmed position and lag behind the server's WAL, asked now."""
    slot, dsn = origin.details.get("slot", ""), origin.details.get("dsn", "")
    known, dsn = dsn, redact(dsn)  # a lake written before sslpassword was dropped holds it
    seconds = max(2, math.ceil(timeout))  # libpq's least connect_timeout is 2 s
    try:
        conn = psycopg2.connect(known, connect_timeout=seconds, application_name="changelake "
                                "status", options=f"-c statement_timeout={seconds * 1000}")
    except psycopg2.Error as error:
        return SlotStatus(slot, dsn, False, error=f"unreachable: {driver_error(error, known)}")
    try:
        conn.autocommit = True
        with conn.cursor() as c:
            c.execute(
                "SELECT (SELECT system_identifier FROM pg_control_system())::text, d.oid, "
                "s.slot_name IS NOT NULL, s.confirmed_flush_lsn::text, "
                "pg_current_wal_lsn()::text, "
                "pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint "
                "FROM pg_database d LEFT JOIN pg_replication_slots s ON s.slot_name = %s "
                "WHERE d.datname = current_database()", (slot,))
            system, oid, exists, confirmed, current, lag = c.fetchone()
    except psycopg2.Error as error:
        return SlotStatus(slot, dsn, True, error=f"query failed: {driver_error(error, known)}")
    finally:
        conn.close()
    if identity(system, oid) != origin.source:
        return SlotStatus(slot, dsn, True, current=current, error=(
            f"the DSN now reaches another database ({identity(system, oid)}), not "
            f"{origin.source}"))
    if not exists:
        return SlotStatus(slot, dsn, True, current=current,
                          error=f"replication slot {slot!r} does not exist")
    return SlotStatus(slot, dsn, True, confirmed=confirmed, current=current,
                      lag_bytes=None if lag is None else int(lag))
