"""Capture a PostgreSQL database into Materialize CDC logs, one per table, exactly once.

The promise: each captured table `schema.table` becomes the directory `OUT/schema.table/`, a
log of Materialize CDC messages (the input of `changelake decode` and `changelake ingest
--from materialize`) whose history holds every committed transaction at its commit LSN, and
whose frontier moves transaction by transaction; all tables of one database share that one
time domain. After any crash and restart the log says each transaction once. No Spark: this
is the fast path.

The log is a set of segment files, Avro object container files named
`<lower>-<upper>.avro` (times zero-padded to 20 digits, so names sort in time order), each
holding the batch's updates of the table and the progress statements of the interval
`[lower, upper)`: one per transaction that touched the table (its exact count of updates at
its commit LSN, so the frontier advances transaction by transaction), one for the rest of the
interval (a table a batch did not touch still moves its upper, with no counts). The initial
snapshot is the segment `[0, consistent point)`, its rows at time 0 (`snapshot = "never"`:
the same interval with no rows); a table added to the publication later (`join`) starts with
the segment `[0, C)` of its snapshot as of a temporary slot's consistent point C, its rows at
time C - 1 (before that, the log says the table had no changes: its history there is not
known). Heartbeats while the database is quiet write segments with
only a progress statement. Every file carries its schema (see `avro.py`); nothing else is in
the directory, so `OUT/schema.table/*` or the directory itself is a whole input.

Every block of a segment is one the log's readers take: they refuse an Avro block over
`ocf.MAX_BLOCK_BYTES` (16 MiB) before or after decompression, and a block holds whole datums,
so a message of updates holds at most `BATCH_SIZE` of them and at most `ocf.MAX_DATUM_BYTES`
encoded (`encode_segment` cuts one that takes more into as many as it needs, by
`materialize.avro_datums`, as every writer of messages does), and
`ocf.write_container` closes a block before it would exceed that. An update that takes more
than a message alone (a row with a value of ~16 MiB) is refused, naming the table, the key,
the transaction's commit LSN (or the snapshot), its size and the bound, before anything of
its batch (or its table's snapshot) is written, so the slot is not confirmed past it and
every rerun refuses it again: nothing is skipped.

Durability, which the capture loop relies on before it confirms the slot: a segment is written
under a hidden temporary name (`.<name>.tmp`, which readers and shell globs skip), fsync'd,
renamed into place and the directory fsync'd, so a crash never leaves a torn segment, and a
segment, once there, never changes (streaming readers may track files by name). A restart
reads each table's log back with the pure-Python reader: its frontier is where the table
resumes (the capture resumes from the least of them), so a re-delivered transaction is not
written again; were one written twice, the reader would deduplicate it (every message is true
of the final history).

The table's current rows (the previous row of a key, for deletes, updates without a
before-image and unchanged TOAST values, and every row for a truncate) come from the log:
decoded once at start and kept up to date with what each batch writes (`fetch`). A truncate
(`commit_batch`'s `emptied`) retracts them here, streamed: its segment's messages and datums
are made and written a `BATCH_SIZE` of updates at a time (`_truncate_messages`), so it holds
nothing more of the table than these current rows (no copy of them, as a truncate's list of
every row once was: several times the table).

Limits of this version: each table's current rows are held in memory (a table that does not
fit is captured into a lake, whose truncates are Spark jobs), and so is a table's
snapshot while its segment is written (and a batch's encoded segments, until all are written);
every batch writes one segment per table (a quiet table too), so a long-running capture makes
many small files; a table whose columns change during the capture is refused (one schema per
log); a row whose update encodes to more than `ocf.MAX_DATUM_BYTES` (16 MiB less 64 KiB) is
refused (above): a table that holds one is captured into a lake (`to_lake.py`) instead.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import fastavro
import orjson

from changelake.capture.postgres.avro import from_plain, schema_for, to_python
from changelake.capture.postgres.capture import (
    CaptureOptions,
    CaptureReport,
    Rows,
    marker_name,
)
from changelake.capture.postgres.pgoutput import format_lsn
from changelake.capture.postgres.rows import CaptureError, Key, Table, Values
from changelake.capture.postgres.source import Slot, Source
from changelake.durable import fsync_directory
from changelake.errors import ChangelakeError, InputError, ProtocolError
from changelake.formats import avro_bounds, ocf
from changelake.formats.materialize import (
    CdcSchema,
    UpdateTooLarge,
    avro_datums,
    message_to_plain,
    read_all,
)
from changelake.protocol import Antichain, Message, Progress, Reader, Updates, Writer
from changelake.text import short

SUFFIX = ".avro"
BATCH_SIZE = 1024  # updates per Avro datum, at most: fewer where they take more bytes


class LogError(ChangelakeError):
    """An output directory that cannot hold, or does not hold, a capture's logs."""


