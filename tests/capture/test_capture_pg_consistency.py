"""One database's lake tables as one time domain, against the embedded PostgreSQL: each table
records its source database; the lake's consistent frontier per database; every table AS OF one
transaction (the transfers invariant across accounts and ledger) through `database_as_of` and
through the CLI; AS OF beyond the consistent frontier refused; the slot's lag in `status`
(live, and "unreachable" without hanging); the heartbeat of a quiet capture; and the initial
snapshot staged in batches and committed at once."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import orjson
import psycopg2
import pytest
from pyspark.sql import types as T
from rich.console import Console

from changelake.capture.postgres import database_as_of
from changelake.capture.postgres.consistency import kept_dsn, probe
from changelake.capture.postgres.pgoutput import format_lsn, parse_lsn
from changelake.capture.postgres.source import SourceError
from changelake.capture.postgres.to_lake import CaptureOptions, LakeCapture, consistent_frontier
from changelake.lake import api, report
from changelake.lake.catalog import Lake
from changelake.lake.layout import Origin, TableState, read_manifest
from changelake.lake.sources import ConsistencyError, find_source, sources
from tests.capture import test_capture_pg_lake
from tests.capture.test_capture_pg_lake import ACCOUNTS, OPENING, Transfers, database, rows
from tests.support.postgres import execute
from tests.support.seeding import seeded

bank = test_capture_pg_lake.bank  # the fixture: accounts, ledger, publication bank

CLI = [str(Path(sys.executable).parent / "changelake")]
TABLES = ("public.accounts", "public.ledger")


pytestmark = pytest.mark.usefixtures("no_public_views")


def invariant(accounts_rows: list[dict], ledger_rows: list[dict], where: object) -> None:
    """The transfers' invariant: money is only moved (the total stays), and every account's
    balance is its opening plus what the ledger moved to it minus what it moved away."""
    balances = {int(r["id"]): Decimal(str(r["balance"])) for r in accounts_rows}
    assert len(balances) == ACCOUNTS, where
    assert sum(balances.values()) == OPENING * ACCOUNTS, where
    moved = dict.fromkeys(balances, Decimal(0))
    for r in ledger_rows:
        amount = Decimal(str(r["amount"]))
        moved[int(r["src"])] -= amount
        moved[int(r["dst"])] += amount
    for account, balance in balances.items():
        assert balance == OPENING + moved[account], (where, account)


def slot_confirmed(dsn: str, slot: str) -> int:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                  "WHERE slot_name = %s", (slot,))
        (text,) = c.fetchone()
    conn.close()
    return parse_lsn(text)


def current_lsn(dsn: str) -> int:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT pg_current_wal_lsn()::text")
        (text,) = c.fetchone()
    conn.close()
    return parse_lsn(text)


@pytest.mark.slow  # a minute or more on 2 cores; test_capture_pg_lake holds tables to one another
def test_origin_consistent_frontier_and_database_as_of(spark, bank: str, tmp_path) -> None:
    lake = Lake(spark, tmp_path / "lake")
    writer = Transfers(bank, seed=11, limit=300)  # bounded work, however slow the machine
    writer.start()
    try:
        # 7 rows a batch: the 20 accounts are staged in 3 batches, committed in one commit.
        first = LakeCapture(lake, CaptureOptions(bank, "bank", "db_slot", create_slot=True,
                                                 max_txns=12, until_idle=5,
                                                 snapshot_batch_rows=7)).run()
    finally:
        writer.stop.set()
        writer.join()
    second = LakeCapture(lake, CaptureOptions(bank, "bank", "db_slot", until_idle=1.5)).run()
    assert first.snapshot_rows["public.accounts"] == ACCOUNTS
    assert first.transactions + second.transactions + first.snapshot_rows["public.ledger"] \
        == writer.count

    # The snapshot is one commit (version 1 after the creation), and its stage is gone.
    accounts = lake.table("public.accounts")
    snap = read_manifest(accounts.directory, 1)
    assert (snap.operation, snap.detail["rows"], snap.detail["lower"]) == ("commit", ACCOUNTS, 0)
    assert not (accounts.directory / "_snapshot_stage").exists()

    # Each table records its database; one identity, so one source with both tables.
    conn = psycopg2.connect(bank)
    with conn.cursor() as c:
        c.execute("SELECT (SELECT system_identifier FROM pg_control_system())::text, oid, "
                  "datname FROM pg_database WHERE datname = current_database()")
        system, oid, name = c.fetchone()
    conn.close()
    for table in TABLES:
        origin = lake.table(table).state().origin
        assert origin is not None and origin.kind == "postgres"
        assert (origin.source, origin.name) == (f"postgres:{system}:{oid}", name)
        assert origin.details["slot"] == "db_slot" and origin.details["publication"] == "bank"
        assert "password" not in origin.details["dsn"] and f"dbname={name}" in \
            origin.details["dsn"]
    (group,) = sources(lake)
    assert group.tables == TABLES and group.source == f"postgres:{system}:{oid}"
    frontier = consistent_frontier(lake, TABLES)
    assert group.frontier == frontier == second.frontier
    assert find_source(lake, name) == find_source(lake, group.source) == group

    # status: per source, the tables, the consistent frontier as time and LSN, the slot's lag.
    status = api.lake_status(lake, count_rows=False)
    assert {t.name: t.source for t in status.tables} == dict.fromkeys(TABLES, group.source)
    (line,) = status.sources
    assert (line.database, line.tables, line.frontier, line.frontier_lsn) == (
        name, list(TABLES), [frontier], format_lsn(frontier))
    (slot,) = line.slots
    assert slot.reachable and slot.error is None and slot.slot == "db_slot"
    assert slot.lag_bytes == parse_lsn(slot.current) - parse_lsn(slot.confirmed) >= 0

    # The latest consistent state is the database now (nothing was written since).
    latest = database_as_of(lake, name)
    assert set(latest) == set(TABLES)
    for table in TABLES:
        assert rows(latest[table]) == database(bank, table.split(".")[1]), table
    # At several times up to the consistent frontier, the invariant holds across both tables,
    # through the helper and through `snapshot` (what the CLI runs).
    times = sorted({r["_time"] for r in lake.table("public.ledger").updates().collect()})
    rng = seeded(5)
    middle = rng.sample(times, min(2, len(times)))
    for at in sorted({0, *middle, frontier - 1}):
        frames = database_as_of(lake, group.source, at)
        invariant([r.asDict() for r in frames["public.accounts"].collect()],
                  [r.asDict() for r in frames["public.ledger"].collect()], at)
    for at in middle[:1]:
        invariant(list(api.snapshot(lake, "public.accounts", as_of=at)),
                  list(api.snapshot(lake, "public.ledger", as_of=at)), at)

    # One table ahead of the other: AS OF between the frontiers is refused, naming the
    # consistent frontier; beyond the table's own frontier the table's own error stands.
    ledger = lake.table("public.ledger")
    empty = spark.createDataFrame([], ledger.schema.add("_time", T.LongType())
                                  .add("_diff", T.LongType()))
    ledger.commit(empty, frontier, frontier + 100)
    assert find_source(lake, name).frontier == frontier
    expected = rf"consistent frontier of database {name} .*: {frontier} \(LSN " \
        rf"{format_lsn(frontier)}\); public.accounts committed only through {frontier - 1}"
    with pytest.raises(ConsistencyError, match=expected):
        list(api.snapshot(lake, "public.ledger", as_of=frontier + 50))
    with pytest.raises(ConsistencyError, match=expected):
        database_as_of(lake, name, frontier)
    with pytest.raises(Exception, match="is not final yet"):
        list(api.snapshot(lake, "public.ledger", as_of=frontier + 100))
    assert rows(database_as_of(lake, name)["public.ledger"]) == rows(ledger.as_of(frontier - 1))
    with pytest.raises(ConsistencyError, match="no tables captured from database 'nope'"):
        database_as_of(lake, "nope")


def test_status_says_unreachable_and_old_manifests_read(spark, tmp_path) -> None:
    """A source that cannot be reached is reported, not an error, and status returns; a
    manifest written before origins existed reads as a table of no source."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    gone = Origin("postgres", "postgres:1:2", "gone", {
        "slot": "s", "dsn": f"host=127.0.0.1 port={port} user=postgres dbname=gone"})
    lake = Lake(spark, tmp_path / "lake")
    lake.create_table("public.t", T.StructType([T.StructField("id", T.LongType())]),
                      key=["id"], origin=gone)
    status = api.lake_status(lake, count_rows=False)
    (line,) = status.sources
    (slot,) = line.slots
    assert not slot.reachable and slot.error.startswith("unreachable: ")
    assert (line.database, line.frontier, line.frontier_lsn) == ("gone", [0], "0/0")
    assert json.loads(orjson.dumps(line.to_json()))["slots"][0]["reachable"] is False
    printed = Console(file=io.StringIO(), width=200)
    printed.print(report.sources_table(status.sources))
    assert "unreachable" in printed.file.getvalue() and "postgres:1:2" in printed.file.getvalue()

    state = lake.table("public.t").state()
    assert TableState.from_json(state.to_json()) == state
    old = json.loads(state.to_json())
    del old["origin"]
    assert TableState.from_json(json.dumps(old)).origin is None


