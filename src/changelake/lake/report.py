"""Rendering the lake commands' results for the CLI: rich tables on a terminal, plain text
otherwise, and progress bars only on a terminal (quiet in pipes, logs and tests).

Spark's modules are imported for their types only: `status` and `snapshot` on the Arrow path
(see `arrow.py`) render through here without importing pyspark."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

from changelake.lake.arrow import TableStatus
from changelake.values import json_safe

if TYPE_CHECKING:  # types only: `status` and `snapshot` render here without Spark's modules
    from changelake.lake.compact import CompactionResult
    from changelake.lake.ingest import IngestReport
    from changelake.lake.kafka_ingest import KafkaIngestReport
    from changelake.lake.sources import SlotStatus, SourceStatus
    from changelake.lake.table import ProgressFn


UNCUT_WIDTH = 100_000
"""The width of a console whose output is not a terminal: wider than any table's content,
so rich sizes each table to its content and cuts no cell (it pads nothing beyond it)."""


def table_console() -> Console:
    """A console for tables on stdout. On a terminal (or with `COLUMNS` set), the terminal's
    width, as rich chooses; otherwise (a file, a pipe) rich would take 80 columns and cut cells
    (`fron…`, `2026-…`) that whoever reads the file has no way to widen, so no width limit."""
    console = Console()
    if console.is_terminal or "COLUMNS" in os.environ:
        return console
    return Console(width=UNCUT_WIDTH)


@contextmanager
def progress_bar(console: Console, title: str) -> Iterator[ProgressFn | None]:
    """A `ProgressFn` drawing a bar while on a terminal; None (no output) otherwise."""
    if not console.is_terminal:
        yield None
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn(
            "{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
            transient=True) as bar:
        task = bar.add_task(title, total=1)

        def update(description: str, done: int, total: int) -> None:
            bar.update(task, description=f"{title}: {description}", completed=done,
                       total=total)

        yield update


def write_snapshot(rows: Iterable[dict[str, Any]], columns: Sequence[str], fmt: str,
                   out: IO[bytes], console: Console | None = None) -> int:
    """Print rows as jsonl (one JSON object per row, plain values), csv, or a table; returns
    the number of rows."""
    n = 0
    if fmt == "jsonl":
        for row in rows:
            out.write(orjson.dumps(json_safe(row)) + b"\n")
            n += 1
    elif fmt == "csv":
        text = io.StringIO()
        writer = csv.writer(text)
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else _cell(row.get(c)) for c in columns])
            n += 1
        out.write(text.getvalue().encode())
    elif fmt == "table":
        table = RichTable(*columns)
        for row in rows:
            table.add_row(*["∅" if row.get(c) is None else str(_cell(row.get(c)))
                            for c in columns])
            n += 1
        (console or table_console()).print(table)
    else:
        raise ValueError(f"unknown format {fmt!r}: jsonl, csv or table")
    return n


def _cell(value: Any) -> Any:
    """A csv or table cell: a struct, map or array as its JSON (as jsonl prints it), not
    Python's repr of it."""
    if isinstance(value, dict | list | tuple):
        return orjson.dumps(json_safe(value)).decode()
    return value


def status_table(statuses: Sequence[TableStatus]) -> RichTable:
    table = RichTable("table", "key", "frontier", "since", "rows", "segments", "files",
                      "bytes", "version", "last commit")
    for s in statuses:
        table.add_row(s.name, ",".join(s.key) or "-", str(s.frontier), str(s.since),
                      f"{s.rows:,}", str(s.segments), str(s.files), f"{s.bytes:,}",
                      str(s.version), f"{s.last_operation} {s.last_commit}")
    return table


def offsets_table(statuses: Sequence[TableStatus]) -> RichTable | None:
    """Per partition of the tables ingested from Kafka: the committed offset (where the next
    ingest starts), the partition's end now, the lag, and how far its statements reached (and
    whether that holds the table's frontier back); None if no table has topics."""
    rows = [(s.name, o) for s in statuses for o in s.offsets or ()]
    if not rows:
        return None
    table = RichTable("table", "topic", "partition", "committed", "end", "lag", "reached")
    for name, o in rows:
        end = "-" if o["end"] is None else f"{o['end']:,}"
        lag = o["error"] or ("-" if o["lag"] is None else f"{o['lag']:,}")
        reached = "-" if o.get("reached") is None else str(o["reached"])
        if o.get("holds_back"):
            reached += " (holds the frontier back)"
        table.add_row(name, o["topic"], str(o["partition"]), f"{o['committed']:,}", end, lag,
                      reached)
    return table


