"""Committed transactions assembled from a real server's pgoutput stream: interleaved streamed
transactions, rolled-back savepoints and aborts, spilled to disk past the memory limit."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg2
import pytest

from changelake.capture.postgres import pgoutput as po
from changelake.capture.postgres.pgoutput import PgOutputError
from changelake.capture.postgres.transactions import (
    Assembler,
    RowChange,
    Spool,
    Transaction,
    change_size,
)


@pytest.fixture
def conns(pg_dsn: str) -> Iterator[list[psycopg2.extensions.connection]]:
    conns = [psycopg2.connect(pg_dsn) for _ in range(3)]
    for conn in conns:
        conn.autocommit = True
    with conns[0].cursor() as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, s text)")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot('slot', 'pgoutput')")
    yield conns
    for conn in conns:
        conn.close()


def assembled(conn: psycopg2.extensions.connection, memory_limit: int) -> list[Transaction]:
    with conn.cursor() as c:
        c.execute("SELECT lsn, data FROM pg_logical_slot_get_binary_changes('slot', NULL, NULL, "
                  "'proto_version', '2', 'publication_names', 'pub', 'streaming', 'on', "
                  "'messages', 'true')")
        rows = c.fetchall()
    decoder, assembler, done = po.Decoder(), Assembler(memory_limit), []
    for lsn, data in rows:
        at = po.parse_lsn(lsn)
        tx = assembler.push(decoder.decode(bytes(data), at), at)
        if tx is not None:
            done.append(tx)
    assert not assembler.streamed and assembler.current is None
    return done


def ids(tx: Transaction) -> list[int]:
    return [int(c.new[0]) for c in tx.changes() if c.kind == "insert"]  # type: ignore[index]


@pytest.mark.parametrize("memory_limit", [100_000, 100, 1])
def test_interleaved_streamed_transactions_commit_whole_and_aborts_vanish(conns, memory_limit):
    a, b, c = (conn.cursor() for conn in conns)
    a.execute("BEGIN; INSERT INTO t SELECT g, repeat('a', 80) FROM generate_series(1, 2000) g")
    c.execute("BEGIN; INSERT INTO t SELECT g, repeat('c', 80) FROM generate_series(5001, 8000) g")
    b.execute("INSERT INTO t VALUES (-1, 'small')")
    a.execute("SAVEPOINT one; INSERT INTO t SELECT g, 'x' FROM generate_series(2001, 3500) g")
    a.execute("SAVEPOINT two; INSERT INTO t SELECT g, 'y' FROM generate_series(3501, 4000) g")
    a.execute("ROLLBACK TO one; INSERT INTO t SELECT g, 'kept' FROM generate_series(4001, 4005) g")
    c.execute("ROLLBACK")
    a.execute("COMMIT")
    b.execute("INSERT INTO t VALUES (-2, 'after')")
    small, big, after = assembled(conns[0], memory_limit)
    assert ids(small) == [-1] and ids(after) == [-2]
    assert big.streamed and not small.streamed
    assert ids(big) == [*range(1, 2001), *range(4001, 4006)]
    assert small.commit_lsn < big.commit_lsn < after.commit_lsn
    assert big.end_lsn > big.commit_lsn


def test_changes_carry_their_relation_and_images(conns) -> None:
    cur = conns[0].cursor()
    cur.execute("SELECT pg_logical_emit_message(false, 'side', 'x')")
    cur.execute("BEGIN; INSERT INTO t VALUES (1, 'a'); UPDATE t SET id = 2; DELETE FROM t; "
                "SELECT pg_logical_emit_message(true, 'in', 'y'); TRUNCATE t; COMMIT")
    tx, = assembled(conns[0], 10)
    kinds = [(c.kind, c.relation.name, c.old, c.new) for c in tx.changes()]
    assert kinds == [("insert", "t", None, ("1", "a")), ("update", "t", ("1", None), ("2", "a")),
                     ("delete", "t", ("2", None), None), ("message", "", None, None),
                     ("truncate", "t", None, None)]


def test_spool_truncates_in_memory_and_on_disk() -> None:
    relation = po.Relation(None, 1, "public", "t", "d", ())
    spool = Spool(memory_limit=3 * change_size(RowChange(relation, "insert", new=("0",))))
    for i in range(8):
        spool.append(RowChange(relation, "insert", new=(str(i),)))
    assert len(spool) == 8 and spool.spilled == 5
    spool.truncate(6)
    assert [c.new for c in spool] == [(str(i),) for i in range(6)]
    spool.append(RowChange(relation, "insert", new=("x",)))
    assert [c.new for c in spool][-2:] == [("5",), ("x",)]
    spool.truncate(2)
    assert [c.new for c in spool] == [("0",), ("1",)] and spool.file is None
    assert spool.budget.used == spool.bytes == 2 * change_size(spool.head[0])
    spool.close()
    assert spool.budget.used == 0


def test_open_transactions_keep_their_bytes_in_memory_together_within_the_limit(conns) -> None:
    """Three transactions streamed at once, of rows of 2 kB each (6 MB in all), and a limit of
    256 kB for all: what their spools keep in memory stays within it, however many changes that
    is (a limit in changes, 10k per transaction, held them all), and each commits whole."""
    limit = 256 << 10
    cursors = [conn.cursor() for conn in conns]
    for i, cursor in enumerate(cursors):
        cursor.execute(f"BEGIN; INSERT INTO t SELECT g, repeat('{i}', 2000) "
                       f"FROM generate_series({i * 10_000 + 1}, {i * 10_000 + 1000}) g")
    for i, cursor in enumerate(cursors):
        cursor.execute(f"INSERT INTO t SELECT g, repeat('{i}', 2000) "
                       f"FROM generate_series({i * 10_000 + 1001}, {i * 10_000 + 1100}) g")
    for cursor in cursors:
        cursor.execute("COMMIT")
    with conns[0].cursor() as c:
        c.execute("SELECT lsn, data FROM pg_logical_slot_get_binary_changes('slot', NULL, NULL, "
                  "'proto_version', '2', 'publication_names', 'pub', 'streaming', 'on')")
        rows = c.fetchall()
    decoder, assembler, done = po.Decoder(), Assembler(limit), []
    most = 0  # the values' bytes every open or committed spool keeps in memory, at most
    for lsn, data in rows:
        at = po.parse_lsn(lsn)
        tx = assembler.push(decoder.decode(bytes(data), at), at)
        if tx is not None:
            done.append(tx)
        spools = [*(o.spool for o in assembler.streamed.values()), *(d.spool for d in done)]
        if assembler.current is not None:
            spools.append(assembler.current.spool)
        most = max(most, sum(len(c.new[1]) for s in spools for c in s.head if c.new))
    assert len(done) == 3 and sum(tx.streamed for tx in done) >= 2
    assert 0 < most <= limit and assembler.budget.peak <= limit
    for tx in done:
        assert len(ids(tx)) == 1100 and tx.bytes > 1100 * 2000
    assert assembler.budget.used == 0  # every spool read (and released)


@pytest.mark.parametrize(("messages", "error"), [
    ([po.Commit(0, 1, 2, 3)], "Commit without a Begin"),
    ([po.Begin(1, 2, 3), po.Begin(1, 2, 4)], "Begin inside another transaction"),
    ([po.Begin(1, 2, 3), po.Insert(None, 77, ("1",))], "change to relation 77 before its Relation"),
    ([po.Insert(None, 77, ("1",))], "Insert outside a transaction"),
    ([po.StreamCommit(5, 0, 1, 2, 3)], "streamed transaction 5 was never started"),
    ([po.StreamStart(5, True), po.StreamStop(), po.StreamStart(5, True)],
     "transaction 5 streamed twice"),
])
def test_a_stream_out_of_shape_is_refused(messages: list, error: str) -> None:
    assembler = Assembler()
    with pytest.raises(PgOutputError, match=f"WAL 0/10: {error}"):
        for message in messages:
            assembler.push(message, 0x10)
