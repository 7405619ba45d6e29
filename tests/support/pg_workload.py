"""A seeded PostgreSQL workload, and the harness that kills `changelake capture postgres` with
SIGKILL while it runs and then checks that what the capture holds equals the database.

The workload covers what a capture must get right after a crash: a primary-keyed table of
transfers, a table of large TOASTed documents updated in another column (pgoutput sends those
values as unchanged, `u`) and re-keyed, a table with `REPLICA IDENTITY FULL` and no key,
inserts and deletes of rows of many types (NULLs, jsonb, timestamptz, bytea, arrays), a
truncate of two tables at once, and transactions large enough to be streamed before they
commit (past `logical_decoding_work_mem`, 64kB in the test server): committed, rolled back
whole, and with a rolled-back savepoint.

The harness (`kill_and_check`) takes the capture's destination as a `Destination`: the
arguments that choose it (`--lake DIR ...`, `--out DIR`) and how to finish a capture and read
what it holds. Everything random comes from the seed: the workload, when to kill, how often.
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from random import Random
from typing import Any

import psycopg2
import psycopg2.extras

from changelake.capture.postgres.rows import Table
from changelake.capture.postgres.source import connect
from changelake.capture.postgres.types import catalog
from changelake.demo.postgres import confirmed_lsn, kill_group

CLI = [str(Path(sys.executable).parent / "changelake"), "capture", "postgres"]
PUBLICATION = "kill"
WORKLOAD_NAME = "changelake-workload"  # the workload's application_name
TABLES = ("public.accounts", "public.docs", "public.events", "public.marks")
ACCOUNTS = 12

SETUP = [
    "CREATE TABLE accounts (id int PRIMARY KEY, balance numeric(12,2) NOT NULL, note text)",
    "CREATE TABLE docs (id int PRIMARY KEY, version int NOT NULL, title varchar(40), body text)",
    # Out of line and uncompressed: every body is a TOAST value an update can leave unchanged.
    "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL",
    "CREATE TABLE events (id bigint PRIMARY KEY, kind text, payload jsonb, at timestamptz, "
    "data bytea, tags int[], ok boolean)",
    "CREATE TABLE marks (tag text NOT NULL, score double precision, n int)",
    "ALTER TABLE marks REPLICA IDENTITY FULL",
    f"CREATE PUBLICATION {PUBLICATION} FOR TABLE accounts, docs, events, marks",
]


def body(rng: Random) -> str:
    """A document body well past the TOAST threshold (~2kB)."""
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=rng.randrange(3000, 6000)))


@dataclass(eq=False)  # a thread: hashed by identity
class Workload(threading.Thread):
    """`steps` transactions chosen by `seed`, pausing `pause` seconds between them. Keeps what
    exists in Python so that each statement touches rows that are there."""

    dsn: str
    seed: int
    steps: int = 200
    pause: float = 0.03
    done: int = 0
    error: BaseException | None = None
    docs: set[int] = field(default_factory=set)
    events: set[int] = field(default_factory=set)
    marks: set[str] = field(default_factory=set)
    next_id: int = 1

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, daemon=True)
        self.rng = Random(self.seed)

    def setup(self) -> None:
        """The tables and rows the initial snapshot reads."""
        conn = psycopg2.connect(self.dsn)
        with conn.cursor() as c:
            for sql in SETUP:
                c.execute(sql)
            c.execute(f"INSERT INTO accounts SELECT g, 100, CASE WHEN g % 3 = 0 THEN NULL "
                      f"ELSE 'open' END FROM generate_series(1, {ACCOUNTS}) g")
            for _ in range(8):
                self._doc_insert(c)
            self._events(c, 30)
            for _ in range(6):
                self._mark_insert(c)
        conn.commit()
        conn.close()

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    # -- one transaction's statements (the caller commits) --------------------------------------

    def _transfer(self, c: Any) -> None:
        a, b = self.rng.sample(range(1, ACCOUNTS + 1), 2)
        amount = Decimal(self.rng.randrange(1, 5000)) / 100
        c.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, a))
        c.execute("UPDATE accounts SET balance = balance + %s, note = %s WHERE id = %s",
                  (amount, self.rng.choice([None, "in", "moved"]), b))

    def _doc_insert(self, c: Any) -> None:
        doc = self._id()
        c.execute("INSERT INTO docs VALUES (%s, 1, %s, %s)", (doc, f"doc {doc}", body(self.rng)))
        self.docs.add(doc)

    def _doc_change(self, c: Any) -> None:
        if not self.docs:
            return self._doc_insert(c)
        doc = self.rng.choice(sorted(self.docs))
        what = self.rng.random()
        if what < 0.5:  # the body is not touched: pgoutput sends it as unchanged TOAST
            c.execute("UPDATE docs SET version = version + 1, title = %s WHERE id = %s",
                      (f"v {self.rng.randrange(1000)}", doc))
        elif what < 0.65:  # a new key, the body still unchanged
            new = self._id()
            c.execute("UPDATE docs SET id = %s, version = version + 1 WHERE id = %s", (new, doc))
            self.docs.discard(doc)
            self.docs.add(new)
        elif what < 0.85:
            c.execute("UPDATE docs SET body = %s, version = version + 1 WHERE id = %s",
                      (body(self.rng), doc))
        else:
            c.execute("DELETE FROM docs WHERE id = %s", (doc,))
            self.docs.discard(doc)
        return None

    def _events(self, c: Any, count: int, width: int = 20) -> list[int]:
        ids = [self._id() for _ in range(count)]
        rows = []
        for i in ids:
            payload = None if self.rng.random() < 0.1 else \
                f'{{"n": {i}, "s": "{"x" * self.rng.randrange(width)}"}}'
            rows.append((i, self.rng.choice(["a", "b", None]), payload,
                         f"2024-0{self.rng.randrange(1, 10)}-1{self.rng.randrange(10)} "
                         f"12:{self.rng.randrange(10, 60)}:00.{self.rng.randrange(10**6):06d}+02",
                         bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(8))),
                         [self.rng.randrange(-5, 5) for _ in range(self.rng.randrange(3))],
                         self.rng.choice([True, False, None])))
        psycopg2.extras.execute_values(c, "INSERT INTO events VALUES %s", rows, page_size=500)
        return ids

    def _event_change(self, c: Any) -> None:
        if self.events and self.rng.random() < 0.4:
            gone = self.rng.sample(sorted(self.events), min(len(self.events), 3))
            c.execute("DELETE FROM events WHERE id = ANY(%s)", (gone,))
            self.events.difference_update(gone)
        elif self.events and self.rng.random() < 0.5:
            event = self.rng.choice(sorted(self.events))
            c.execute("UPDATE events SET kind = 'changed', tags = tags || 9 WHERE id = %s",
                      (event,))
        else:
            self.events.update(self._events(c, self.rng.randrange(1, 6)))

    def _mark_insert(self, c: Any) -> None:
        tag = f"m{self._id()}"
        score = self.rng.choice([1.5, -0.25, math.inf, 1e-300, self.rng.random()])
        c.execute("INSERT INTO marks VALUES (%s, %s, %s)", (tag, score, self.rng.randrange(9)))
        self.marks.add(tag)

    def _mark_change(self, c: Any) -> None:
        if not self.marks or self.rng.random() < 0.3:
            return self._mark_insert(c)
        tag = self.rng.choice(sorted(self.marks))
        if self.rng.random() < 0.7:
            c.execute("UPDATE marks SET score = %s, n = n + 1 WHERE tag = %s",
                      (self.rng.random(), tag))
        else:
            c.execute("DELETE FROM marks WHERE tag = %s", (tag,))
            self.marks.discard(tag)
        return None

    def _big(self, c: Any, conn: Any) -> None:
        """Past 64kB of changes: the server streams it before it commits. Committed, rolled
        back whole, or with a rolled-back savepoint in the middle."""
        how = self.rng.choice(["commit", "commit", "rollback", "savepoint"])
        first = self._events(c, 700, width=150)
        if how == "savepoint":
            c.execute("SAVEPOINT s")
            self._events(c, 700, width=150)
            c.execute("UPDATE docs SET version = version + 100")
            c.execute("ROLLBACK TO SAVEPOINT s")
            c.execute("UPDATE events SET ok = NOT ok WHERE id = ANY(%s)", (first[:200],))
        if how == "rollback":
            conn.rollback()
            return
        conn.commit()
        self.events.update(first)

    def _truncate(self, c: Any) -> None:
        c.execute("TRUNCATE events, marks")
        self.events.clear()
        self.marks.clear()

    def run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn, application_name=WORKLOAD_NAME)
            big_at = set(self.rng.sample(range(self.steps), 3))
            truncate_at = self.rng.randrange(self.steps // 4, self.steps)
            with conn.cursor() as c:
                for step in range(self.steps):
                    if step in big_at:
                        self._big(c, conn)
                    elif step == truncate_at:
                        self._truncate(c)
                    else:
                        self.rng.choice([self._transfer, self._transfer, self._doc_change,
                                         self._doc_change, self._event_change,
                                         self._mark_change])(c)
                    conn.commit()
                    self.done += 1
                    time.sleep(self.pause)
            conn.close()
        except BaseException as e:  # the test reports it
            self.error = e


# -- the database and the capture, compared -----------------------------------------------------

class _Nan:
    """NaN as a value that equals itself (pickled too), so rows holding it compare and count."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Nan)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "NaN"


