"""A capture's log never holds a block its own readers refuse (`ocf.MAX_BLOCK_BYTES`, before
and after decompression): a batch of updates too large for one message is cut into several,
in the snapshot and in the stream, and decodes back to the database's rows, also on a restart
(which reads the log back); an update that no message can hold is refused before anything of
its batch is written and before the slot is confirmed past it, so every rerun refuses it
again rather than skipping it, and the other tables go on once it is left out."""

from __future__ import annotations

import io
import itertools
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import fastavro
import psycopg2
import pytest

from changelake.capture.postgres.capture import Capture, CaptureOptions, CaptureReport
from changelake.capture.postgres.rows import CaptureError
from changelake.capture.postgres.to_log import LogSink
from changelake.formats import ocf
from changelake.formats.materialize import read_all
from changelake.protocol import Updates
from tests.capture.test_capture_pg_log import (
    database,
    decoded,
    plain,
    released,
    segments,
    slot_confirmed,
)
from tests.support.postgres import execute

CLI = [str(Path(sys.executable).parent / "changelake")]
#: Rows of ~19 kB: 1024 of them (one message before the fix) take ~19.7 MB, over 16 MiB.
WIDE = "repeat(md5(g::text), 600)"
ROWS = 1100
#: One value over the bound alone, just: PostgreSQL takes it in well under a second.
HUGE = ocf.MAX_BLOCK_BYTES + 2**20


@pytest.fixture(autouse=True)
def slots_released(pg_dsn: str):
    yield
    released(pg_dsn)


def tables(dsn: str) -> None:
    execute(dsn, "CREATE TABLE wide (id int PRIMARY KEY, body text)",
            "CREATE TABLE small (id int PRIMARY KEY, v int)",
            "CREATE PUBLICATION pub FOR TABLE wide, small")


def capture(dsn: str, out: Path, names: tuple[str, ...] = ("wide", "small"),
            **options: object) -> CaptureReport:
    o = CaptureOptions(dsn, "pub", "bound_slot", tables=names,
                       **options)  # type: ignore[arg-type]
    try:
        return Capture(LogSink(out, o), o).run()
    finally:
        released(dsn)


def blocks(log: Path) -> list[int]:
    """The stored size of every block of every segment, through the project's bounded reader
    (which refuses a block over the bound)."""
    sizes = []
    for segment in sorted(log.iterdir()):
        with open(segment, "rb") as f:
            header, stream = ocf.read_header(f, segment.name)
            for block in ocf.read_blocks(stream, header, segment.name):
                sizes.append(len(block.data))
    return sizes


def test_large_rows_are_cut_into_messages_a_reader_takes_and_resume(pg_dsn: str,
                                                                    tmp_path: Path) -> None:
    tables(pg_dsn)
    execute(pg_dsn, f"INSERT INTO wide SELECT g, {WIDE} FROM generate_series(1, {ROWS}) g",
            "INSERT INTO small VALUES (1, 1)")
    out = tmp_path / "out"
    first = capture(pg_dsn, out, create_slot=True, until_idle=0.5)
    assert first.snapshot_rows == {"public.wide": ROWS, "public.small": 1}
    # The stream: one transaction inserts as many again, another deletes some.
    execute(pg_dsn, f"INSERT INTO wide SELECT g, {WIDE} FROM generate_series({ROWS + 1}, "
                    f"{2 * ROWS}) g",
            "DELETE FROM wide WHERE id % 100 = 0")
    second = capture(pg_dsn, out, until_idle=0.5)  # a restart: reads the log back first
    assert second.transactions == 2
    log = out / "public.wide"
    assert max(blocks(log)) <= ocf.MAX_DATUM_BYTES
    messages = list(read_all([log]))
    updates = [m for m in messages if isinstance(m, Updates)]
    assert len(updates) > 4 and max(len(m.updates) for m in updates) < 1024  # cut by size
    # `changelake decode`'s engine gives the database's rows, and so does fastavro's reader.
    assert decoded(log, ("id", "body")) == (plain(database(pg_dsn, "public.wide")),
                                            [second.frontier])
    for segment in log.iterdir():
        with open(segment, "rb") as f:
            list(fastavro.reader(f))
    # A third run resumes from the log (read back whole) and adds one more transaction.
    execute(pg_dsn, "UPDATE wide SET body = 'short' WHERE id = 1")
    third = capture(pg_dsn, out, until_idle=0.5)
    assert third.transactions == 1
    assert decoded(log, ("id", "body")) == (plain(database(pg_dsn, "public.wide")),
                                            [third.frontier])
    spans = segments(log)
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))