def segment_name(lower: int, upper: int) -> str:
    return f"{lower:020d}-{upper:020d}{SUFFIX}"


def segment_messages(rows: Rows, lower: int, upper: int,
                     batch_size: int = BATCH_SIZE) -> list[Message]:
    """The messages of a segment `[lower, upper)`: updates, and a progress statement per
    time that has updates (exact counts) and one for the rest of the interval."""
    writer = Writer(batch_size=batch_size, since=lower)
    times = set()
    for (row, at), diff in rows.items():
        if diff and lower <= at < upper:
            writer.push(row, at, diff)
            times.add(at)
    messages: list[Message] = []
    for at in sorted(times):
        messages.extend(writer.advance_to(Antichain([at + 1])))
    if writer.frontier != Antichain([upper]):
        messages.extend(writer.advance_to(Antichain([upper])))
    return messages


def encode_segment(table: Table, schema: CdcSchema, messages: list[Message], *,
                   snapshot: str | None = None) -> list[bytes]:
    """The segment's messages as Avro datums, each within `ocf.MAX_DATUM_BYTES` (so within one
    block the readers take, `ocf.MAX_BLOCK_BYTES`), by the writers' one way of bounding them
    (`materialize.avro_datums`): a message of updates that encodes to more is cut into as
    many datums as it needs (updates of one time may be in any number of messages: the
    progress statement counts them). An update that does not fit a datum alone is refused
    (`_too_large`), before anything of the segment is written. The updates' times are commit
    LSNs; for a snapshot's segment, `snapshot` says how the snapshot is taken again (for the
    refusal)."""
    return list(stream_datums(table, schema, messages, snapshot=snapshot))


def stream_datums(table: Table, schema: CdcSchema, messages: Iterable[Message], *,
                  snapshot: str | None = None) -> Iterator[bytes]:
    """`encode_segment`, one datum at a time, as the messages come."""
    columns = table.columns

    def datum(message: Message) -> Any:
        if isinstance(message, Updates):
            return [{"data": to_python(row, columns), "time": at, "diff": diff}
                    for row, at, diff in message.updates]
        return message_to_plain(message)

    try:
        yield from avro_datums(messages, schema, bound=ocf.MAX_DATUM_BYTES, datum=datum)
    except UpdateTooLarge as error:
        raise _too_large(table, error.update, error.size, snapshot=snapshot) from None
    except (ValueError, TypeError) as error:
        raise CaptureError(f"{table.qualified}: a row does not fit the log's schema (did the "
                           f"table's columns change during the capture?): {error}") from None


