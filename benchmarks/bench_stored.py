"""A batch's checkpoint (`checkpoint.stored`): the project's chunks of row bytes against Spark's
`localCheckpoint`, measured in one process.

The rows look like a parsed changefeed's (`--rows` of them, default 5M: a file index, a
block, a line number, a kind, a time, a position array, an op, a key and an image struct of
four columns, a text of up to 60 characters), read from Parquet with `--files` files. Each
round, alternating, in one session (`local[2]`, the project's settings):

* plain: the frame run to Spark's `noop` sink, stored nowhere: what making the rows costs;
* localCheckpoint: `frame.localCheckpoint(storageLevel=DISK_ONLY)` (Spark's own: each row
  serialized as an object of its own), then every stored row read to the `noop` sink;
* chunks: `checkpoint.stored(frame)` with the project's jar (`StoredRows.java`), then read the
  same way.

Printed per way: the median seconds to store (the plain run for plain) and to read back, and
the store's and the read's ratios to the plain run and to `localCheckpoint`'s. One warm-up
round first.

    .venv/bin/python benchmarks/bench_stored.py [--rows 5000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from changelake.spark.checkpoint import stored
from changelake.spark.session import build_session


def source(spark: SparkSession, path: Path, rows: int, files: int) -> DataFrame:
    spark.range(rows).selectExpr(
        "CAST(id % 2 AS INT) AS file_index", "id DIV 65536 AS block", "id AS row",
        "'change' AS kind", "id DIV 3 AS time", "array(id DIV 3, id % 3) AS pos",
        "CASE WHEN id % 10 = 0 THEN 'd' ELSE 'u' END AS op", "id % 1000003 AS k0",
        "named_struct('name', concat('n', id), 'amount', id % 997, 'note', "
        "CASE WHEN id % 3 = 0 THEN NULL ELSE concat('u', id % 997) END, 'flag', id % 2 = 0) "
        "AS a",
        "repeat('t', CAST(id % 61 AS INT)) AS text",
    ).repartition(files).write.parquet(str(path))
    return spark.read.parquet(str(path))


def timed(action: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = action()
    return time.perf_counter() - start, out


def noop(frame: DataFrame) -> None:
    frame.write.format("noop").mode("overwrite").save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    spark = build_session(args.master)
    ways: dict[str, Callable[[DataFrame], DataFrame]] = {
        "localCheckpoint": lambda f: f.localCheckpoint(storageLevel=StorageLevel.DISK_ONLY),
        "chunks": stored,
    }
    with tempfile.TemporaryDirectory(prefix="bench-stored-") as work:
        frame = source(spark, Path(work) / "rows", args.rows, args.files)
        store: dict[str, list[float]] = {"plain": [], **{w: [] for w in ways}}
        read: dict[str, list[float]] = {w: [] for w in ways}
        for round_ in range(args.rounds + 1):
            plain, _ = timed(lambda: noop(frame))
            took = {"plain": plain}
            back = {}
            for name, way in ways.items():
                took[name], kept = timed(lambda way=way: way(frame))
                back[name], _ = timed(lambda kept=kept: noop(kept))
                del kept
            line = "  ".join(f"{n} {took[n]:.2f}/{back.get(n, 0):.2f} s" for n in took)
            print(f"round {round_}{' (warm-up)' if not round_ else ''}: {line}", flush=True)
            if round_:
                for n in took:
                    store[n].append(took[n])
                for n in back:
                    read[n].append(back[n])
    med = {n: statistics.median(v) for n, v in store.items()}
    back_med = {n: statistics.median(v) for n, v in read.items()}
    print(f"\n{args.rows:,} rows, {args.rounds} rounds, medians, master {args.master}")
    print(f"  plain (the rows made, stored nowhere)   {med['plain']:6.2f} s")
    for n in ways:
        print(f"  {n:16} store {med[n]:6.2f} s ({med[n] / med['plain']:.2f}x plain)   "
              f"read {back_med[n]:6.2f} s")
    base = "localCheckpoint"
    print(f"  chunks against {base}: store {med['chunks'] / med[base]:.2f}x, "
          f"read {back_med['chunks'] / back_med[base]:.2f}x; the store's cost over plain "
          f"{(med['chunks'] - med['plain']) / max(med[base] - med['plain'], 1e-9):.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
