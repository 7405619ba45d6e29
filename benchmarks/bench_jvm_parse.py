"""What a Debezium parse written for the JVM could cost per line, against today's.

A measurement for issue 9's rate aim, not a path of the project: `jvm_parse/ScanLine.java`
reads each line once with Jackson's streaming parser (a Java UDF, `UDF1<String, Row>`) and
returns the fields `parse.parse_items` reads, applying none of its rules. The script compiles
it with `javac` against PySpark's jars into a temporary jar, puts that on `spark.jars`, and
times, to Spark's `noop` sink, `--rounds` rounds in one session (the first, the JIT's warm-up,
is not counted; medians of the rest):

* `text`: the lines as `read.read_lines` reads them, nothing parsed (the I/O floor);
* `reader`: Spark's JSON reader with the image's schema, as `bench_ingest.plain_write` reads;
* `java scan`: the lines through `ScanLine`;
* `parse_items`: today's parse.

The feed is `bench_ingest.py`'s (PostgreSQL, `--events` events). As a check that the scan
reads what the parse reads, it prints how many lines each finds a change on and whether
their ops and after images (by a hash over all lines) agree.

    python benchmarks/bench_jvm_parse.py --events 1100000 --rounds 4
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import in_child, write_feed

SOURCE = Path(__file__).resolve().parent / "jvm_parse" / "ScanLine.java"
FIELDS = ("op string, before string, after string, status string, id string, "
          "snapshot string, sequence string, `table` string, `schema` string, db string, "
          "connector string, lsn bigint, txId bigint, event_count bigint, many boolean")


def build_jar(work: Path) -> Path:
    """`ScanLine.java` compiled against PySpark's jars, as a jar in `work`."""
    import pyspark

    javac = shutil.which("javac")
    if javac is None:
        sys.exit("bench_jvm_parse: needs javac (a JDK), and none is on the PATH")
    jars = Path(pyspark.__file__).parent / "jars"
    classes = work / "classes"
    classes.mkdir()
    subprocess.run([javac, "-nowarn", "-cp", f"{jars}/*", "-d", str(classes), str(SOURCE)],
                   check=True)
    jar = work / "scan.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(classes), "."], check=True)
    return jar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=110_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from changelake.spark.changefeed.parse import parse_items
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.session import build_session

    work = Path(tempfile.mkdtemp(prefix="bench-jvm-parse-"))
    try:
        feed = work / "feed.jsonl"
        events = in_child(write_feed, feed, args.events)
        spark = build_session(args.master, conf={"spark.jars": str(build_jar(work))})
        spark.sparkContext.setLogLevel("ERROR")
        spark.udf.registerJavaFunction("scan_line", "ScanLine", FIELDS)

        def lines() -> DataFrame:
            return read_lines(spark, [str(feed)]).bounded

        def scanned() -> DataFrame:
            return lines().select(F.expr("scan_line(value)").alias("r")).select("r.*")

        def reader() -> DataFrame:
            return spark.read.schema(
                "after struct<id:bigint,name:string,amount:bigint,note:string>, op string"
            ).json(str(feed)).where("after IS NOT NULL").selectExpr("after.*")

        steps: dict[str, Callable[[], DataFrame]] = {
            "text": lines, "reader": reader, "java scan": scanned,
            "parse_items": lambda: parse_items(lines())}
        taken: dict[str, list[float]] = {name: [] for name in steps}
        for n in range(args.rounds):
            for name, frame in steps.items():
                start = time.perf_counter()
                frame().write.format("noop").mode("overwrite").save()
                if n:
                    taken[name].append(time.perf_counter() - start)
        print(f"{events:,} Debezium lines, {feed.stat().st_size / 2**20:.0f} MiB, master "
              f"{args.master}; medians of rounds 2-{args.rounds}")
        parse = statistics.median(taken["parse_items"])
        for name, seconds in taken.items():
            median = statistics.median(seconds)
            print(f"{name:12} {median:7.2f} s  {median / parse:5.2f}x parse_items   "
                  f"rounds: {', '.join(f'{s:.2f}' for s in seconds)}")

        def fingerprint(frame: DataFrame, op: str, after: str) -> tuple[int, int]:
            row = frame.where(F.col(op).isNotNull()).agg(
                F.count(F.lit(1)), F.sum(F.xxhash64(op, after) % 1_000_003)).first()
            return int(row[0]), int(row[1] or 0)

        ours = fingerprint(parse_items(lines()), "op", "after_raw")
        java = fingerprint(scanned(), "op", "after")
        print(f"lines with an op: parse_items {ours[0]:,}, java scan {java[0]:,}; ops and "
              f"after images {'agree' if ours == java else 'DIFFER'} (by a hash)")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
