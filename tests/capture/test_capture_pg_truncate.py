"""A TRUNCATE in the captured stream, against the embedded PostgreSQL: the lake table is
emptied by a Spark job (the capture never reads the table's rows into the driver), AS OF before
it still shows them, in either table format; the batch's own changes around it (in earlier
transactions, before and after it in its own, a second truncate) come out as the database's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import psycopg2
import pytest

from changelake.capture.postgres.capture import Capture
from changelake.capture.postgres.pgoutput import parse_lsn
from changelake.capture.postgres.rows import Key, Table
from changelake.capture.postgres.to_lake import CaptureOptions, LakeSink
from changelake.capture.postgres.to_log import LogSink, _truncate_messages
from changelake.capture.postgres.types import catalog
from changelake.lake.catalog import Lake
from changelake.protocol import Antichain, Progress, Updates
from tests.support.postgres import execute

pytestmark = pytest.mark.usefixtures("no_public_views")

ROWS = 300


@pytest.fixture
def shop(pg_dsn: str) -> Iterator[str]:
    execute(pg_dsn,
            "CREATE TABLE items (id int PRIMARY KEY, name text, qty int)",
            "CREATE TABLE other (id int PRIMARY KEY, v int)",
            f"INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, {ROWS}) g",
            "INSERT INTO other VALUES (1, 1)",
            "CREATE PUBLICATION shop FOR TABLE items, other")
    yield pg_dsn


class AskingSink(LakeSink):
    """The lake sink, recording what the capture asks of it (the keys of each fetch)."""

    asked: list[set[Key] | None]

    def fetch(self, table: Table, keys: set[Key]) -> list:
        self.asked = [*getattr(self, "asked", []), None if keys is None else set(keys)]
        return super().fetch(table, keys)


def database(dsn: str, table: str) -> Counter:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute(f"SELECT * FROM {table}")
        out = Counter(tuple(r) for r in c.fetchall())
    conn.close()
    return out


def wal_position(dsn: str) -> int:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT pg_current_wal_lsn()::text")
        at = parse_lsn(c.fetchone()[0])
    conn.close()
    return at


def rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


@pytest.mark.parametrize("storage", ["hive", "delta"])
def test_a_truncate_empties_the_lake_table_by_a_spark_job(spark, shop: str, tmp_path,
                                                          storage: str) -> None:
    lake = Lake(spark, tmp_path / "lake", storage=storage)
    options = CaptureOptions(shop, "shop", "trunc_slot", create_slot=True, until_idle=0.5)
    first = Capture(AskingSink(lake, options), options).run()
    assert first.snapshot_rows["public.items"] == ROWS
    execute(shop,
            "UPDATE items SET qty = -1 WHERE id = 1",  # earlier transactions of the batch
            "DELETE FROM items WHERE id = 2",
            "INSERT INTO items VALUES (1001, 'new', 0)")
    before = database(shop, "items")
    just_before = wal_position(shop)
    execute(shop,
            # One transaction: changes before the truncate (of a lake row and of a new one),
            # the truncate, changes after it, a second truncate, and one more row.
            "BEGIN; UPDATE items SET qty = -3 WHERE id = 3; DELETE FROM items WHERE id = 4; "
            "INSERT INTO items VALUES (1002, 'gone', 0); TRUNCATE items; "
            "INSERT INTO items VALUES (1, 'again', 1), (1003, 'x', 3); "
            "UPDATE other SET v = 2; COMMIT",
            "INSERT INTO items VALUES (1004, 'later', 4)",
            "BEGIN; DELETE FROM items WHERE id = 1003; TRUNCATE items; "
            "INSERT INTO items VALUES (7, 'last', 7); COMMIT")
    after = database(shop, "items")
    assert after == Counter({(7, "last", 7): 1})
    sink = AskingSink(lake, CaptureOptions(shop, "shop", "trunc_slot", until_idle=1.0,
                                           batch_seconds=60.0))
    second = Capture(sink, sink.options).run()
    assert second.transactions == 6 and second.batches == 1
    # No fetch of every row (the capture read the whole table into the driver for one).
    assert None not in sink.asked
    assert sorted(map(sorted, sink.asked)) == [[(1,)], [(1,), (2,), (3,), (4,)]]  # keys
    table = lake.table("public.items")
    assert table.state().storage == storage
    assert rows(table.current()) == after
    assert rows(table.as_of(just_before)) == before  # the history before it is kept
    assert rows(lake.table("public.other").current()) == database(shop, "other")
    # Each time's updates consolidated: the truncate's time retracts every row once.
    updates = Counter()
    for r in table.updates().collect():
        updates[(tuple(r)[:-2], r["_time"])] += r["_diff"]
    assert all(d in (-1, 1) for d in updates.values()), updates
    # A restart re-reads nothing of it: the lake table is past the truncate, whatever the
    # slot re-sends.
    third = Capture(AskingSink(lake, CaptureOptions(shop, "shop", "trunc_slot",
                                                    until_idle=0.5)), options).run()
    assert third.transactions == 0
    assert rows(table.current()) == after


class AskingLogSink(LogSink):
    """The log sink (`--out`), recording the keys of each fetch."""

    asked: list[set[Key] | None]

    def fetch(self, table: Table, keys: set[Key]) -> list:
        self.asked = [*getattr(self, "asked", []), None if keys is None else set(keys)]
        return super().fetch(table, keys)


def test_a_truncate_in_a_log_retracts_its_rows_without_a_copy_of_the_table(shop: str,
                                                                           tmp_path) -> None:
    out = tmp_path / "out"
    options = CaptureOptions(shop, "shop", "trunc_log", create_slot=True, until_idle=0.5)
    Capture(AskingLogSink(out, options), options).run()
    execute(shop,
            "UPDATE items SET qty = -1 WHERE id = 1",
            "DELETE FROM items WHERE id = 2",
            "BEGIN; UPDATE items SET qty = -3 WHERE id = 3; TRUNCATE items; "
            "INSERT INTO items VALUES (1, 'again', 1), (2, 'item 2', 2); COMMIT",
            "BEGIN; TRUNCATE items; INSERT INTO items VALUES (7, 'last', 7); COMMIT",
            "INSERT INTO items VALUES (8, 'more', 8)")
    sink = AskingLogSink(out, CaptureOptions(shop, "shop", "trunc_log", until_idle=1.0,
                                             batch_seconds=60.0))
    second = Capture(sink, sink.options).run()
    assert second.transactions == 5
    assert None not in sink.asked  # no fetch of every row
    assert sink.current["public.items"] == {(7,): (7, "last", 7), (8,): (8, "more", 8)}
    # Read back from the log alone, as a restart does: the database's rows.
    conn = psycopg2.connect(shop)
    table = Table.from_catalog(conn.cursor(), "public.items", catalog(conn.cursor()))
    conn.close()
    upper, current = LogSink(out, sink.options).read_log(table)
    assert upper == second.frontier
    assert Counter(current.values()) == database(shop, "items")


def test_a_truncate_segment_reads_the_rows_it_retracts_a_batch_at_a_time() -> None:
    """The log's rows are retracted as the segment is made: at most `batch_size` of them read
    ahead of the messages out, and each time's updates consolidated (a row the batch put
    back at the truncate's time is retracted once, not twice)."""
    read = 0

    def held():
        nonlocal read
        for i in range(10_000):
            read += 1
            yield (i, "row")

    changes = Counter({((5, "row"), 20): 1, ((20_000, "new"), 10): 1,
                       ((20_000, "new"), 20): -1, ((30_000, "after"), 25): 1})
    messages = _truncate_messages(changes, held(), 20, 10, 30, batch_size=100)
    first = next(messages)
    assert isinstance(first, Updates) and first.updates == [((20_000, "new"), 10, 1)]
    assert next(messages).upper == Antichain([11])
    assert next(messages).upper == Antichain([20]) and read == 0
    chunk = next(messages)
    assert len(chunk.updates) == 100 and read <= 101
    rest = list(messages)
    updates = [*chunk.updates, *(u for m in rest if isinstance(m, Updates) for u in m.updates)]
    at_20 = Counter({row: d for row, at, d in updates if at == 20})
    assert at_20[(5, "row")] == 0 and at_20[(20_000, "new")] == -1
    assert len(at_20) == 10_000 and all(d == -1 for d in at_20.values())
    progress = [m for m in rest if isinstance(m, Progress)]
    assert progress[0].counts == ((20, 10_000),) and progress[-1].upper == Antichain([30])
