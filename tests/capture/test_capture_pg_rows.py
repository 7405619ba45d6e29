"""Captured transactions as updates, checked against the database itself: the updates of every
transaction, summed, are the table's rows (a differential test with PostgreSQL as the
specification), whatever the replica identity, TOAST, key changes and truncates."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import psycopg2
import pytest

from changelake.capture.postgres import pgoutput as po
from changelake.capture.postgres.rows import CaptureError, Tables
from changelake.capture.postgres.transactions import Assembler
from changelake.capture.postgres.types import SESSION_SETTINGS, catalog
from changelake.errors import SchemaError
from tests.support.seeding import seeded

BIG = "(SELECT string_agg(md5(g::text || {seed}), '') FROM generate_series(1, 200) g)"
OPTIONS = " ".join(f"-c {k}={v.replace(' ', '')}" for k, v in SESSION_SETTINGS.items())


@pytest.fixture
def cur(pg_dsn: str) -> Iterator[psycopg2.extensions.cursor]:
    conn = psycopg2.connect(pg_dsn, options=OPTIONS)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE d (id int PRIMARY KEY, big text, n numeric(6,2), tags text[])")
        c.execute("CREATE TABLE f (id int PRIMARY KEY, big text, x float8)")
        c.execute("ALTER TABLE f REPLICA IDENTITY FULL")
        c.execute("CREATE TABLE nokey (a int, b text)")
        c.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot('slot', 'pgoutput')")
        yield c
    conn.close()


def capture(cur: psycopg2.extensions.cursor, tables: Tables) -> dict[str, Counter]:
    cur.execute("SELECT lsn, data FROM pg_logical_slot_get_binary_changes('slot', NULL, NULL, "
                "'proto_version', '2', 'publication_names', 'pub', 'streaming', 'on')")
    decoder, assembler = po.Decoder(), Assembler(memory_limit=20_000)  # bytes: some kept
    total: dict[str, Counter] = {}
    times = []
    for lsn, data in cur.fetchall():
        at = po.parse_lsn(lsn)
        tx = assembler.push(decoder.decode(bytes(data), at), at)
        if tx is not None:
            times.append(tx.commit_lsn)
            for table, diffs in tables.updates(tx).items():
                total.setdefault(table, Counter()).update(diffs)
    assert times == sorted(times)
    return {t: Counter({r: d for r, d in c.items() if d}) for t, c in total.items()}


def database(cur: psycopg2.extensions.cursor, table: str, tables: Tables) -> Counter:
    """The table's rows read as the capture reads them: each value's text through its type."""
    known = next(t for t in tables if t.qualified == f"public.{table}")
    cur.execute(f"SELECT {', '.join(f'{c}::text' for c in known.columns)} FROM {table}")
    return Counter(tuple(None if v is None else kind.read(v)
                         for kind, v in zip(known.types, row, strict=True))
                   for row in cur.fetchall())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_updates_sum_to_the_tables(cur, seed: int) -> None:
    rng = seeded(seed)
    keys = {"d": set(), "f": set()}
    for step in range(120):
        table = rng.choice(["d", "f"])
        action = rng.random()
        live = sorted(keys[table])
        if action < 0.4 or not live:
            k = rng.randrange(1000)
            if k in keys[table]:
                continue
            extra = "1.25, '{a,\"b c\"}'" if table == "d" else "'NaN'"
            cur.execute(f"INSERT INTO {table} VALUES ({k}, {BIG.format(seed=step)}, {extra})")
            keys[table].add(k)
        elif action < 0.7:
            column = "n = n + 1" if table == "d" else "x = x + 1"
            cur.execute(f"UPDATE {table} SET {column} WHERE id = {rng.choice(live)}")  # TOAST
        elif action < 0.8:
            old, new = rng.choice(live), rng.randrange(1000, 2000)
            if new in keys[table]:
                continue
            cur.execute(f"UPDATE {table} SET id = {new} WHERE id = {old}")
            keys[table] = (keys[table] - {old}) | {new}
        elif action < 0.95:
            victim = rng.choice(live)
            cur.execute(f"DELETE FROM {table} WHERE id = {victim}")
            keys[table].discard(victim)
        else:
            cur.execute(f"TRUNCATE {table}")
            keys[table].clear()
    cur.execute("BEGIN; INSERT INTO nokey SELECT g, 'r' FROM generate_series(1, 600) g; "
                "UPDATE nokey SET b = 's' WHERE a % 2 = 0; DELETE FROM nokey WHERE a % 3 = 0;"
                " COMMIT")  # large enough to stream
    tables = Tables(catalog(cur.connection.cursor()))
    total = capture(cur, tables)
    for table in ("d", "f", "nokey"):
        expected = database(cur, table, tables)
        assert total.get(f"public.{table}", Counter()) == expected, table
        assert Counter(tables.current(f"public.{table}").values()) == expected


def test_a_table_without_key_or_identity_is_refused_by_name(cur) -> None:
    cur.execute("CREATE TABLE plain (a int)")
    cur.execute("INSERT INTO plain VALUES (1)")
    with pytest.raises(SchemaError, match=r"table public\.plain has no primary key or replica "
                                          "identity"):
        capture(cur, Tables(catalog(cur.connection.cursor())))


def test_a_change_to_a_row_the_state_lacks_is_named(cur) -> None:
    cur.execute("INSERT INTO d VALUES (5, 'x', 1, NULL)")
    tables = Tables(catalog(cur.connection.cursor()))
    capture(cur, tables)
    tables.rows["public.d"].clear()  # as if the snapshot had been skipped
    cur.execute("UPDATE d SET n = 2")
    with pytest.raises(CaptureError, match=r"table public.d: update of key \(id=5\), which has "
                                           "no current row"):
        capture(cur, tables)


def test_identical_rows_without_a_key_are_refused(cur) -> None:
    cur.execute("INSERT INTO nokey VALUES (1, 'same'), (1, 'same')")
    with pytest.raises(CaptureError, match=r"table public\.nokey: insert of key"):
        capture(cur, Tables(catalog(cur.connection.cursor())))