def follow_table(statuses: Sequence[TableStatus]) -> RichTable | None:
    """Per table following a directory or topics (`ingest --follow`): the source, the last
    committed micro-batch, the files (or records) not yet committed and the age of the oldest;
    None if none does."""
    rows = [(s.name, s.follow) for s in statuses if s.follow is not None]
    if not rows:
        return None
    table = RichTable("table", "following", "batch", "behind", "seconds behind")
    for name, f in rows:
        files = f["error"] or (f"{f['files_behind']:,} files" if f["files_behind"] is not None
                               else f"{f.get('records_behind') or 0:,} records")
        seconds = "-" if f["seconds_behind"] is None else f"{f['seconds_behind']:.1f}"
        table.add_row(name, f["source"], str(f["batch"]), files, seconds)
    return table


def topics_line(read: KafkaIngestReport) -> str:
    """What `ingest --kafka` read: records, and per partition the offsets read and where the
    next run starts."""
    parts = [f"{p.topic}/{p.partition} [{p.start}, {p.end}) next {p.resume}"
             for p in read.partitions]
    return (f"read {read.records:,} record(s) of topic partition(s) "
            + ("; ".join(parts) or "none"))


def slot_text(slot: SlotStatus) -> str:
    """One slot's state in words: its lag, or why it is not known."""
    if slot.error is not None:
        return f"{slot.slot}: {slot.error}"
    if slot.lag_bytes is None:
        return f"{slot.slot}: nothing confirmed yet (server at {slot.current})"
    return (f"{slot.slot}: lag {slot.lag_bytes:,} bytes (confirmed {slot.confirmed}, server "
            f"at {slot.current})")


def sources_table(sources: Sequence[SourceStatus]) -> RichTable:
    """Per source database: its tables, the consistent frontier (every table holds every
    transaction before it), and its slots' lag."""
    table = RichTable("source database", "identity", "tables", "consistent frontier", "lsn",
                      "slots")
    for s in sources:
        table.add_row(s.database, s.source, "\n".join(s.tables), str(s.frontier),
                      s.frontier_lsn or "-", "\n".join(slot_text(x) for x in s.slots) or "-")
    return table


def ingest_line(report: IngestReport) -> str:
    c = report.commit
    if c.skipped:
        through = "the end: the table is closed" if c.lower is None else c.lower
        return (f"{report.table}: nothing new (committed through {through}; input frontier "
                f"{report.frontier})")
    made = "created, " if report.created else ""
    return (f"{report.table}: {made}committed {c.written:,} updates at times [{c.lower}, "
            f"{'∞' if c.upper is None else c.upper}) as version {c.version}"
            + (" (schema changed)" if c.schema_changed else ""))


def waiting_line(report: IngestReport) -> str | None:
    """Why the ingest stopped where it did: the updates from its frontier on are not committed
    yet (None when the input closed the stream). None too where the table already holds more
    than the input could give (closed, or committed beyond the input's frontier: an input
    ingested again after a later one, or after `--close`): nothing waits for this input then,
    and a note that its frontier stopped short would read as the table's."""
    if report.waiting_for is None:
        return None
    c = report.commit
    if c.skipped and (c.lower is None or (report.frontier and report.frontier[0] < c.lower)):
        return None
    return f"note: frontier stopped at {report.frontier}: {report.waiting_for}"


def compact_line(result: CompactionResult) -> str:
    if result.version is None:
        return f"{result.table}: nothing to compact (since {result.since})"
    return (f"{result.table}: since {result.since_before} -> {result.since}; {result.changes:,}"
            f" changes from {result.segments} segment(s) into {len(result.buckets_touched)} "
            f"bucket(s), {len(result.merged)} merged, {len(result.folded)} folded; "
            f"{result.rows_written:,} rows written, {result.files_removed} old file set(s) "
            f"removed")
