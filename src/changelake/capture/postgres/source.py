"""One PostgreSQL database as a source: its publication, its slot, its snapshot, its stream.

Why one module of over 500 lines: one source's life (connect, slot, snapshot, stream, confirm)
under one promise, below, that spans all of it.

The promise: every transaction that commits in the database and touches a captured table is
delivered once as a `Transaction`, in commit order, after the rows the initial snapshot read
(if one is taken), with no gap and no overlap between the two; and the slot's confirmed
position only moves to what the caller says is durable (`confirm`), so a crash at any point
re-delivers from there, never skips. The caller is the capture loop (`capture.Capture`),
whatever its output: lake tables or Materialize CDC logs.

How the pieces keep that promise:

* *Snapshot handoff.* A new slot is created with an exported snapshot (`CREATE_REPLICATION_SLOT
  ... (SNAPSHOT 'export')`): the database as it was at the slot's consistent point. The
  snapshot is read in a `REPEATABLE READ` transaction that adopts it (`SET TRANSACTION
  SNAPSHOT`), so it holds exactly the transactions committed before that point, and the slot
  streams exactly those committed after it. The export lasts until the replication connection
  runs its next command, so the tables are read before streaming starts.
* *Tables that join later* (added to the publication after the slot was created) are read in
  the snapshot of a temporary slot made for them (`exported_snapshot`), as of its consistent
  point C; the capture's slot, resumed before C, delivers everything committed from C on.
* *Resume.* A restart starts streaming at the caller's durable position (`resume`); the server
  starts at the later of that and the slot's confirmed position, and may still re-send
  transactions the caller already has: `stream` drops every transaction whose commit is below
  `resume`, so what the caller receives is new.
* *Heartbeat.* When no transaction is open and everything received is durable, the position of
  the last keepalive is safe to confirm: the server has decoded everything before it and sent
  us every captured transaction in it. `stream` yields an `Idle` with it, so the caller can
  advance its frontier there and confirm, and a quiet database does not hold WAL back.

Errors name the object and the rule: a missing publication or slot, a slot of another plugin
or database, a captured table without a primary key or replica identity, a slot that exists
when the caller has nothing (its history is gone: `--snapshot` cannot be taken from it).
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from changelake.capture.postgres import pgoutput as po
from changelake.capture.postgres.pgoutput import format_lsn, parse_lsn
from changelake.capture.postgres.transactions import MEMORY_BYTES, Assembler, Transaction
from changelake.capture.postgres.types import RELATION_OID, SESSION_SETTINGS, relation_args
from changelake.errors import ChangelakeError
from changelake.redact import MASK, is_secret_key, redact


class SourceError(ChangelakeError):
    """The database, publication or slot is not what capture needs."""


KEEPALIVE_SECONDS = 10.0
"""How often a capture tells the server it is alive while a batch commits (`Source.keepalive`):
well within PostgreSQL's default `wal_sender_timeout` of 60 s."""


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing open, nothing pending: every transaction committed before `lsn` was delivered."""

    lsn: int


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """Nothing more is there to read now (`Source.stream(caught_up=True)`). Not that the
    server has nothing more to send: while its reader is busy, a walsender stops at a full
    socket (its own kernel buffer holding more), and what the socket held is read in a moment.
    `Source.received_through` says whether the stream has read up to a position."""


CAUGHT_UP = CaughtUp()


@dataclass(frozen=True, slots=True)
class Slot:
    name: str
    created: bool  # by this capture, now: a snapshot name is available
    consistent_point: int  # for a created slot, the LSN its snapshot is as of
    snapshot: str | None


def _quoted(identifier: str) -> str:
    """An SQL identifier in double quotes, a quote in it doubled."""
    return '"' + identifier.replace('"', '""') + '"'


def kept_dsn(dsn: str) -> str:
    """`dsn` (key/value or URI form) as key/value text without its secrets (`redact`, which
    drops `password`, `sslpassword` and the like): what the lake may keep in a manifest (the
    password comes from `PGPASSWORD`, `.pgpass` or a service file again)."""
    try:
        params = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as error:
        raise SourceError("the DSN is not a libpq connection string: "
                          f"{redact(str(error).strip(), known=dsn)}") from None
    return redact(psycopg2.extensions.make_dsn(**params), drop=True)


def _masked(text: str, dsn: str) -> str:
    """`text` with the secrets of `dsn` masked: those libpq reads in it (its parse, which
    `redact` cannot follow: a URI's user information runs to its `@`, a space, `#` or `?`
    in the password included, and an unquoted value's backslash escapes its space), then
    whatever `redact` finds."""
    try:
        params = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        params = {}
    for secret in sorted((v for k, v in params.items() if v and is_secret_key(k)),
                         key=len, reverse=True):
        text = text.replace(secret, MASK)
    return redact(text, known=dsn)


def shown_dsn(dsn: str) -> str:
    """`dsn` for a message: its secrets masked, or what it is when libpq cannot parse it
    (its text may be anything, a password in a typo)."""
    try:
        psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return "a DSN libpq cannot parse"
    return _masked(dsn, dsn)


def driver_error(error: BaseException, dsn: str) -> str:
    """The first line of a psycopg2 (libpq) error, which may quote the DSN or a piece of it,
    with the DSN's secrets masked."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return _masked(first, dsn)


def connection_failed(error: BaseException) -> bool:
    """Whether a psycopg2 error says the connection itself failed (the server stopped or
    restarted, the network broke), not a statement: libpq's operational and interface errors,
    and the bare `DatabaseError` without an SQLSTATE that a replication stream raises when
    its server goes away ("no COPY in progress", "error with status PGRES_COPY_BOTH and no
    message from the libpq")."""
    if isinstance(error, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return True
    return type(error) is psycopg2.DatabaseError and error.pgcode is None


def lost_connection(error: BaseException, dsn: str, slot: str, *, snapshot: bool) -> str:
    """The one line for a connection that failed during a capture (`connection_failed`):
    the server, the driver's reason, and what to do. `snapshot`: the initial snapshot had not
    finished (its start marker is there), so the next run needs --create-slot to take it
    again; otherwise the next run resumes from the slot (nothing uncommitted was kept, and
    the slot is confirmed only to what the sink committed)."""
    then = ("run the capture again with --create-slot: its initial snapshot did not finish "
            "and is taken again" if snapshot else
            f"run the same command again: it resumes from slot {slot!r}, with nothing lost "
            "or taken twice")
    return (f"the connection to PostgreSQL ({shown_dsn(dsn)}) failed during the capture "
            f"(the server stopped or restarted?): {driver_error(error, dsn)}; nothing "
            f"uncommitted was kept: once the server is up, {then}")


def _options() -> str:
    return " ".join(f"-c {k}={v.replace(' ', '')}" for k, v in SESSION_SETTINGS.items())


def connect(dsn: str, *, replication: bool = False) -> psycopg2.extensions.connection:
    """A connection whose value texts have the forms `types` reads."""
    factory = psycopg2.extras.LogicalReplicationConnection if replication else None
    try:
        conn = psycopg2.connect(dsn, options=_options(), connection_factory=factory)
    except (psycopg2.OperationalError, psycopg2.ProgrammingError) as e:  # the latter: bad DSN
        raise SourceError(f"cannot connect to PostgreSQL ({shown_dsn(dsn)}): "
                          f"{driver_error(e, dsn)}") from None
    if not replication:
        conn.autocommit = True
    return conn


SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
"""A replication slot's name, as PostgreSQL takes one."""


class Source:
    """One database's publication and slot. Use as a context manager (closes connections)."""

    def __init__(self, dsn: str, publication: str, slot: str, *,
                 tables: tuple[str, ...] | None = None) -> None:
        if SLOT_NAME.fullmatch(slot) is None:  # before anything is asked or written
            raise SourceError(f"replication slot name {slot!r} is not valid: PostgreSQL takes "
                              "lower-case letters, digits and underscores, at most 63")
        self.dsn = dsn
        self.publication = publication
        self.slot_name = slot
        self.conn = connect(dsn)
        self.version = self.conn.server_version // 10000
        if self.version < 12:
            raise SourceError(f"PostgreSQL {self.version} is too old: capture needs 12 or newer")
        self.database = self._one("SELECT current_database()")[0]
        self.tables = self._published(tables)
        self.replication: psycopg2.extensions.connection | None = None
        self.cursor: Any = None

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, *, release_timeout: float = 10.0) -> None:
        """Close both connections; once the replication one was open, wait (up to
        `release_timeout`) until the server's walsender has let go of the slot, so that the
        next run, started at once, finds it free instead of "active for PID ..."."""
        replicated = self.replication is not None and not self.replication.closed
        if replicated:
            self.replication.close()  # type: ignore[union-attr]
        if replicated and not self.conn.closed:
            deadline = time.monotonic() + release_timeout
            try:
                while time.monotonic() < deadline and self._one(
                        "SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                        (self.slot_name,)) == (True,):
                    time.sleep(0.05)
            except psycopg2.Error:
                pass  # closing: the next run's own error will say what is wrong
        if not self.conn.closed:
            self.conn.close()

    def answers(self) -> bool:
        """Whether the database connection still answers: after an error, whether the server
        went away (`connection_failed`) from under the statement that failed."""
        try:
            self._one("SELECT 1")
        except psycopg2.Error:
            return False
        return True

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> tuple[Any, ...]:
        with self.conn.cursor() as c:
            c.execute(sql, args)
            row = c.fetchone()
        return tuple(row) if row is not None else ()

    # -- what is captured ----------------------------------------------------------------------

    def _published(self, wanted: tuple[str, ...] | None) -> tuple[str, ...]:
        """The publication's tables as `schema.table`, limited to `wanted`, each checked to
        have a key its updates and deletes can be applied by."""
        if not self._one("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)):
            raise SourceError(f"publication {self.publication!r} does not exist in database "
                              f"{self.database!r} (CREATE PUBLICATION {self.publication} FOR "
                              "TABLE ...)")
        with self.conn.cursor() as c:
            c.execute("SELECT schemaname, tablename FROM pg_publication_tables "
                      "WHERE pubname = %s ORDER BY schemaname || '.' || tablename",
                      (self.publication,))
            pairs = c.fetchall()
        for schema, table in pairs:  # `schema.table` would name another table, or none
            if "." in schema or "." in table:
                raise SourceError(
                    f"table {_quoted(schema)}.{_quoted(table)} of publication "
                    f"{self.publication!r} has a dot in its schema or table name, which "
                    "changelake cannot name (its tables are schema.table): rename it, or "
                    f"ALTER PUBLICATION {_quoted(self.publication)} DROP TABLE it")
        published = [f"{schema}.{table}" for schema, table in pairs]
        if wanted:
            chosen = []
            for name in wanted:
                full = name if "." in name else f"public.{name}"
                if full not in published:
                    raise SourceError(f"table {full} is not in publication "
                                      f"{self.publication!r} (it has: "
                                      f"{', '.join(published) or 'no tables'})")
                chosen.append(full)
            published = chosen
        for name in published:
            self._check_identity(name)
        return tuple(published)

    def _check_identity(self, table: str) -> None:
        # A deferrable primary key is no replica identity: PostgreSQL logs no old key by it.
        identity, has_key = self._one(
            "SELECT c.relreplident, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid "
            "AND ((i.indisprimary AND i.indimmediate) OR i.indisreplident)) FROM pg_class c "
            f"WHERE c.oid = {RELATION_OID}", relation_args(table))
        if identity == "n" or (identity == "d" and not has_key):
            raise SourceError(f"table {table} has no primary key or replica identity: its "
                              "updates and deletes cannot be captured (add a primary key, or "
                              "ALTER TABLE ... REPLICA IDENTITY FULL)")

    # -- the slot ------------------------------------------------------------------------------

    def has_slot(self) -> bool:
        return bool(self._one("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                              (self.slot_name,)))

    def drop_slot(self) -> None:
        """Drop the slot: only for one whose start was interrupted (nothing taken from it)."""
        try:
            self._one("SELECT pg_drop_replication_slot(%s)", (self.slot_name,))
        except psycopg2.Error as e:
            raise SourceError(f"replication slot {self.slot_name!r} cannot be dropped: "
                              f"{str(e).strip().splitlines()[0]}") from None

    def open_slot(self, *, create: bool) -> Slot:
        """The slot, created (with an exported snapshot) if asked and missing."""
        self.replication = connect(self.dsn, replication=True)
        self.cursor = self.replication.cursor()
        row = self._one("SELECT plugin, database FROM pg_replication_slots WHERE slot_name = %s",
                        (self.slot_name,))
        if row:
            plugin, database = row
            if plugin != "pgoutput" or database != self.database:
                raise SourceError(f"replication slot {self.slot_name!r} belongs to plugin "
                                  f"{plugin!r} in database {database!r}; capture needs a "
                                  f"pgoutput slot in {self.database!r}")
            return Slot(self.slot_name, False, 0, None)
        if not create:
            raise SourceError(f"replication slot {self.slot_name!r} does not exist (pass "
                              "--create-slot to create it, with an initial snapshot)")
        export = "(SNAPSHOT 'export')" if self.version >= 15 else "EXPORT_SNAPSHOT"
        self.cursor.execute(f'CREATE_REPLICATION_SLOT "{self.slot_name}" LOGICAL pgoutput '
                            f"{export}")
        name, point, snapshot, _ = self.cursor.fetchone()
        return Slot(name, True, parse_lsn(point), snapshot)

    @contextmanager
    def exported_snapshot(self) -> Iterator[Slot]:
        """A snapshot of the database now, for tables that join a capture whose slot already
        streams: a temporary slot created with an exported snapshot, on a replication
        connection of its own. The snapshot holds exactly the transactions committed before the
        temporary slot's consistent point C; the capture's own slot, resumed at or before C,
        delivers those committed at or after it (and earlier ones, which the joining tables
        skip: their floor is C). The snapshot and the temporary slot last until the block
        ends."""
        conn = connect(self.dsn, replication=True)
        try:
            cursor = conn.cursor()
            name = f"changelake_join_{os.getpid()}_{uuid.uuid4().hex[:12]}"
            export = "(SNAPSHOT 'export')" if self.version >= 15 else "EXPORT_SNAPSHOT"
            try:
                cursor.execute(f'CREATE_REPLICATION_SLOT "{name}" TEMPORARY LOGICAL pgoutput '
                               f"{export}")
            except psycopg2.Error as e:
                raise SourceError(f"a temporary slot for the snapshot of tables joining the "
                                  f"capture cannot be created: "
                                  f"{str(e).strip().splitlines()[0]}") from None
            _, point, snapshot, _ = cursor.fetchone()
            yield Slot(name, True, parse_lsn(point), snapshot)
        finally:
            conn.close()  # the temporary slot goes with its connection

    def snapshot_rows(self, slot: Slot, table: str, batch: int = 10_000
                      ) -> Iterator[tuple[tuple[str, ...], list[tuple[Any, ...]]]]:
        """The table's rows in the slot's snapshot, as text (None for NULL), in batches:
        `(column names, rows)`. Only for a slot created now, before `stream` starts, or for
        the one `exported_snapshot` gives, inside its block."""
        if slot.snapshot is None:
            raise SourceError(f"slot {slot.name!r} was not created by this capture: it has no "
                              "snapshot to read")
        conn = connect(self.dsn)
        try:
            conn.autocommit = False
            with conn.cursor() as c:
                c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                c.execute("SET TRANSACTION SNAPSHOT %s", (slot.snapshot,))
                c.execute(f"SELECT attname FROM pg_attribute WHERE attrelid = {RELATION_OID} "
                          "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                          relation_args(table))
                columns = tuple(r[0] for r in c.fetchall())
            schema, name = (_quoted(part) for part in relation_args(table))
            # A value's text from its type's output function, as pgoutput sends it: `concat`
            # calls it, where a cast to text need not (`true::text` is 'true', pgoutput's 't';
            # char(n), inet, cidr, name differ too).
            quoted = ", ".join(f"CASE WHEN {_quoted(col)} IS NULL THEN NULL ELSE "
                               f"concat({_quoted(col)}) END" for col in columns)
            with conn.cursor(name="changelake_snapshot") as c:
                c.itersize = batch
                c.execute(f"SELECT {quoted} FROM {schema}.{name}")
                while rows := c.fetchmany(batch):
                    yield columns, rows
            conn.rollback()
        finally:
            conn.close()

    # -- the stream ----------------------------------------------------------------------------

    def protocol(self) -> int:
        return 4 if self.version >= 16 else 3 if self.version >= 15 else \
            2 if self.version >= 14 else 1

    def stream(self, resume: int, *, idle_every: float = 1.0, poll: float = 0.2,
               memory_limit: int = MEMORY_BYTES, caught_up: bool = False
               ) -> Iterator[Transaction | Idle | CaughtUp]:
        """Committed transactions from `resume` on, and `Idle` positions while quiet; their
        changes kept in memory up to `memory_limit` bytes together (`transactions.Budget`).
        `caught_up`: also `CAUGHT_UP` each time nothing more is there to read (so at least
        every `poll` seconds while nothing arrives)."""
        assert self.cursor is not None, "open_slot first"
        version = self.protocol()
        options = {"proto_version": str(version), "publication_names": self.publication}
        if version >= 2:
            options["streaming"] = "on"
        try:
            self.cursor.start_replication(slot_name=self.slot_name, decode=False,
                                          start_lsn=format_lsn(resume), options=options)
        except psycopg2.errors.ObjectInUse:
            raise SourceError(f"replication slot {self.slot_name!r} is in use by another "
                              "process (another capture of it?): one capture per slot at a "
                              "time") from None
        decoder, assembler = po.Decoder(), Assembler(memory_limit)
        last_idle = time.monotonic()
        announced = False  # CAUGHT_UP yielded since the last message or wait
        while True:
            message = self.cursor.read_message()
            if message is None:
                if caught_up and not announced:
                    announced = True
                    handed = time.monotonic()
                    yield CAUGHT_UP
                    if time.monotonic() - handed >= poll:
                        # The caller committed a while: quiet is counted from now, as after
                        # a transaction (an `Idle` now would end a batch for a stream that
                        # only has not been read).
                        last_idle = time.monotonic()
                    continue  # read what came meanwhile
                announced = False
                quiet = assembler.current is None and not assembler.streamed
                if quiet and time.monotonic() - last_idle >= idle_every:
                    last_idle = time.monotonic()
                    yield Idle(max(int(self.cursor.wal_end), resume))
                select.select([self.cursor], [], [], poll)
                continue
            announced = False
            tx = assembler.push(decoder.decode(message.payload, message.data_start),
                                message.data_start)
            if tx is not None and tx.commit_lsn >= resume:
                yield tx
                last_idle = time.monotonic()
            elif tx is not None:
                tx.spool.close()

    @contextmanager
    def keepalive(self) -> Iterator[None]:
        """While the block runs (a sink's commit, which may take longer than the server's
        `wal_sender_timeout`, 60 s by default, on a loaded machine), tell the server every
        `KEEPALIVE_SECONDS` that the stream's reader is alive, confirming nothing new:
        without it the server ends the replication connection and the capture with it. A
        thread of its own does it; the stream is not read meanwhile, so it alone uses the
        cursor."""
        every = KEEPALIVE_SECONDS
        cursor = self.cursor
        if cursor is None:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every):
                try:
                    cursor.send_feedback(reply=False, force=True)
                except psycopg2.Error:
                    return  # the stream's next read reports the connection's end

        thread = threading.Thread(target=beat, name="changelake-keepalive", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def confirm(self, lsn: int) -> None:
        """Everything before `lsn` is durable: the server may recycle its WAL."""
        self.cursor.send_feedback(write_lsn=lsn, flush_lsn=lsn, reply=True)

    def flushed(self) -> int | None:
        """The server's WAL position flushed now (what a walsender may send up to), or None
        where it cannot say (a standby in recovery)."""
        try:
            row = self._one("SELECT pg_current_wal_flush_lsn()::text")
        except psycopg2.Error:
            return None
        return parse_lsn(row[0]) if row and row[0] else None

    def received_through(self, lsn: int) -> bool:
        """Whether the stream has read the server's WAL up to `lsn`: a message or keepalive
        at or past it (`wal_end`; the walsender sends in WAL order, and a keepalive when it
        waits for WAL), so every transaction committed before `lsn` has been received."""
        return self.cursor is not None and int(self.cursor.wal_end) >= lsn

    def confirmed(self) -> int:
        """The slot's confirmed flush position: a resumed stream starts there at the earliest,
        whatever position it asks for."""
        row = self._one("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                        "WHERE slot_name = %s", (self.slot_name,))
        return parse_lsn(row[0]) if row and row[0] else 0

    def lag(self) -> tuple[int, int] | None:
        """The slot's (confirmed flush LSN, server's current WAL LSN)."""
        row = self._one("SELECT confirmed_flush_lsn::text, pg_current_wal_lsn()::text FROM "
                        "pg_replication_slots WHERE slot_name = %s", (self.slot_name,))
        return (parse_lsn(row[0]), parse_lsn(row[1])) if row and row[0] else None
