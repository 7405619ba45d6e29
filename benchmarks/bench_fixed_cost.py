"""The fixed cost of converting a small changefeed batch: what each micro-batch of `lake follow`
pays whatever its size, with the steps' column expressions built once per JVM
(`spark.expressions.per_jvm`) and built anew for every batch (`expressions.forget` first).

Two small batches (`--events`, 2,000 by default), each converted `--rounds` times in each way,
alternating, on one warm session:

* `debezium`: `bench_ingest.py`'s Debezium feed, which Java reads whole (`convert_frames`);
* `ydb`: `bench_ingest.py`'s YDB feed, two partitions (`convert_frames`).

Baseline, in the same run: `spark.read.text` of the same files, counted. Printed per batch:
the median seconds of each way, and both as multiples of the baseline.

    python benchmarks/bench_fixed_cost.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import YDB_TABLE, write_feed, write_ydb_feed


def _timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from changelake.spark import expressions
    from changelake.spark.changefeed.pipeline import convert_frames
    from changelake.spark.session import build_session

    work = Path(tempfile.mkdtemp(prefix="bench-fixed-"))
    spark = build_session("local[2]", warehouse_dir=work / "warehouse")
    debezium = [work / "feed.jsonl"]
    write_feed(debezium[0], args.events)
    ydb = [work / "partition-0.jsonl", work / "partition-1.jsonl"]
    write_ydb_feed(ydb, args.events)
    table = work / "table.json"
    table.write_bytes(orjson.dumps(YDB_TABLE))

    def convert(paths: list[Path], source: str, schema: Path | None) -> Callable[[], Any]:
        return lambda: convert_frames(spark, paths, source, ["id"], schema).changes.count()

    batches = {"debezium": (debezium, convert(debezium, "debezium", None)),
               "ydb": (ydb, convert(ydb, "ydb", table))}
    for name, (paths, action) in batches.items():
        def baseline(paths: list[Path] = paths) -> int:
            return spark.read.text([str(p) for p in paths]).count()

        for _ in range(2):  # warm-up: the JIT, and the expressions built once
            action()
            baseline()
        times: dict[str, list[float]] = {"once per JVM": [], "per batch": [], "read": []}
        for _ in range(args.rounds):
            times["once per JVM"].append(_timed(action))
            expressions.forget()
            times["per batch"].append(_timed(action))
            times["read"].append(_timed(baseline))
        read = statistics.median(times["read"])
        print(f"{name} ({args.events} events, median of {args.rounds}; read.text().count() "
              f"{read:.2f} s)")
        for way in ("once per JVM", "per batch"):
            seconds = statistics.median(times[way])
            print(f"  expressions built {way:13s} {seconds:6.2f} s  {seconds / read:5.1f}x read")
    spark.stop()


if __name__ == "__main__":
    main()
