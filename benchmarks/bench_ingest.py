"""Ingest throughput: Debezium JSON into a committed lake table, against a plain Parquet write.

A PostgreSQL Debezium feed (JSON lines, default replica identity, `--events` events over
`events // 6` keys): an initial snapshot of a tenth of the keys, inserts of the rest, updates
without before-images (a third of them with a TOAST-unchanged `note`), deletes (key-only
before-image, then a tombstone), and a connector restart that re-sends the last 2% of the feed.

The same lines are

* ingested with `changelake.lake.ingest.ingest` into a fresh keyed table, once on the Spark path
  (`changelake.spark.changefeed`) and, with `--old`, once on the Python path (Python UDF per key
  group, `changelake.spark.changefeed.python_path`): the benchmark points `ingest.convert_frames`
  at each;
* read with Spark's JSON reader (explicit schema) and the `after` images written as Parquet:
  what a pipeline without exactly-once, keys or deletes would do with the same lines;
* with `--again`, last, written and ingested (into a new table) once more: the plain write
  and the ingest on a JVM whose just-in-time compiler has seen both (a process that follows
  a feed, `lake follow`, runs so after its first batch);
* with `--floor`, converted the least way a keyed conversion can be (`floor_write`: one
  window by key, nothing checked), after the ingest, and the plain write timed once more
  after it, as warm: how much of the ingest's time any keyed conversion pays, and how much
  is the checks and steps that make it exact.

With `--source ydb` the feed is YDB changefeed JSON instead (`write_ydb_feed`): two partition
files of the same table (Uint64 key), UPDATES-mode records with virtual timestamps (inserts,
partial updates that leave columns unchanged, erases), a resolved record in both partitions
every thousand events, and a restart that re-sends the last 2% of each partition; the plain
write reads the `update` objects.

Printed: events per second of each, the ratio ingest/plain rate, the peak RSS of the
driver (the Python process and the JVM, from the kernel's high-water marks; the feed is
written by a child process, so the Python figure is the ingest's; and, to tell how much of
the JVM's is the heap its collector chose to keep, the sums of its memory pools' peak
committed sizes, heap and non-heap: `jvm_pools_mb`), and the Spark path's
steps (seconds and Spark jobs each, from `steps.Steps`' debug log; the lake's final job,
which runs the keyed conversion and its checks and writes the table's files, is the rest of
the ingest's time).

    python benchmarks/bench_ingest.py --events 110000 --old
    python benchmarks/bench_ingest.py --events 1100000 --floor --again
    python benchmarks/bench_ingest.py --events 110000 --source ydb
    python benchmarks/bench_ingest.py --events 11000000 --driver-memory 1g
    python benchmarks/bench_ingest.py --events 1100000 --format delta
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import random
import resource
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import orjson

PLACEHOLDER = "__debezium_unavailable_value"


def write_feed(path: Path, events: int, seed: int = 9) -> int:
    """The feed described in the module docstring; returns the number of lines written."""
    rng = random.Random(seed)
    keys = max(10, events // 6)
    source = {"version": "2.7.0.Final", "connector": "postgresql", "name": "pg", "ts_ms": 1,
              "db": "postgres", "schema": "public", "table": "items", "xmin": None}
    out = open(path, "wb")  # noqa: SIM115 - closed below; lines are streamed, not held
    written = 0
    tail: deque[bytes] = deque(maxlen=max(1, events // 50))

    def emit(line: bytes) -> None:
        nonlocal written
        out.write(line + b"\n")
        tail.append(line)
        written += 1

    live: dict[int, tuple[str, int]] = {}
    lsn = 1000
    snapshot = keys // 10
    for k in range(snapshot):
        live[k] = (f"n{k}", k % 997)
        emit(orjson.dumps({"op": "r", "before": None, "after": {
            "id": k, "name": f"n{k}", "amount": k % 997, "note": "snap"}, "source": {
            **source, "snapshot": "last" if k == snapshot - 1 else "true", "txId": 1,
            "lsn": lsn, "sequence": f'[null,"{lsn}"]'}, "ts_ms": 1}))
    commit = lsn
    next_key = snapshot
    xid = 100
    while written < events:
        xid += 1
        previous, commit = commit, commit + 800
        for i in range(rng.randint(1, 5)):
            lsn = commit - 700 + 8 * i
            src = {**source, "snapshot": "false", "txId": xid, "lsn": lsn,
                   "sequence": f'["{previous}","{lsn}"]'}
            roll = rng.random()
            if next_key < keys and (roll < 0.45 or not live):
                k, next_key = next_key, next_key + 1
                live[k] = (f"n{k}", k % 997)
                emit(orjson.dumps({"op": "c", "before": None, "after": {
                    "id": k, "name": f"n{k}", "amount": k % 997, "note": "x"}, "source": src}))
            elif roll < 0.9 or len(live) < keys // 4:
                k = rng.choice(list(live)) if len(live) < 64 else rng.randrange(next_key)
                if k not in live:
                    continue
                amount = live[k][1] + 1
                live[k] = (live[k][0], amount)
                note = PLACEHOLDER if rng.random() < 0.33 else f"u{amount}"
                emit(orjson.dumps({"op": "u", "before": None, "after": {
                    "id": k, "name": live[k][0], "amount": amount, "note": note},
                    "source": src}))
            else:
                k = rng.randrange(next_key)
                if k not in live:
                    continue
                del live[k]
                emit(orjson.dumps({"op": "d", "before": {
                    "id": k, "name": None, "amount": None, "note": None}, "after": None,
                    "source": src}))
                emit(b"null")
    replay = list(tail)
    for line in replay:
        out.write(line + b"\n")
    out.close()
    return written + len(replay)


YDB_TABLE = {"columns": [{"name": "id", "type": "Uint64"}, {"name": "name", "type": "Utf8"},
                         {"name": "amount", "type": "Int64"}, {"name": "note", "type": "Utf8"}],
             "primary_key": ["id"]}


def write_ydb_feed(paths: list[Path], events: int, seed: int = 9) -> int:
    """The YDB feed described in the module docstring, one partition per path; returns the
    number of lines written."""
    rng = random.Random(seed)
    keys = max(10, events // 6)
    outs = [open(p, "wb") for p in paths]  # noqa: SIM115 - closed below; streamed
    tails: list[deque[bytes]] = [deque(maxlen=max(1, events // 50 // len(paths)))
                                 for _ in paths]
    written = 0

    def emit(partition: int, line: bytes) -> None:
        nonlocal written
        outs[partition].write(line + b"\n")
        tails[partition].append(line)
        written += 1

    live: dict[int, int] = {}
    next_key = 0
    step, tx = 1000, 1
    n = 0
    while written < events:
        n += 1
        if n % 1000 == 0:
            step += 1
            for p in range(len(paths)):
                emit(p, orjson.dumps({"resolved": [step, 0]}))
        step += rng.randint(0, 1)
        tx += 1
        roll = rng.random()
        if next_key < keys and (roll < 0.45 or not live):
            k, next_key = next_key, next_key + 1
            live[k] = k % 997
            body = {"update": {"name": f"n{k}", "amount": live[k], "note": "x"}}
        elif roll < 0.9 and live:
            k = rng.randrange(next_key)
            if k not in live:
                continue
            live[k] += 1
            changed = {"amount": live[k]}
            if rng.random() < 0.67:
                changed["note"] = f"u{live[k]}"
            body = {"update": changed}
        else:
            k = rng.randrange(next_key)
            if k not in live:
                continue
            del live[k]
            body = {"erase": {}}
        emit(k % len(paths), orjson.dumps({**body, "key": [k], "ts": [step, tx]}))
    for p, out in enumerate(outs):
        for line in list(tails[p]):
            out.write(line + b"\n")
            written += 1
        out.close()
    return written


def in_child(write: Callable[[Any, int], int], path: Any, events: int) -> int:
    """`write(path, events)` in a process of its own, before Spark starts: the generator
    holds every live key and the replayed tail, which would otherwise be the Python
    driver's peak RSS (a high-water mark) instead of the ingest's."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        return pool.submit(write, path, events).result()


