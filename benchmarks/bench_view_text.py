"""Reading a lake table's committed version: what every lake command and every committed batch
does first (`lake.commit.view_text`), against the way it was read before
(`DESCRIBE TABLE EXTENDED`, the "View Text" row), in one process, on the embedded metastore.

A lake with one table (created and committed once through `Lake`); then `--rounds` rounds,
alternating, each reading the view text `--reads` times each way. Printed: the median
seconds per read each way and their ratio.

    python benchmarks/bench_view_text.py --rounds 5 --reads 20
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()

    from pyspark.sql import types as T

    from changelake.lake.catalog import Lake, lake_session
    from changelake.lake.commit import view_text
    from changelake.lake.identifier import TableIdentifier

    root = Path(tempfile.mkdtemp(prefix="bench-view-")) / "lake"
    spark = lake_session(root, "local[2]")
    lake = Lake(spark, root)
    lake.create_table("items", T.StructType([T.StructField("id", T.LongType())]), key=["id"])
    ident = TableIdentifier.parse("items")

    def described() -> str:
        for row in spark.sql(f"DESCRIBE TABLE EXTENDED {ident.quoted}").collect():
            if row[0] == "View Text":
                return str(row[1])
        raise AssertionError("no view text")

    def metastore() -> str:
        text = view_text(spark, ident)
        assert text is not None
        return text

    assert described() == metastore()
    times: dict[str, list[float]] = {"DESCRIBE TABLE EXTENDED": [], "view_text": []}
    for _ in range(args.rounds):
        for name, read in (("DESCRIBE TABLE EXTENDED", described), ("view_text", metastore)):
            start = time.perf_counter()
            for _ in range(args.reads):
                read()
            times[name].append((time.perf_counter() - start) / args.reads)
    before, after = (statistics.median(t) for t in times.values())
    print(f"view text of one table, {args.rounds} rounds x {args.reads} reads, medians")
    print(f"  DESCRIBE TABLE EXTENDED  {before * 1000:7.1f} ms")
    print(f"  view_text (metastore)    {after * 1000:7.1f} ms   {after / before:.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
