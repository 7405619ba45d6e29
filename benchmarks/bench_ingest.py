"""Ingest throughput: Debezium JSON into a committed lake table, against a plain Parquet write.

The same PostgreSQL-style Debezium change events (JSON lines, with before and after images:
`--rows` inserts, then updates of a tenth of them) are

* ingested with `changelake.lake.jobs.ingest` (parse and convert on Spark, consolidate, commit
  a segment exactly once, replace the view), into a fresh keyed table; and
* read with Spark's JSON reader (explicit schema) and the `after` images written as Parquet:
  what a pipeline without exactly-once or deletes would do with the same lines.

Printed: rows (events) per second for both, and the ratio.

    python benchmarks/bench_ingest.py              # 200k events
    python benchmarks/bench_ingest.py --scale 0.1  # a quick run
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path


def event(op: str, before: dict | None, after: dict | None, lsn: int, tx: int) -> str:
    source = {"version": "2.7", "connector": "postgresql", "name": "pg", "ts_ms": 1,
              "snapshot": False, "db": "postgres", "schema": "public", "table": "items",
              "txId": tx, "lsn": lsn, "xmin": None}
    return json.dumps({"before": before, "after": after, "source": source, "op": op,
                       "ts_ms": 1})


def write_feed(path: Path, rows: int) -> int:
    lsn = 0
    n = 0
    with open(path, "w") as fh:
        for i in range(rows):
            lsn += 8
            fh.write(event("c", None, {"id": i, "name": f"n{i}", "amount": i % 997}, lsn, lsn)
                     + "\n")
            n += 1
        for i in range(0, rows, 10):
            lsn += 8
            old = {"id": i, "name": f"n{i}", "amount": i % 997}
            new = {**old, "amount": old["amount"] + 1}
            fh.write(event("u", old, new, lsn, lsn) + "\n")
            n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    rows = max(100, int(args.rows * args.scale))

    from changelake.lake import Lake, jobs, lake_session
    from changelake.protocol import Antichain

    work = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    try:
        feed = work / "feed.jsonl"
        events = write_feed(feed, rows)
        spark = lake_session(work / "lake", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        lake = Lake(spark, work / "lake")
        # warm up both paths on a small feed (JIT, Python workers)
        small = work / "small.jsonl"
        write_feed(small, 200)
        jobs.ingest(lake, "bench.warm", [small], key=["id"], source="debezium")
        schema = ("after struct<id:bigint,name:string,amount:bigint>, op string")
        spark.read.schema(schema).json(str(small)).where("after IS NOT NULL").select(
            "after.*").write.parquet(str(work / "warm.parquet"))

        start = time.perf_counter()
        report = jobs.ingest(lake, "bench.items", [feed], key=["id"], source="debezium")
        ours = time.perf_counter() - start
        start = time.perf_counter()
        spark.read.schema(schema).json(str(feed)).where("after IS NOT NULL").select(
            "after.*").write.parquet(str(work / "plain.parquet"))
        plain = time.perf_counter() - start
        # the same ingest in its two halves: conversion (changefeed -> updates, cached), and
        # the lake commit of those updates into a fresh table
        start = time.perf_counter()
        changes, frontier = jobs.changefeed_frames(spark, [feed], "debezium", ["id"], None)
        updates = jobs.flatten(changes).cache()
        updates.count()
        convert = time.perf_counter() - start
        data = updates.drop("_time", "_diff").schema
        table = lake.create_table("bench.items2", data, key=["id"])
        start = time.perf_counter()
        table.commit(updates, Antichain([0]), Antichain([frontier]))
        commit = time.perf_counter() - start
        print(f"{events:,} Debezium events ({rows:,} inserts, {events - rows:,} updates), "
              f"master {args.master}")
        print(f"plain Parquet write:     {plain:7.2f} s  {events / plain / 1000:8.1f} k events/s")
        print(f"lake ingest (committed): {ours:7.2f} s  {events / ours / 1000:8.1f} k events/s"
              f"  ({report.commit.written:,} updates committed, frontier {report.frontier})")
        print(f"  of which conversion:   {convert:7.2f} s  (changefeed -> updates, cached)")
        print(f"  of which lake commit:  {commit:7.2f} s  (write segment, stats, commit view)")
        print(f"ratio lake/plain rate: {plain / ours:.2f}; "
              f"commit alone vs plain write: {plain / commit:.2f}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
