"""The lake commit's write of a changefeed batch's updates: as many files as the keyed
conversion's partitions, against fewer (`conversion.files_for`), in one run.

A Debezium batch (`bench_ingest.py`'s feed, `--events` events) is ingested once with the
coalescing turned off, so that its updates land as the conversion's partitions left them.
Those updates are then held in memory (cached, so neither the reading nor the conversion is
timed) and written as Parquet in `--rounds` rounds, each round writing them as the
conversion's partition count of files and as each count of `--files`, in turn (the first
round not counted: the JIT's warm-up). Printed: each count's median seconds, the files'
bytes, and the ratio to the conversion's partition count.

What it isolates: the write a task does per file (Parquet's per-file column dictionaries,
which a column of distinct values fills and then drops, and the file's own costs), not the
conversion, which coalescing leaves as it is (each task converts its partitions one after
another). The whole ingest's figure is `bench_ingest.py`'s.

    python benchmarks/bench_commit_files.py --events 1100000 --files 4,2
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import write_feed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_100_000)
    parser.add_argument("--files", default="4,2", help="file counts to write, besides the "
                                                       "conversion's partitions")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    from changelake.lake import Lake, commands, lake_session
    from changelake.spark.changefeed import conversion

    work = Path(tempfile.mkdtemp(prefix="bench-commit-files-"))
    try:
        feed = work / "feed.jsonl"
        write_feed(feed, args.events)
        spark = lake_session(work / "lake", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        lake = Lake(spark, work / "lake")
        coalesce = conversion.files_for
        conversion.files_for = lambda spark, events, partitions: partitions  # type: ignore
        try:
            commands.ingest(lake, "bench.items", [feed], key=["id"], source="debezium")
        finally:
            conversion.files_for = coalesce
        table = lake.table("bench.items")
        paths = [table.directory / f.path for f in table.state().files if f.rows]
        partitions = sum(len(list(p.rglob("*.parquet"))) for p in paths)
        updates = spark.read.parquet(*map(str, paths)).repartition(partitions).cache()
        rows = updates.count()
        counts = [partitions, *(int(n) for n in args.files.split(","))]
        print(f"{args.events:,} Debezium events: {rows:,} updates, written by the conversion "
              f"as {partitions} files; master {args.master}, {args.rounds} rounds "
              f"(the first not counted)", flush=True)
        seconds: dict[int, list[float]] = {n: [] for n in counts}
        sizes: dict[int, int] = {}
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                out = work / f"out-{n}-{r}"
                start = time.perf_counter()
                updates.coalesce(n).write.parquet(str(out))
                seconds[n].append(time.perf_counter() - start)
                sizes[n] = sum(f.stat().st_size for f in out.glob("*.parquet"))
                shutil.rmtree(out)
        base = statistics.median(seconds[partitions][1:])
        for n in counts:
            median = statistics.median(seconds[n][1:])
            print(f"  {n:3} files  {median:6.2f} s  {sizes[n] / 2**20:7.1f} MiB  "
                  f"{median / base:5.2f}x the conversion's {partitions}  "
                  f"(rounds: {', '.join(f'{x:.2f}' for x in seconds[n][1:])})")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