def peak_rss_mb(spark: object) -> tuple[float, float]:
    """(Python driver, JVM) peak resident set sizes in MiB."""
    python = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[attr-defined]
    jvm = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            jvm = int(line.split()[1]) / 1024
    return python, jvm


def jvm_pools_mb(spark: object) -> tuple[float, float]:
    """(heap, non-heap): the sums of the JVM's memory pools' peak committed sizes in MiB, to
    tell how much of the JVM's peak RSS is the heap the collector chose to hold (the pools
    peak at different moments, so the sums are upper bounds of any one moment's)."""
    management = spark.sparkContext._jvm.java.lang.management  # type: ignore[attr-defined]
    heap = other = 0.0
    for pool in management.ManagementFactory.getMemoryPoolMXBeans():
        committed = pool.getPeakUsage().getCommitted() / 2**20
        if str(pool.getType().name()) == "HEAP":
            heap += committed
        else:
            other += committed
    return heap, other


PLAIN_FORMAT = "parquet"
"""What the baseline writes: Parquet, or (`--format delta`) a Delta table."""


def plain_write(spark: Any, paths: list[Path], source: str, out: Path) -> None:
    """The baseline: Spark's JSON reader with an explicit schema of the image (and, for YDB,
    the key), the images written as Parquet (or a Delta table: `PLAIN_FORMAT`)."""
    if source == "ydb":
        schema = "key array<decimal(20,0)>, update struct<name:string,amount:bigint,note:string>"
        image, columns = "update", ["key[0] AS id", "update.*"]
    else:
        schema = "after struct<id:bigint,name:string,amount:bigint,note:string>, op string"
        image, columns = "after", ["after.*"]
    spark.read.schema(schema).json([str(p) for p in paths]).where(f"{image} IS NOT NULL") \
        .selectExpr(*columns).write.format(PLAIN_FORMAT).save(str(out))