def _too_large(table: Table, update: tuple[Values, int, int], size: int, *,
               snapshot: str | None) -> CaptureError:
    """The refusal of an update no log can hold: one line naming the table, the row's key
    (long values cut short: a `REPLICA IDENTITY FULL` table's key is the whole row), its
    transaction, its size and the bound, and what to do instead. A transaction stays in the
    slot (a later change of the row comes after it), so a log can only be left behind; a
    snapshot is taken anew, of the row as it is then."""
    row, at, _ = update
    key = ", ".join(f"{table.columns[i]}={short(row[i], 40)}" for i in table.key)
    where = ("in its snapshot" if snapshot is not None
             else f"in the transaction committed at LSN {format_lsn(at)}")
    lake = ("capture this table into a lake instead (--lake, which has no such bound) and "
            "leave it out of this capture's --tables")
    then = (f"nothing of its snapshot is written: make the row smaller and {snapshot}, or "
            f"{lake}" if snapshot is not None else
            "nothing of its batch is written and the slot is not confirmed past it, so every "
            f"run refuses it again: {lake} (its log then ends where it is)")
    return CaptureError(
        f"table {table.qualified}: the row of key ({key}) {where} takes {size} bytes in a "
        f"log message, more than a message may hold ({ocf.MAX_DATUM_BYTES} bytes: a log's "
        f"readers refuse an Avro block over {ocf.MAX_BLOCK_BYTES}); {then}")



def _truncate_messages(changes: Rows, held: Iterable[Values], at: int, lower: int, upper: int,
                       batch_size: int = BATCH_SIZE) -> Iterator[Message]:
    """`segment_messages` of a segment `[lower, upper)` whose table was truncated at `at`:
    besides `changes` (the batch's, bounded by it), the `held` rows (the log's current rows
    as the batch starts) retracted at `at`, consolidated with the changes there, made into
    messages `batch_size` updates at a time as they are read, never listed."""
    yield from segment_messages(Counter({k: d for k, d in changes.items() if k[1] < at}),
                                lower, at, batch_size)
    there = {row: d for (row, time), d in changes.items() if time == at and d}
    chunk: list[tuple[Values, int, int]] = []
    count = 0

    def updates() -> Iterator[tuple[Values, int, int]]:
        for row in held:
            if row in there:
                there[row] -= 1  # consolidated with the batch's update of the row there
            else:
                yield row, at, -1
        for row, diff in there.items():
            if diff:
                yield row, at, diff

    for update in updates():
        chunk.append(update)
        count += 1
        if len(chunk) >= batch_size:
            yield Updates(chunk)
            chunk = []
    if chunk:
        yield Updates(chunk)
    yield Progress(Antichain([at]), Antichain([at + 1]), ((at, count),) if count else ())
    yield from segment_messages(Counter({k: d for k, d in changes.items() if k[1] > at}),
                                at + 1, upper, batch_size)


