"""The lake commit's write of a changefeed batch's updates: as many files as the keyed
conversion's partitions, against fewer (`conversion.files_for`), and with Parquet's default
dictionary size against the commit's (`table.SEGMENT_DICTIONARY_BYTES`), in one run.

A Debezium batch (`bench_ingest.py`'s feed, `--events` events; `--source ydb`, the YDB feed)
is ingested once with the coalescing turned off, so that its updates land as the conversion's
partitions left them. Those updates are then held in memory (cached, so neither the reading
nor the conversion is timed) and written as Parquet in `--rounds` rounds, each round writing
them in each way in turn (the first round not counted: the JIT's warm-up): as the
conversion's partition count of files and as each count of `--files`, with Parquet's default
dictionary size, and as each count of `--files` with the commit's. Printed: each way's median
seconds, the files' bytes, and the ratio to the conversion's partition count with the default.

What it isolates: the write a task does per file (Parquet's per-file column dictionaries,
which a column of many distinct values, sorted by key, fills up to the dictionary size before
Parquet drops it, and the file's own costs), not the
conversion, which coalescing leaves as it is (each task converts its partitions one after
another). The whole ingest's figure is `bench_ingest.py`'s.

    python benchmarks/bench_commit_files.py --events 1100000 --files 4,2
    python benchmarks/bench_commit_files.py --events 1100000 --files 4 --source ydb
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import YDB_TABLE, write_feed, write_ydb_feed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_100_000)
    parser.add_argument("--files", default="4,2", help="file counts to write, besides the "
                                                       "conversion's partitions")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--source", choices=("debezium", "ydb"), default="debezium")
    args = parser.parse_args()

    from changelake.lake import Lake, ingest, lake_session
    from changelake.lake.table import SEGMENT_DICTIONARY_BYTES
    from changelake.spark.changefeed import conversion

    work = Path(tempfile.mkdtemp(prefix="bench-commit-files-"))
    try:
        if args.source == "ydb":
            feed = [work / "partition-0.jsonl", work / "partition-1.jsonl"]
            write_ydb_feed(feed, args.events)
            (work / "table.json").write_bytes(orjson.dumps(YDB_TABLE))
            options: dict[str, object] = {"source": "ydb", "schema": work / "table.json"}
        else:
            feed = [work / "feed.jsonl"]
            write_feed(feed[0], args.events)
            options = {"source": "debezium"}
        spark = lake_session(work / "lake", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        lake = Lake(spark, work / "lake")
        coalesce = conversion.files_for
        conversion.files_for = lambda spark, events, partitions: partitions  # type: ignore
        try:
            ingest.ingest(lake, "bench.items", feed, key=["id"], **options)  # type: ignore[arg-type]
        finally:
            conversion.files_for = coalesce
        table = lake.table("bench.items")
        paths = [table.directory / f.path for f in table.state().files if f.rows]
        partitions = sum(len(list(p.rglob("*.parquet"))) for p in paths)
        updates = spark.read.parquet(*map(str, paths)).repartition(partitions).cache()
        rows = updates.count()
        files = [int(n) for n in args.files.split(",")]
        commit = {"parquet.dictionary.page.size": str(SEGMENT_DICTIONARY_BYTES)}
        ways: dict[str, tuple[int, dict[str, str]]] = {
            f"{n:3} files, dictionary 1 MiB": (n, {}) for n in [partitions, *files]}
        ways.update({f"{n:3} files, dictionary {SEGMENT_DICTIONARY_BYTES // 1024} KiB":
                     (n, commit) for n in files})
        print(f"{args.events:,} {args.source} events: {rows:,} updates, written by the "
              f"conversion as {partitions} files; master {args.master}, {args.rounds} rounds "
              f"(the first not counted)", flush=True)
        seconds: dict[str, list[float]] = {way: [] for way in ways}
        sizes: dict[str, int] = {}
        for r in range(args.rounds):
            for way in ways if r % 2 == 0 else list(ways)[::-1]:
                n, settings = ways[way]
                out = work / f"out-{r}"
                writer = updates.coalesce(n).write
                for key, value in settings.items():
                    writer = writer.option(key, value)
                start = time.perf_counter()
                writer.parquet(str(out))
                seconds[way].append(time.perf_counter() - start)
                sizes[way] = sum(f.stat().st_size for f in out.glob("*.parquet"))
                shutil.rmtree(out)
        base = statistics.median(seconds[next(iter(ways))][1:])
        for way in ways:
            median = statistics.median(seconds[way][1:])
            print(f"  {way:31}  {median:6.2f} s  {sizes[way] / 2**20:7.1f} MiB  "
                  f"{median / base:5.2f}x the conversion's {partitions}  "
                  f"(rounds: {', '.join(f'{x:.2f}' for x in seconds[way][1:])})")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