LAKE = (r"capture this table into a lake instead \(--lake, which has no such bound\) and "
        r"leave it out of this capture's --tables")


def refusal(key: str, where: str) -> str:
    return (rf"^table public\.wide: the row of key \({key}\) {where} takes (\d+) bytes in a "
            rf"log message, more than a message may hold \({ocf.MAX_DATUM_BYTES} bytes: a "
            rf"log's readers refuse an Avro block over {ocf.MAX_BLOCK_BYTES}\); ")


def test_a_row_no_message_holds_is_refused_before_its_batch_and_the_slot(
        pg_dsn: str, tmp_path: Path) -> None:
    tables(pg_dsn)
    execute(pg_dsn, "INSERT INTO small VALUES (1, 1)")
    out = tmp_path / "out"
    capture(pg_dsn, out, create_slot=True, until_idle=0.5)
    before = {n: segments(out / n) for n in ("public.wide", "public.small")}
    confirmed = slot_confirmed(pg_dsn, "bound_slot")
    conn = psycopg2.connect(pg_dsn)
    with conn, conn.cursor() as c:  # one transaction: both tables' rows in one batch
        c.execute("INSERT INTO small VALUES (2, 2)")
        c.execute("INSERT INTO wide VALUES (7, repeat('x', %s))", (HUGE,))
    conn.close()
    where = r"in the transaction committed at LSN [0-9A-F]+/[0-9A-F]+"
    message = (refusal("id=7", where) + r"nothing of its batch is written and the slot is not "
               rf"confirmed past it, so every run refuses it again: {LAKE} \(its log then "
               r"ends where it is\)$")
    with pytest.raises(CaptureError, match=message) as refused:
        capture(pg_dsn, out, until_idle=0.5)
    (size,) = re.search(r"takes (\d+) bytes", str(refused.value)).groups()  # type: ignore[union-attr]
    assert HUGE < int(size) < HUGE + 100
    # Nothing of the batch in either log, and the slot not confirmed past it.
    assert {n: segments(out / n) for n in before} == before
    assert slot_confirmed(pg_dsn, "bound_slot") == confirmed
    # Every rerun refuses it the same way (the CLI: one line, exit 2), rather than skip it.
    done = subprocess.run([*CLI, "capture", "postgres", "--dsn", pg_dsn, "--publication",
                           "pub", "--slot", "bound_slot", "--out", str(out),
                           "--until-idle", "0.5"], capture_output=True, timeout=300, text=True)
    released(pg_dsn)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert lines[-1].startswith("changelake: error: ")
    assert re.search(message, lines[-1].removeprefix("changelake: error: ")), lines[-1]
    assert str(refused.value) in lines[-1]  # the same transaction, the same size
    assert {n: segments(out / n) for n in before} == before
    assert slot_confirmed(pg_dsn, "bound_slot") == confirmed
    # With the table left out, the others take the batch: nothing of theirs lost or doubled.
    again = capture(pg_dsn, out, names=("small",), until_idle=0.5)
    assert again.transactions == 1
    assert decoded(out / "public.small", ("id", "v")) == (
        Counter({(1, 1): 1, (2, 2): 1}), [again.frontier])
    assert segments(out / "public.wide") == before["public.wide"]


