"""Capture into lake tables against the embedded PostgreSQL: the snapshot handoff under
concurrent writes (nothing missing, nothing doubled), a restart from the lake's frontier, and
the cross-table invariant of concurrent transfers at several AS OF times."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal

import psycopg2
import pytest

from changelake.capture.postgres.rows import CaptureError
from changelake.capture.postgres.source import SourceError
from changelake.capture.postgres.to_lake import CaptureOptions, LakeCapture, consistent_frontier
from changelake.lake.arrow import read_table
from changelake.lake.catalog import Lake
from tests.support.postgres import execute
from tests.support.seeding import seeded

ACCOUNTS = 20
OPENING = Decimal("100.00")


@pytest.fixture
def bank(pg_dsn: str) -> Iterator[str]:
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance numeric(12,2) NOT NULL,"
                  " note text)")
        c.execute("CREATE TABLE ledger (id bigserial PRIMARY KEY, src int, dst int, "
                  "amount numeric(12,2))")
        c.execute(f"INSERT INTO accounts SELECT g, {OPENING}, 'open' FROM "
                  f"generate_series(1, {ACCOUNTS}) g")
        c.execute("CREATE PUBLICATION bank FOR TABLE accounts, ledger")
    yield pg_dsn
    conn.close()


class Transfers(threading.Thread):
    """Moves money between random accounts, one transaction per transfer, until stopped or
    `limit` transfers are made, pausing `pause` seconds between them."""

    def __init__(self, dsn: str, seed: int, limit: int = 100_000, pause: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rng, self.stop, self.count = dsn, seeded(seed), threading.Event(), 0
        self.limit, self.pause = limit, pause

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        with conn.cursor() as c:
            while not self.stop.is_set() and self.count < self.limit:
                a, b = self.rng.sample(range(1, ACCOUNTS + 1), 2)
                amount = Decimal(self.rng.randrange(1, 500)) / 100
                c.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s",
                          (amount, a))
                c.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s",
                          (amount, b))
                c.execute("INSERT INTO ledger (src, dst, amount) VALUES (%s, %s, %s)",
                          (a, b, amount))
                conn.commit()
                self.count += 1
                self.stop.wait(self.pause)
        conn.close()


def rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def database(dsn: str, table: str) -> Counter:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute(f"SELECT * FROM {table}")
        out = Counter(tuple(r) for r in c.fetchall())
    conn.close()
    return out


def check_invariant(lake: Lake, time: int) -> None:
    accounts = {r["id"]: r["balance"] for r in lake.table("public.accounts").as_of(time).collect()}
    ledger = lake.table("public.ledger").as_of(time).collect()
    assert sum(accounts.values()) == OPENING * ACCOUNTS, time
    for account, balance in accounts.items():
        moved = sum((r["amount"] if r["dst"] == account else -r["amount"]) for r in ledger
                    if account in (r["src"], r["dst"]))
        assert balance == OPENING + moved, (time, account)


def test_snapshot_handoff_restart_and_cross_table_invariant(spark, bank: str, tmp_path) -> None:
    lake = Lake(spark, tmp_path / "lake")
    writer = Transfers(bank, seed=7)
    writer.start()
    try:
        first = LakeCapture(lake, CaptureOptions(bank, "bank", "lake_slot", create_slot=True,
                                                 max_txns=15)).run()
    finally:
        writer.stop.set()
        writer.join()
    assert first.snapshot_rows["public.accounts"] == ACCOUNTS
    assert first.transactions >= 15
    # The restart resumes from the lake's frontier with the existing slot.
    second = LakeCapture(lake, CaptureOptions(bank, "bank", "lake_slot", until_idle=1.5)).run()
    captured = first.transactions + second.transactions
    assert captured + first.snapshot_rows["public.ledger"] == writer.count
    for table in ("accounts", "ledger"):
        assert rows(lake.table(f"public.{table}").current()) == database(bank, table), table
    frontier = consistent_frontier(lake, ["public.accounts", "public.ledger"])
    assert frontier is not None
    times = sorted({r["_time"] for r in lake.table("public.ledger").updates().collect()})
    rng = seeded(3)
    for time in [0, *rng.sample(times, min(6, len(times))), frontier - 1]:
        check_invariant(lake, time)


def test_a_missing_slot_or_publication_is_named(spark, pg_dsn: str, tmp_path) -> None:
    # Tables of its own: the session's metastore still names the other test's lake tables,
    # and the capture reads the lake's (to refuse a dropped slot) before it opens the slot.
    execute(pg_dsn, "CREATE TABLE unslotted (id int PRIMARY KEY)",
            "CREATE PUBLICATION bank FOR TABLE unslotted")
    lake = Lake(spark, tmp_path / "lake")
    with pytest.raises(SourceError, match="replication slot 'nope' does not exist"):
        LakeCapture(lake, CaptureOptions(pg_dsn, "bank", "nope")).run()
    with pytest.raises(SourceError, match="publication 'other' does not exist"):
        LakeCapture(lake, CaptureOptions(pg_dsn, "other", "nope", create_slot=True)).run()


def test_a_row_twice_in_a_snapshot_is_refused_as_the_stream_refuses_it(spark, pg_dsn: str,
                                                                       tmp_path) -> None:
    # Keyed by REPLICA IDENTITY FULL (every column), a table holding a row twice cannot be a
    # keyed lake table: the snapshot's commit names the row instead of showing it once.
    execute(pg_dsn, "CREATE TABLE twice (a int, b text)",
            "ALTER TABLE twice REPLICA IDENTITY FULL",
            "INSERT INTO twice VALUES (1, 'x'), (1, 'x'), (2, 'y')",
            "CREATE PUBLICATION twice FOR TABLE twice")
    lake = Lake(spark, tmp_path / "lake")
    with pytest.raises(CaptureError, match=r'table public\.twice: key \(a=1, b="x"\) has an '
                                           r"insertion with diff 2 at time 0;.*\. The source "
                                           r"table has no primary key"):
        LakeCapture(lake, CaptureOptions(pg_dsn, "twice", "twice_slot", create_slot=True,
                                         until_idle=1.0)).run()
    assert not lake.table("public.twice").current().collect()


def _signs(values: object) -> object:
    """A float's sign as `math.copysign` gives it (so -0.0 is -1.0), through a list."""
    if isinstance(values, (list, tuple)):
        return tuple(_signs(v) for v in values)
    return None if values is None else math.copysign(1.0, values)  # type: ignore[arg-type]