NAN_KEY = _Nan()


def canonical(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(NAN_KEY if isinstance(v, float) and v != v else
                 canonical(v) if isinstance(v, tuple) else v for v in row)


def database_rows(dsn: str, tables: tuple[str, ...] = TABLES) -> dict[str, Counter]:
    """Each table's rows as the capture types them (the text of a value, read by its
    `PgType`, as the snapshot reads it)."""
    conn = connect(dsn)
    out: dict[str, Counter] = {}
    with conn.cursor() as c:
        lookup = catalog(c)
        for name in tables:
            table = Table.from_catalog(c, name, lookup)
            schema, bare = name.split(".")
            # The output function's text (as pgoutput sends it): `true::text` is 'true'.
            columns = ", ".join(f'CASE WHEN "{col}" IS NULL THEN NULL ELSE concat("{col}") END'
                                for col in table.columns)
            c.execute(f'SELECT {columns} FROM "{schema}"."{bare}"')
            out[name] = Counter(canonical(tuple(None if v is None else kind.read(v)
                                                for v, kind in zip(r, table.types, strict=True)))
                                for r in c.fetchall())
    conn.close()
    return out


def lake_rows(lake: Any, tables: tuple[str, ...] = TABLES) -> dict[str, Counter]:
    """Each lake table's current rows, typed as the capture types values from PostgreSQL."""
    from changelake.capture.postgres.to_lake import _from_spark

    out = {}
    for name in tables:
        frame = lake.table(name).current()
        kinds = [f.dataType for f in frame.schema.fields]
        out[name] = Counter(canonical(tuple(_from_spark(k, v) for k, v in
                                            zip(kinds, row, strict=True)))
                            for row in frame.collect())
    return out


def drop_slot(dsn: str, slot: str) -> None:
    """Drop a slot once its walsender has gone (it exits a moment after its client)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        for _ in range(200):
            c.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            if not c.fetchone()[0]:
                break
            time.sleep(0.05)
        c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    conn.close()


def slot_position(dsn: str, slot: str) -> int | None:
    """The slot's confirmed flush position, None if there is no such slot."""
    return confirmed_lsn(dsn, slot)


@dataclass(frozen=True)
class Captured:
    """What a destination holds after a capture: each table's rows (typed as the capture
    types them) and the frontier through which every table is complete."""

    rows: dict[str, Counter]
    frontier: int


@dataclass(frozen=True)
class Destination:
    """Where the capture writes: `args` choose it on the command line; `finish(argv)` runs the
    capture with `argv` (the whole command line, `--until-idle` included) to its end and
    returns what the destination then holds."""

    args: tuple[str, ...]
    finish: Callable[[list[str]], Captured]


# -- the harness ------------------------------------------------------------------------------

def capture_command(dsn: str, destination: Destination, slot: str,
                    until_idle: float) -> list[str]:
    """The command line every run uses, the first as the restarts (a supervisor repeats it):
    `--create-slot` makes the slot when it is missing, and takes the snapshot again after a
    start that did not finish."""
    return [*CLI, *destination.args, "--dsn", dsn, "--publication", PUBLICATION,
            "--slot", slot, "--create-slot", "--until-idle", f"{until_idle:g}"]


def capture_connected(dsn: str) -> bool:
    """Whether a session other than ours and the workload's is in the database: the capture,
    past its start-up, reading the catalog, its snapshot or its slot."""
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND pid <> pg_backend_pid() AND application_name <> %s", (WORKLOAD_NAME,))
        row = c.fetchone()
    conn.close()
    return bool(row and row[0])


def _wait(condition: Callable[[], bool], proc: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not condition() and proc.poll() is None:
        if time.monotonic() > end:
            raise TimeoutError(f"no kill point within {timeout} s")
        time.sleep(0.05)


def run_and_kill(command: list[str], dsn: str, slot: str, moment: str, delay: float,
                 log: Path, *, when: Callable[[], bool] | None = None,
                 connected: Callable[[], None] | None = None) -> str:
    """Start the capture and SIGKILL it `delay` s after: it connected to the database
    (`start`: reading the catalog, the lake, its snapshot, or resuming), the slot exists
    (`snapshot`: its initial snapshot is being taken, or was just), the slot's confirmed
    position moved (`stream`: a batch was committed), or `when` holds. `connected` is called
    once the capture is connected. Returns what happened."""
    before = slot_position(dsn, slot)
    with open(log, "ab") as err:
        err.write(f"\n$ {moment} +{delay:.2f}s\n".encode())
        err.flush()
        started = time.monotonic()
        # Its own process group: the kill takes the capture whole, its Spark JVM included, as
        # a machine's or a container's end would (a JVM left running holds the lake's embedded
        # metastore, and the restart could not open it).
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
        try:
            _wait(lambda: capture_connected(dsn), proc, 300)
            if connected is not None:
                connected()
            if when is not None:
                _wait(when, proc, 300)
            elif moment == "snapshot":
                _wait(lambda: slot_position(dsn, slot) is not None, proc, 300)
            elif moment == "stream":
                _wait(lambda: slot_position(dsn, slot) not in (None, before), proc, 300)
            time.sleep(delay)
            if proc.poll() is None:
                kill_group(proc)
                return (f"killed at {moment} +{delay:.2f}s, "
                        f"{time.monotonic() - started:.1f}s after start")
        finally:
            kill_group(proc)
    if proc.returncode != 0:
        raise AssertionError(f"capture failed ({proc.returncode}): {log.read_text()[-3000:]}")
    return f"ended before the kill at {moment} +{delay:.2f}s"


def kill_and_check(dsn: str, seed: int, destination: Destination, workdir: Path, *,
                   steps: int = 150, kills: list[tuple[str, float]] | None = None,
                   when: Callable[[], bool] | None = None,
                   killed: Callable[[], None] | None = None) -> list[str]:
    """Start the capture, start the seeded workload once it is connected, SIGKILL the capture
    and restart it (`kills`: each run's kill point and delay, by default one or two drawn from
    the seed), then after the workload run the capture to idle and check that it holds what
    the database holds, and that the slot is not confirmed past the destination's frontier.
    `when` replaces the first kill point; `killed` looks at what the kills left. Returns what
    happened, one line per run."""
    rng = Random(seed)
    print(f"kill seed: {seed}")
    slot = f"kill_{seed}"
    workload = Workload(dsn, seed, steps=steps)
    workload.setup()
    log = workdir / "capture.log"
    command = capture_command(dsn, destination, slot, until_idle=120)
    if kills is None:
        moments = [rng.choice(["start", "snapshot", "stream", "stream"])]
        moments += [rng.choice(["start", "stream"]) for _ in range(rng.choice([0, 0, 0, 1]))]
        kills = [(m, rng.uniform(0, 3 if m == "start" else 2)) for m in moments]
    happened = []
    try:
        for i, (moment, delay) in enumerate(kills):
            happened.append(run_and_kill(
                command, dsn, slot, moment, delay, log, when=when if i == 0 else None,
                connected=workload.start if i == 0 else None))
    finally:
        if workload.ident is None:
            workload.start()
        workload.join()
    assert workload.error is None, workload.error
    if killed is not None:
        killed()
    started = time.monotonic()
    captured = destination.finish(capture_command(dsn, destination, slot, until_idle=3))
    happened.append(f"finished in {time.monotonic() - started:.1f}s "
                    f"({workload.done} transactions)")
    expected = database_rows(dsn)
    for name in TABLES:
        got = captured.rows.get(name)
        assert got == expected[name], (name, happened,
                                       f"missing {expected[name] - (got or Counter())}",
                                       f"extra {(got or Counter()) - expected[name]}")
    confirmed = slot_position(dsn, slot)
    assert confirmed is not None and confirmed <= captured.frontier, (confirmed,
                                                                      captured.frontier)
    print("\n".join(happened))
    return happened


# -- the lake as a destination ------------------------------------------------------------------

WORKER = Path(__file__).resolve().parent / "pg_lake_worker.py"


def lake_destination(lake: Path | str, master: str = "local[1]", *,
                     dump: Path | None = None) -> Destination:
    """`--lake DIR` (or a lake URI: `s3a://...`, its store's settings in the environment):
    finished by `pg_lake_worker.py`, which runs the same CLI command in its process and then
    reads the tables through the lake's own metastore (one Spark start-up for both), into
    `dump` (default: beside a local lake)."""
    import pickle

    def finish(argv: list[str]) -> Captured:
        out = dump if dump is not None else Path(lake).parent / f"{Path(lake).name}.dump"
        done = subprocess.run([sys.executable, str(WORKER), str(out), "--", *argv[1:]],
                              capture_output=True, timeout=900)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        tables, frontier = pickle.loads(out.read_bytes())
        return Captured(tables, frontier)

    return Destination(("--lake", str(lake), "--master", master), finish)


# -- Materialize CDC logs as a destination -------------------------------------------------------

def out_destination(out: Path, dsn: str) -> Destination:
    """`--out DIR`: finished by the command line itself (no Spark), then each table's log is
    decoded with the pure-Python reader the capture resumes from (its rows typed as the
    stream types them) and the frontier is the least of the logs'."""
    from changelake.capture.postgres.capture import CaptureOptions
    from changelake.capture.postgres.to_log import LogSink

    def finish(argv: list[str]) -> Captured:
        done = subprocess.run(argv, capture_output=True, timeout=600)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        conn = connect(dsn)
        with conn.cursor() as c:
            lookup = catalog(c)
            tables = {name: Table.from_catalog(c, name, lookup) for name in TABLES}
        conn.close()
        sink = LogSink(out, CaptureOptions(dsn, PUBLICATION, "unused"))
        rows, uppers = {}, []
        for name, table in tables.items():
            upper, current = sink.read_log(table)
            assert upper is not None, name
            uppers.append(upper)
            rows[name] = Counter(canonical(r) for r in current.values())
        return Captured(rows, min(uppers))

    return Destination(("--out", str(out)), finish)