@pytest.mark.parametrize("start", ["initial", "join"])
def test_a_snapshot_row_no_message_holds_is_refused_and_taken_again_once_smaller(
        pg_dsn: str, tmp_path: Path, start: str) -> None:
    """The snapshot segment is cut and bounded by the same writer: the initial one (the start
    marker makes the rerun take it again) and a joining table's (the `.joining` marker)."""
    tables(pg_dsn)
    out = tmp_path / "out"
    if start == "join":
        execute(pg_dsn, "ALTER PUBLICATION pub DROP TABLE wide")
        capture(pg_dsn, out, names=None, create_slot=True, until_idle=0.5)  # small alone
        execute(pg_dsn, "ALTER PUBLICATION pub ADD TABLE wide")
    execute(pg_dsn, f"INSERT INTO wide VALUES (1, 'one'), (2, repeat('y', {HUGE}))")
    rerun = {"create_slot": True} if start == "initial" else {}
    again = "run again with --create-slot" if start == "initial" else "run again"
    message = (refusal("id=2", "in its snapshot") + "nothing of its snapshot is written: make "
               rf"the row smaller and {again}, or {LAKE}$")
    for _ in range(2):
        with pytest.raises(CaptureError, match=message):
            capture(pg_dsn, out, names=None, until_idle=0.5, **rerun)
        wide = out / "public.wide"
        assert not wide.exists() or not any(wide.iterdir())
    execute(pg_dsn, "UPDATE wide SET body = 'two' WHERE id = 2")
    report = capture(pg_dsn, out, names=None, until_idle=0.5, **rerun)
    assert report.snapshot_rows["public.wide"] == 2
    state, (frontier,) = decoded(out / "public.wide", ("id", "body"))
    assert state == Counter({(1, "one"): 1, (2, "two"): 1})
    # A joined table is at its snapshot's consistent point, maybe ahead of the others.
    assert report.frontier is not None and frontier >= report.frontier


def test_the_container_writer_keeps_every_block_within_the_bound(tmp_path: Path) -> None:
    """Datums that do not compress, at the most a block may hold: deflate grows them, and the
    block stays within the bound; a datum beyond it is refused, nothing of its block
    written."""
    path = tmp_path / "x.avro"
    schema = b'"bytes"'
    length = ocf.MAX_DATUM_BYTES - 4  # a bytes value: its length (4 bytes here), the bytes
    datums = [ocf.encode_long(length) + os.urandom(length), b"\x02a", b"\x02b"]
    assert len(datums[0]) == ocf.MAX_DATUM_BYTES
    with open(path, "wb") as f:
        ocf.write_container(f, schema, datums)
    with open(path, "rb") as f:
        header, stream = ocf.read_header(f, "x")
        read = list(ocf.read_blocks(stream, header, "x"))
    assert [b.count for b in read] == [1, 2]
    with open(path, "rb") as f:
        assert [len(v) for v in fastavro.reader(f)] == [length, 1, 1]
    written = io.BytesIO()
    with pytest.raises(ValueError, match="more than a block may hold"):
        ocf.write_container(written, schema, [b"\x02a", b"\x00" * (ocf.MAX_DATUM_BYTES + 1)])
    assert b"\x02a" not in written.getvalue()[len(ocf.MAGIC):]  # the header alone


class BatchSizes(LogSink):
    """The log sink, recording how many transactions (commit times) each batch brings."""

    sizes: list[int]

    def commit_batch(self, tables, rows, lower, upper, emptied=None) -> None:
        times = {at for changes in rows.values() for (_, at), d in changes.items() if d}
        self.sizes = [*getattr(self, "sizes", []), len(times)]
        super().commit_batch(tables, rows, lower, upper, emptied)


def test_a_batch_ends_at_its_bytes_as_at_its_changes(pg_dsn: str, tmp_path: Path) -> None:
    """Ten transactions of one ~19 kB row each: few changes (a limit in changes put them all
    in one batch), but a batch of 50 kB of changes holds three of them at most."""
    tables(pg_dsn)
    out = tmp_path / "out"
    capture(pg_dsn, out, create_slot=True, until_idle=0.5)
    execute(pg_dsn, *(f"INSERT INTO wide SELECT g, {WIDE} FROM generate_series({i}, {i}) g"
                      for i in range(1, 11)))
    o = CaptureOptions(pg_dsn, "pub", "bound_slot", tables=("wide", "small"), until_idle=1.0,
                       batch_seconds=600.0, batch_bytes=50_000)
    sink = BatchSizes(out, o)
    try:
        report = Capture(sink, o).run()
    finally:
        released(pg_dsn)
    assert report.transactions == 10
    assert sum(sink.sizes) == 10 and max(sink.sizes) <= 3, sink.sizes
    state, _ = decoded(out / "public.wide", ("id", "body"))
    assert state == plain(database(pg_dsn, "public.wide"))