def _text_signs(text: str | None) -> object:
    """The sign of a float as PostgreSQL prints it (`-0`, `0`, `{-0,1.5}`)."""
    if text is None:
        return None
    if text.startswith("{"):
        return tuple(_text_signs(t) for t in text[1:-1].split(","))
    return -1.0 if text.startswith("-") else 1.0


def test_negative_zero_keeps_its_sign_in_the_snapshot_and_the_stream(spark, pg_dsn: str,
                                                                      tmp_path) -> None:
    # PostgreSQL tells -0 from 0 (`SELECT '-0'::float8` prints -0), and so must the lake,
    # whichever way the value came: the snapshot (whose copies of a row are consolidated by
    # a grouping, which Spark makes of -0.0 a 0.0) and the stream alike. A table keyed by
    # every column (REPLICA IDENTITY FULL) holds its zeros in its key.
    execute(pg_dsn,
            "CREATE TABLE zeros (id int PRIMARY KEY, d double precision, r real, "
            "a double precision[])",
            "CREATE TABLE zeros_full (d double precision, r real)",
            "ALTER TABLE zeros_full REPLICA IDENTITY FULL",
            "INSERT INTO zeros VALUES (1, '-0', '-0', '{-0,1.5}'), (2, '0', '0', '{0}'), "
            "(3, '-0', '1.5', NULL)",
            "INSERT INTO zeros_full VALUES ('-0', '-0'), ('1', '0')",
            "CREATE PUBLICATION zeros FOR TABLE zeros, zeros_full")
    lake = Lake(spark, tmp_path / "lake")
    first = LakeCapture(lake, CaptureOptions(pg_dsn, "zeros", "zeros_slot", create_slot=True,
                                             until_idle=0.5)).run()
    assert first.snapshot_rows == {"public.zeros": 3, "public.zeros_full": 2}
    execute(pg_dsn, "INSERT INTO zeros VALUES (4, '-0', '-0', '{1,-0}'), (5, '0', '0', '{0}')",
            "UPDATE zeros SET d = '-0', r = '2', a = '{-0}' WHERE id = 5",
            "UPDATE zeros SET r = '-0' WHERE id = 3",
            "UPDATE zeros SET d = '-0' WHERE id = 2",  # its zero's sign alone: no change
            "INSERT INTO zeros_full VALUES ('-0', '2'), ('3', '-0')")
    LakeCapture(lake, CaptureOptions(pg_dsn, "zeros", "zeros_slot", until_idle=1.5)).run()
    conn = psycopg2.connect(pg_dsn)
    with conn.cursor() as c:
        c.execute("SELECT id, d::text, r::text, a::text FROM zeros")
        held = {r[0]: tuple(_text_signs(t) for t in r[1:]) for r in c.fetchall()}
        c.execute("SELECT d::text, r::text FROM zeros_full")
        held_full = Counter(tuple(_text_signs(t) for t in r) for r in c.fetchall())
    conn.close()
    assert sum(s == -1.0 for row in held.values() for s in row) == 8  # the server's own -0
    # A limit (`rows` module docstring): an update of nothing but a zero's sign is a
    # retraction and an insertion of rows equal in Python, which consolidate to nothing.
    assert held[2] == (-1.0, 1.0, (1.0,))
    held[2] = (1.0, 1.0, (1.0,))
    for how, frame in (("spark", lambda n: [tuple(r) for r in lake.table(n).current().collect()]),
                       ("arrow", lambda n: [tuple(r.values()) for r in
                                            read_table(tmp_path / "lake", n).to_pylist()])):
        got = {r[0]: tuple(_signs(v) for v in r[1:]) for r in frame("public.zeros")}
        assert got == held, how
        got_full = Counter(tuple(_signs(v) for v in r) for r in frame("public.zeros_full"))
        assert got_full == held_full, how