def test_probe_names_another_database_and_a_missing_slot(pg_dsn: str, postgres) -> None:
    conn = psycopg2.connect(pg_dsn)
    with conn.cursor() as c:
        c.execute("SELECT current_database()")
        (name,) = c.fetchone()
    conn.close()
    other = probe(Origin("postgres", "postgres:1:2", name, {"slot": "x", "dsn": pg_dsn}))
    assert other.reachable and "another database" in other.error
    assert kept_dsn("postgresql://u:secret@h:5/db") == "user=u dbname=db host=h port=5"
    assert "secret" not in kept_dsn("host=h password=secret dbname=d")
    assert kept_dsn("postgresql://u@h/db?sslpassword=secret&sslmode=require") == \
        "user=u dbname=db host=h sslmode=require"


def test_resume_refuses_tables_of_another_database(spark, pg_dsn: str, postgres,
                                                  tmp_path) -> None:
    admin = psycopg2.connect(postgres.dsn)
    admin.autocommit = True
    other = f"{pg_dsn.rsplit('dbname=', 1)[1]}_b"
    with admin.cursor() as c:
        c.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{other}"')
    other_dsn = postgres.dsn_for(other)
    try:
        for dsn in (pg_dsn, other_dsn):
            execute(dsn, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION p FOR TABLE t")
        lake = Lake(spark, tmp_path / "lake")
        LakeCapture(lake, CaptureOptions(pg_dsn, "p", "s1", create_slot=True,
                                         snapshot="never", until_idle=0.1)).run()
        conn = psycopg2.connect(other_dsn)
        with conn.cursor() as c:
            c.execute("SELECT pg_create_logical_replication_slot('s2', 'pgoutput')")
        conn.commit()
        conn.close()
        with pytest.raises(SourceError, match=rf"lake table public.t was captured from "
                           rf"database 't_[^']*' \(postgres:\d+:\d+\), not from '{other}'"):
            LakeCapture(lake, CaptureOptions(other_dsn, "p", "s2", until_idle=0.1)).run()
    finally:
        with admin.cursor() as c:
            c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      "WHERE database = %s AND NOT active", (other,))
            c.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')
        admin.close()


