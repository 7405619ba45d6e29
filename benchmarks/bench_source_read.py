"""The `materialize-cdc` data source's read: its rows handed to Spark as Arrow batches made by
pyarrow (`source.arrow_batches`), against the same rows yielded as tuples for PySpark's own
conversion (the read before), in one run.

A Materialize CDC log of `--updates` distinct updates (`bench_key_rule.py`'s: a key and two
columns, every message twice, shuffled) in `--files` Avro container files is read whole
(`write.format("noop")`: every column of every row reaches the JVM) `--rounds` times each
way, alternating, after one unmeasured read of each. The tuple way is the same data source
with its reader's `read` yielding `read_file`'s rows as they are. Printed: each way's median
seconds and the ratio. The ingest's whole figure is `bench_key_rule.py`'s.

    python benchmarks/bench_source_read.py --updates 1000000 --files 8 --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_key_rule import alternate, write_log


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=500_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()

    from changelake.spark.session import build_session
    from changelake.spark.source import (
        FilePartition,
        MaterializeCdcDataSource,
        MaterializeCdcReader,
        read_file,
        register,
    )

    class TupleReader(MaterializeCdcReader):
        def read(self, partition):  # type: ignore[override]
            assert isinstance(partition, FilePartition)
            yield from read_file(self.options, partition.path)

    class TupleSource(MaterializeCdcDataSource):
        @classmethod
        def name(cls) -> str:
            return "materialize-cdc-tuples"

        def reader(self, schema):  # type: ignore[override]
            options, _, files = self._resolved()
            return TupleReader(options, files, schema)

    root = Path(tempfile.mkdtemp(prefix="bench-source-read-"))
    try:
        started = time.perf_counter()
        distinct = write_log(root / "log", args.updates, args.files)
        print(f"log: {distinct:,} distinct updates, each message twice, {args.files} files "
              f"({time.perf_counter() - started:.1f} s to write)", flush=True)
        spark = build_session(args.master)
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        spark.dataSource.register(TupleSource)

        def read(source: str) -> float:
            start = time.perf_counter()
            spark.read.format(source).load(str(root / "log")).write.format("noop") \
                .mode("overwrite").save()
            return time.perf_counter() - start

        medians = alternate({"Arrow batches": lambda: read("materialize-cdc"),
                             "tuples": lambda: read("materialize-cdc-tuples")}, args.rounds)
        arrow_s, tuples_s = medians["Arrow batches"], medians["tuples"]
        print(f"\nread of {2 * distinct:,} delivered updates, median of {args.rounds}:")
        print(f"  Arrow batches  {arrow_s:6.2f} s")
        print(f"  tuples         {tuples_s:6.2f} s")
        print(f"  ratio          {arrow_s / tuples_s:6.2f}x the time")
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