def write_segment(directory: Path, name: str, schema: CdcSchema,
                  datums: Iterable[bytes]) -> Path:
    """Write the segment's datums (`encode_segment`) durably: temporary name, fsync, rename,
    fsync of the directory. Each block within the readers' bound (`ocf.write_container`)."""
    final = directory / name
    temporary = directory / f".{name}.tmp"
    try:
        with open(temporary, "wb") as fo:
            ocf.write_container(fo, orjson.dumps(schema.avro), datums, codec="deflate",
                                weigh=schema.cost.weigh, budget=avro_bounds.BLOCK_BUDGET)
            fo.flush()
            os.fsync(fo.fileno())
        os.replace(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_directory(directory)
    return final


class LogSink:
    """Materialize CDC logs as a capture's `Sink` (see the module docstring)."""

    def __init__(self, directory: Path | str, options: CaptureOptions) -> None:
        self.directory = Path(directory)
        self.options = options
        self.report = CaptureReport()
        self.schemas: dict[str, CdcSchema] = {}
        self.uppers: dict[str, int | None] = {}
        self.current: dict[str, dict[Key, Values]] = {}
        #: Each log's one shape: the table's when the run started, checked on a restart
        #: against the schema its segments have (`read_log`).
        self.shapes: dict[str, Table] = {}

    def log(self, name: str) -> Path:
        return self.directory / name

    # -- the Sink interface --------------------------------------------------------------------

    def check(self, tables: dict[str, Table]) -> None:
        if self.directory.exists() and not self.directory.is_dir():
            raise LogError(f"--out {self.directory}: not a directory")
        for name, table in tables.items():
            if "/" in name or name.startswith("."):
                raise LogError(f"table {name}: its name cannot be a log directory's name")
            self.schemas[name] = schema_for(table)  # a bad column name, by name
            self.shapes[name] = table

    def held(self, tables: dict[str, Table]) -> set[str]:
        held = set()
        for name in tables:
            log = self.log(name)
            if log.is_dir():
                for leftover in log.glob(f".*{SUFFIX}.tmp"):  # a crash mid-write
                    leftover.unlink()
                if any(log.glob(f"*{SUFFIX}")):
                    held.add(name)
        return held

    def start(self, source: Source, slot: Slot, tables: dict[str, Table]) -> None:
        self._start(source, slot, tables, at=0, again="run again with --create-slot")

    def join(self, source: Source, snapshot: Slot, tables: dict[str, Table]) -> None:
        self._start(source, snapshot, tables, at=snapshot.consistent_point - 1,
                    again="run again")

    def _start(self, source: Source, slot: Slot, tables: dict[str, Table], *, at: int,
               again: str) -> None:
        """Each table's first segment `[0, consistent point)`, its snapshot's rows at `at`.
        A row too large for a log is refused before its table's segment is written (`again`:
        how the snapshot is taken again; the start or join marker makes the rerun do it)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            log = self.log(name)
            log.mkdir(exist_ok=True)
            fsync_directory(self.directory)
            rows: Counter[Values] = Counter()
            if self.options.snapshot == "initial":
                for columns, batch in source.snapshot_rows(slot, name):
                    order = [columns.index(c) for c in table.columns]
                    for raw in batch:
                        rows[tuple(None if raw[i] is None else kind.read(raw[i])
                                   for i, kind in zip(order, table.types, strict=True))] += 1
                self.report.snapshot_rows[name] = sum(rows.values())
            messages = segment_messages(Counter({(r, at): d for r, d in rows.items()}), 0,
                                        slot.consistent_point)
            datums = encode_segment(table, self.schemas[name], messages, snapshot=again)
            write_segment(log, segment_name(0, slot.consistent_point), self.schemas[name],
                          datums)
            self.current[name] = {tuple(r[i] for i in table.key): r for r in rows}
            self.uppers[name] = slot.consistent_point

    def start_marker(self, database: str, slot: str) -> Path:
        return self.directory / marker_name(database, slot)  # hidden: not a log

    def discard(self, tables: dict[str, Table]) -> None:
        """Remove the logs of an interrupted start: each holds its snapshot segment at most;
        one holding more is not the start's, and is refused."""
        for name in tables:
            log = self.log(name)
            segments = sorted(log.glob(f"*{SUFFIX}")) if log.is_dir() else []
            if len(segments) > 1 or any(not p.name.startswith(f"{0:020d}-") for p in segments):
                raise LogError(f"log {log} holds more than an interrupted initial snapshot; "
                               "not discarding it")
            for segment in segments:
                segment.unlink()
            if segments:
                fsync_directory(log)

    def check_resume(self, source: Source, held: set[str]) -> None:
        pass  # a log records no origin; `start_marker` covers an interrupted start

    def frontiers(self, tables: dict[str, Table]) -> dict[str, int | None]:
        for name, table in tables.items():
            if name not in self.uppers:
                self.uppers[name], self.current[name] = self.read_log(table)
        return {name: self.uppers[name] for name in tables}

    def fetch(self, table: Table, keys: set[Key]) -> list[Values]:
        current = self.current.get(table.qualified, {})
        return [current[k] for k in keys if k in current]

    def check_change(self, old: Table, new: Table) -> None:
        raise _changed(new.qualified, old.describe(), new.describe())

    def commit_batch(self, tables: dict[str, Table], rows: dict[str, Rows], lower: int,
                     upper: int, emptied: dict[str, int] | None = None) -> None:
        emptied = emptied or {}
        for name, table in tables.items():  # all checked before any is written
            held = self.shapes[name]
            if held.shape != table.shape:
                raise _changed(name, held.describe(), table.describe())
        segments = []
        for name, table in tables.items():  # all encoded (and bounded) before any is written
            held = self.uppers[name]
            if held is None or held >= upper:
                continue  # closed, or already holds the whole batch
            start = max(lower, held)
            changes = Counter({(r, at): d for (r, at), d in rows.get(name, Counter()).items()
                               if d and at >= start})
            datums: Iterable[bytes] = encode_segment(table, self.schemas[name],
                                                     segment_messages(changes, start, upper))
            truncated = emptied.get(name)
            if truncated is not None and truncated >= start:
                # The batch's own changes are bounded above (so a row too large is refused
                # before anything is written); with the current rows retracted, the segment
                # is made as it is written, and those rows were written to the log before.
                datums = stream_datums(table, self.schemas[name], _truncate_messages(
                    changes, self.current.get(name, {}).values(), truncated, start, upper))
            segments.append((name, table, start, changes, datums, truncated))
        for name, table, start, changes, datums, truncated in segments:
            write_segment(self.log(name), segment_name(start, upper), self.schemas[name],
                          datums)
            if truncated is not None and truncated >= start:
                self.current[name] = {}  # then the changes from the truncate on
                changes = Counter({k: d for k, d in changes.items() if k[1] >= truncated})
            self._apply(table, ((r, at, d) for (r, at), d in changes.items()))
            self.uppers[name] = upper

    # -- the log's state -----------------------------------------------------------------------

    def read_log(self, table: Table) -> tuple[int | None, dict[Key, Values]]:
        """The log's frontier and current rows, decoded with the pure-Python reader."""
        log = self.log(table.qualified)
        self._check_schema(table, log)
        self.current[table.qualified] = {}
        reader = Reader()
        try:
            for message in read_all([log]):
                for updates, _ in reader.push(message):
                    self._apply(table, ((from_plain(table, d), at, diff)
                                        for d, at, diff in updates))
        except (InputError, ProtocolError) as error:
            raise LogError(f"log {log} cannot be resumed from: {error}") from None
        frontier = reader.frontier
        return (None if frontier.is_closed else max(frontier)), self.current[table.qualified]

    def _check_schema(self, table: Table, log: Path) -> None:
        """Refuse a log whose schema is not the table's now: its columns changed while no
        capture ran (one schema per log, see the module docstring)."""
        segments = sorted(log.glob(f"*{SUFFIX}"))
        if not segments:
            return
        with open(segments[-1], "rb") as f:
            written = CdcSchema.from_json(orjson.loads(fastavro.reader(f).metadata["avro.schema"]),
                                          str(segments[-1]))
        held = _data_fields(written.data_type)
        now = _data_fields(schema_for(table).data_type)
        if held != now:
            raise _changed(table.qualified, "(" + ", ".join(n for n, _ in held) + ")",
                           table.describe(), since="its log was written")

    def _apply(self, table: Table, updates: Any) -> None:
        """Updates applied to the current rows, in time order, retractions first."""
        current = self.current.setdefault(table.qualified, {})
        for row, _, diff in sorted(updates, key=lambda u: (u[1], u[2])):
            key = tuple(row[i] for i in table.key)
            if diff < 0:
                if current.get(key) == row:
                    del current[key]
            else:
                current[key] = row


def _data_fields(record: Any) -> list[tuple[str, str]]:
    """A `data` record's fields as (name, type) to compare: types in one JSON spelling."""
    return [(f["name"], orjson.dumps(f["type"], option=orjson.OPT_SORT_KEYS).decode())
            for f in record["fields"]]


def _changed(name: str, old: str, new: str, since: str = "the capture started") -> CaptureError:
    return CaptureError(f"table {name}: its columns changed since {since}, from {old} to "
                        f"{new}: a log keeps one schema; restart into a new --out directory")