class Noise(threading.Thread):
    """Writes to a table no capture reads, so WAL grows while the captured tables are quiet."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.stop = dsn, threading.Event()

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        with conn.cursor() as c:
            while not self.stop.is_set():
                c.execute("INSERT INTO noise (payload) SELECT repeat('x', 200) "
                          "FROM generate_series(1, 50)")
                self.stop.wait(0.05)
        conn.close()


def test_heartbeat_moves_the_slot_while_captured_tables_are_quiet(spark, pg_dsn: str,
                                                                  tmp_path) -> None:
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE quiet (id int PRIMARY KEY)")
        c.execute("CREATE TABLE noise (id bigserial PRIMARY KEY, payload text)")
        c.execute("CREATE PUBLICATION quiet FOR TABLE quiet")
    lake = Lake(spark, tmp_path / "lake")
    LakeCapture(lake, CaptureOptions(pg_dsn, "quiet", "hb", create_slot=True,
                                     snapshot="never", until_idle=0.1)).run()
    start = slot_confirmed(pg_dsn, "hb")
    noise = Noise(pg_dsn)
    noise.start()
    result: list[object] = []
    capture = threading.Thread(daemon=True, target=lambda: result.append(LakeCapture(
        lake, CaptureOptions(pg_dsn, "quiet", "hb", max_txns=1, heartbeat_seconds=0.2)).run()))
    capture.start()
    try:
        # Three times: WAL grows past a mark, and while the capture runs, though no captured
        # transaction arrives, the heartbeat commits the quiet table's frontier past the mark
        # and confirms the slot there. (psycopg2 also moves the slot on its own on keepalives
        # once everything received is confirmed; the lake's frontier is the heartbeat's.)
        quiet = lake.table("public.quiet")
        marks = [start]
        for _ in range(3):
            deadline = time.monotonic() + 120
            while (mark := current_lsn(pg_dsn)) <= marks[-1] + 10_000:  # more WAL
                assert time.monotonic() < deadline and noise.is_alive(), "no noise written"
                time.sleep(0.1)
            marks.append(mark)
            while capture.is_alive() and (slot_confirmed(pg_dsn, "hb") < mark
                                          or quiet.state().upper < mark):
                stuck = (format_lsn(slot_confirmed(pg_dsn, "hb")),
                         format_lsn(quiet.state().upper))
                assert time.monotonic() < deadline, \
                    f"slot and lake frontier stayed at {stuck}, WAL at {format_lsn(mark)}"
                time.sleep(0.2)
            assert capture.is_alive(), result
    finally:
        noise.stop.set()
        noise.join()
        with conn.cursor() as c:
            c.execute("INSERT INTO quiet VALUES (1)")  # the one transaction: the capture ends
        capture.join(120)
    assert not capture.is_alive() and result and result[0].transactions == 1
    assert marks[-1] <= slot_confirmed(pg_dsn, "hb")
    assert rows(lake.table("public.quiet").current()) == database(pg_dsn, "quiet")
    assert lake.table("public.quiet").state().upper > marks[-1]
    conn.close()


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=600)


def cli_rows(lake: list[str], table: str, at: int) -> list[dict]:
    done = run("snapshot", *lake, "--table", table, "--as-of", str(at), "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    return [orjson.loads(line) for line in done.stdout.splitlines()]


AHEAD = """
import sys
from pyspark.sql import types as T
from rich.console import Console
from changelake.lake.api import open_lake
lake = open_lake(sys.argv[1], master="local[1]")
ledger = lake.table("public.ledger")
upper = ledger.state().upper
schema = ledger.schema.add("_time", T.LongType()).add("_diff", T.LongType())
ledger.commit(lake.spark.createDataFrame([], schema), upper, upper + 100)
lake.spark.stop()
"""


@pytest.mark.slow
def test_cli_snapshot_as_of_and_status(bank: str, tmp_path) -> None:
    """Through the console script: capture while transfers run, status per source, snapshot
    AS OF times up to the consistent frontier (the invariant holds), and beyond it an error
    naming it."""
    lake = ["--lake", str(tmp_path / "lake"), "--master", "local[1]"]
    capture = ["capture", "postgres", *lake, "--dsn", bank, "--publication", "bank",
               "--slot", "cli_slot"]
    writer = Transfers(bank, seed=13, limit=60, pause=0.05)
    writer.start()
    try:
        first = run(*capture, "--create-slot", "--max-txns", "8", "--until-idle", "5")
    finally:
        writer.stop.set()
        writer.join()
    assert first.returncode == 0, first.stderr
    second = run(*capture, "--until-idle", "1")
    assert second.returncode == 0, second.stderr
    # The ledger a little ahead of the accounts, as a capture stopped between the two tables'
    # commits of a batch leaves them (an empty commit, in a process of its own on the lake).
    ahead = subprocess.run([sys.executable, "-c", AHEAD, lake[1]], capture_output=True,
                           timeout=600)
    assert ahead.returncode == 0, ahead.stderr

    status = run("status", *lake, "--format", "jsonl", "--live")
    assert status.returncode == 0, status.stderr
    lines = [orjson.loads(line) for line in status.stdout.splitlines()]
    tables = {line["name"]: line for line in lines if "name" in line}
    (source,) = [line for line in lines if "database" in line]
    assert source["tables"] == list(TABLES)
    frontier = tables["public.accounts"]["frontier"][0]
    assert tables["public.ledger"]["frontier"][0] > frontier
    assert source["frontier"] == [frontier] and source["frontier_lsn"] == format_lsn(frontier)
    (slot,) = source["slots"]
    assert slot["reachable"] and slot["lag_bytes"] >= 0 and slot["error"] is None

    for at in (0, frontier - 1):
        invariant(cli_rows(lake, "public.accounts", at), cli_rows(lake, "public.ledger", at),
                  at)
    beyond = run("snapshot", *lake, "--table", "public.ledger", "--as-of", str(frontier))
    err = beyond.stderr.decode()
    assert beyond.returncode == 2 and err.count("\n") == 1, err
    assert "consistent frontier of database" in err and f": {frontier} (LSN " \
        f"{format_lsn(frontier)})" in err