def floor_write(spark: Any, paths: list[Path], source: str, out: Path) -> None:
    """The least a keyed conversion of the feed does, to tell the aim's budget from the
    checks' cost: the events parsed by Spark's JSON reader against the image's types (known
    here, so no inference pass), one window by key in position order that drops a replay
    (an event at its key's previous position), fills an unchanged column (Debezium's TOAST
    placeholder, a column a YDB update leaves out) with the key's last value (a delete does
    not restart the fill) and pairs each row with the one before it, the pairs consolidated
    by key, row and time, written as Parquet. It checks nothing, keeps no transaction,
    frontier, snapshot time or table state, and reads an event's time off its position: not
    a conversion anyone could commit, only what any conversion of this feed must at least
    do."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    names = ("name", "amount", "note")
    if source == "ydb":
        events = spark.read.schema(
            "key array<decimal(20,0)>, update struct<name:string,amount:bigint,note:string>, "
            "erase map<string,string>, ts array<bigint>").json([str(p) for p in paths]) \
            .where("key IS NOT NULL").select(
                F.col("key")[0].cast("bigint").alias("key"), F.col("ts")[0].alias("pos"),
                F.col("ts")[1].alias("sub"), F.col("erase").isNotNull().alias("is_delete"),
                *[F.col("update")[n].alias(n) for n in names])
    else:
        image = "struct<id:bigint,name:string,amount:bigint,note:string>"
        events = spark.read.schema(
            f"op string, before {image}, after {image}, source struct<lsn:bigint>"
        ).json([str(p) for p in paths]).where("op IS NOT NULL").select(
            F.coalesce("after.id", "before.id").alias("key"),
            F.col("source.lsn").alias("pos"), F.lit(0).alias("sub"),
            (F.col("op") == "d").alias("is_delete"), "after.name", "after.amount",
            F.when(F.col("after.note") != PLACEHOLDER, F.col("after.note")).alias("note"))
    order = Window.partitionBy("key").orderBy("pos", "sub", "row")
    upto = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    events = events.withColumn("row", F.monotonically_increasing_id())
    events = events.withColumn("_last", F.lag(F.struct("pos", "sub")).over(order)) \
        .where(F.col("_last").isNull() | (F.col("_last") != F.struct("pos", "sub")))
    new = F.when(~F.col("is_delete"), F.struct(
        F.col("key").alias("id"), *[F.last(n, ignorenulls=True).over(upto).alias(n)
                                    for n in names]))
    rows = events.select("key", "pos", "sub", "row", new.alias("new"))
    rows = rows.withColumn("old", F.lag("new").over(order))
    pairs = F.array(F.struct(F.col("old").alias("data"), F.lit(-1).alias("diff")),
                    F.struct(F.col("new").alias("data"), F.lit(1).alias("diff")))
    rows.select("key", F.col("pos").alias("time"), F.explode(pairs).alias("u")) \
        .where("u.data IS NOT NULL").groupBy("key", F.col("u.data").alias("data"), "time") \
        .agg(F.sum("u.diff").alias("diff")).where("diff != 0").drop("key") \
        .write.parquet(str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=110_000)
    parser.add_argument("--old", action="store_true", help="also time the Python path")
    parser.add_argument("--floor", action="store_true",
                        help="also time the least keyed conversion (`floor_write`)")
    parser.add_argument("--again", action="store_true",
                        help="then the plain write and the ingest (into a new table) once "
                             "more, on the JVM the first runs warmed up")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--source", choices=("debezium", "ydb"), default="debezium")
    parser.add_argument("--driver-memory", default=None,
                        help="the driver JVM's heap cap (spark.driver.memory; default the "
                             "session's, 2g): the peak RSS follows the cap, so a run at a "
                             "lower cap shows what the ingest needs")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    parser.add_argument("--format", choices=("hive", "delta"), default="hive",
                        help="the lake table's format; with delta the baseline is a plain "
                             "Delta write of the same rows")
    args = parser.parse_args()
    global PLAIN_FORMAT
    PLAIN_FORMAT = "delta" if args.format == "delta" else "parquet"
    conf = dict(item.split("=", 1) for item in args.conf)
    if args.driver_memory is not None:
        conf["spark.driver.memory"] = args.driver_memory

    from changelake.lake import Lake, ingest, lake_session
    from changelake.spark import changefeed
    from changelake.spark.changefeed import pipeline
    from changelake.spark.changefeed import steps as changefeed_steps

    assert changefeed is not None
    old_frames = ingest.convert_frames
    work = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    try:
        ydb = args.source == "ydb"
        table_file = work / "table.json"
        table_file.write_bytes(orjson.dumps(YDB_TABLE))
        if ydb:
            feed = [work / "partition-0.jsonl", work / "partition-1.jsonl"]
            small = [work / "small-0.jsonl", work / "small-1.jsonl"]
            events = in_child(write_ydb_feed, feed, args.events)
            write_ydb_feed(small, 600)
        else:
            feed, small = [work / "feed.jsonl"], [work / "small.jsonl"]
            events = in_child(write_feed, feed[0], args.events)
            write_feed(small[0], 600)
        options = {"source": args.source, "schema": table_file if ydb else None}
        spark = lake_session(work / "lake", args.master, conf=conf or None)
        spark.sparkContext.setLogLevel("ERROR")
        lake = Lake(spark, work / "lake", storage=args.format)
        taken: list[str] = []  # which path each ingest's conversion took

        def frames(*args: object, **kwargs: object) -> object:
            converted = pipeline.convert_frames(*args, **kwargs)  # type: ignore[arg-type]
            taken.append(converted.path if converted.reason is None
                         else f"{converted.path}: {converted.reason}")
            return converted

        ingest.convert_frames = frames  # type: ignore[assignment]
        steps: list[str] = []  # the Spark path's step lines of the measured ingest

        class Steps(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                steps.append(record.getMessage())

        logging.getLogger(changefeed_steps.__name__).addHandler(Steps())
        logging.getLogger(changefeed_steps.__name__).setLevel(logging.DEBUG)
        ingest.ingest(lake, "bench.warm", small, key=["id"], **options)  # type: ignore[arg-type]
        plain_write(spark, small, args.source, work / "warm.parquet")

        start = time.perf_counter()
        plain_write(spark, feed, args.source, work / "plain.parquet")
        plain = time.perf_counter() - start
        steps.clear()
        start = time.perf_counter()
        report = ingest.ingest(lake, "bench.items", feed, key=["id"],
                             **options)  # type: ignore[arg-type]
        ours = time.perf_counter() - start
        ours_steps = list(steps)
        floor = None
        if args.floor:  # after the ingest, which it would otherwise warm up
            floor_write(spark, small, args.source, work / "warm-floor.parquet")
            start = time.perf_counter()
            floor_write(spark, feed, args.source, work / "floor.parquet")
            floor = time.perf_counter() - start
            start = time.perf_counter()  # and the plain write again, as warm as the floor
            plain_write(spark, feed, args.source, work / "plain-warm.parquet")
            plain_warm = time.perf_counter() - start
        rows = [(f"plain {PLAIN_FORMAT} write", plain, "")]
        if floor is not None:
            floor_rows = spark.read.parquet(str(work / "floor.parquet")).count()
            rows.append(("floor (least keyed conversion)", floor,
                         f"{floor_rows:,} updates, nothing checked; after the ingest, on a "
                         f"warm JVM: {plain_warm / floor:.2f}x the plain write run again "
                         f"after it ({plain_warm:.2f} s)"))
        rows += [
                (f"ingest, Spark path ({taken[-1]})", ours,
                 f"{report.commit.written:,} updates, frontier {report.frontier}")]
        if args.old:
            ingest.convert_frames = lambda *a, **k: frames(*a, python_path=True, **k)  # type: ignore[assignment]
            start = time.perf_counter()
            old = ingest.ingest(lake, "bench.old", feed, key=["id"],
                              **options)  # type: ignore[arg-type]
            took = time.perf_counter() - start
            rows.append((f"ingest, Python path ({taken[-1].split(':')[0]})", took,
                         f"{old.commit.written:,} updates, frontier {old.frontier}"))
        python, jvm = peak_rss_mb(spark)
        size = sum(p.stat().st_size for p in feed)
        print(f"{events:,} {'YDB' if ydb else 'Debezium'} lines over "
              f"{max(10, args.events // 6):,} keys, {size / 2**20:.0f} MiB, "
              f"master {args.master}")
        for name, took, note in rows:
            print(f"{name:34} {took:8.2f} s {events / took / 1000:8.1f} k events/s "
                  f"{plain / took:6.2f}x plain  {note}")
        heap, other = jvm_pools_mb(spark)
        print(f"peak driver RSS: Python {python:,.0f} MiB, JVM {jvm:,.0f} MiB "
              f"(heap cap {spark.conf.get('spark.driver.memory')}; the JVM's pools' peaks "
              f"committed: heap {heap:,.0f} MiB, non-heap {other:,.0f} MiB)")
        if args.conf:
            print(f"settings: {' '.join(args.conf)}")
        for line in ours_steps:
            print(f"  Spark path {line}")
        if args.again:  # after the peak RSS figures, which the runs below would raise
            start = time.perf_counter()
            plain_write(spark, feed, args.source, work / "plain-again.parquet")
            plain_again = time.perf_counter() - start
            steps.clear()
            start = time.perf_counter()
            ingest.ingest(lake, "bench.again", feed, key=["id"],
                            **options)  # type: ignore[arg-type]
            again = time.perf_counter() - start
            print(f"again, on the warm JVM: plain {plain_again:.2f} s, ingest {again:.2f} s "
                  f"({taken[-1]}), {plain_again / again:.2f}x plain")
            for line in steps:
                print(f"  Spark path {line}")
        spark.stop()
    finally:
        ingest.convert_frames = old_frames
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
