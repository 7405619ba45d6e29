"""Debezium ingest into a Delta table: changelake against Spark Declarative Pipelines' AUTO CDC.

One Debezium feed (`bench_ingest.write_feed`: `--events` PostgreSQL change events over
`events // 6` keys, with an initial snapshot, inserts, updates without before-images, a third
of them with a TOAST-unchanged `note`, deletes with key-only before-images and tombstones, and
a connector restart that re-sends the last 2%), written once, goes

* **A, changelake**: into a keyed Delta table (`key=["id"]`, `source="debezium"`, the feed
  closed: it is whole) by `changelake ingest --format delta` run as a process (its start-up
  included), and by `ingest.ingest` on a Lake with `storage="delta"` in this process, after
  a 600-event warm-up as `bench_ingest.py` does. Besides the rows now, changelake keeps every
  update with its time (`snapshot --as-of T` for any T up to the frontier, `--history`,
  `changes`) and the table's frontier.
* **B, AUTO CDC**: through a pipeline of Spark Declarative Pipelines (SDP) run as SDP is meant
  to run, `spark-pipelines run --spec spark-pipeline.yml` (a process of its own: SDP runs only
  over Spark Connect, the CLI starting a local Connect server with its own session), one
  triggered run (Trigger.AvailableNow over the file source: one batch). The pipeline is a
  temporary view streaming the feed's lines (Spark's JSON reader, explicit schema; tombstones
  dropped) as `id` (the after-image's, a delete's before-image's), the after-image's columns,
  `op` and `source.lsn`; a streaming table `items` in Delta format
  (`create_streaming_table(format="delta")`); and `create_auto_cdc_flow(keys=["id"],
  sequence_by="lsn", apply_as_deletes="op = 'd'", except_column_list=["op", "lsn"])` (SCD type
  1: the rows now; no history, no frontier). The LSN is the order changelake's conversion uses.
  Timed from the process's start to its end (start-up included), as the changelake process is.

Printed: each side's seconds, events per second, the ratio changelake / AUTO CDC of the process
runs (and of the in-process changelake ingest over the AUTO CDC process, for what start-up
costs), and whether both tables hold the same rows now: the count and a checksum (the sum of
`xxhash64` of each row) of each, over all columns and without `note`: AUTO CDC writes
Debezium's TOAST placeholder (`__debezium_unavailable_value`) as the value, where changelake
keeps the column's previous value.

**On PySpark 4.2.0 with Delta 4.4.0, AUTO CDC cannot write a Delta table**, and the benchmark
says so instead of a figure: the flow starts, then fails with
`AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE` ("the target table ... (format: delta) does not support
row-level operations"). Spark 4.2's AUTO CDC checks that the target's DSv2 table implements
`SupportsRowLevelOperations` (`AutoCdcMergeWriteBase.requireDestinationSupportsRowLevelOps`);
Delta's `DeltaTableV2` does not (Delta does MERGE through its own analyzer rules), nor does the
kernel-based `DeltaV2Table` that `spark.databricks.delta.v2.enableMode=STRICT` returns.
Dropping the check is SPARK-57623, not in 4.2.0. The changelake side runs and is printed all
the same; the day a Spark and Delta pair passes the check, the same benchmark gives the ratio
and the comparison (see docs/platform-notes.md).

Needs PySpark's `pipelines` extra (grpcio, grpcio-status, googleapis-common-protos) for
`spark-pipelines`: `pip install -e '.[pipelines]'`. The SDP process gets Delta's jars and
settings from a `spark-defaults.conf` in its own `SPARK_CONF_DIR` (`--jars` on the
`spark-pipelines` command line does not reach the JVM that runs the Connect server).

    python benchmarks/bench_auto_cdc.py --events 20000
    python benchmarks/bench_auto_cdc.py                  # 1,100,000 events
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_ingest import PLACEHOLDER, in_child, write_feed

SPEC = """\
name: changelake_bench_auto_cdc
storage: {storage}
libraries:
  - glob:
      include: transformations/**
"""

TRANSFORMATION = """\
from pyspark import pipelines as dp

IMAGE = "struct<id:bigint,name:string,amount:bigint,note:string>"


@dp.temporary_view
def events():
    return (spark.readStream  # noqa: F821 - SDP puts `spark` in the module
            .schema(f"op string, before {{IMAGE}}, after {{IMAGE}}, source struct<lsn:bigint>")
            .json({feed!r}).where("op IS NOT NULL")
            .selectExpr("coalesce(after.id, before.id) AS id", "after.name", "after.amount",
                        "after.note", "op", "source.lsn AS lsn"))


dp.create_streaming_table("items", format="delta")
dp.create_auto_cdc_flow(target="items", source="events", keys=["id"], sequence_by="lsn",
                        apply_as_deletes="op = 'd'", except_column_list=["op", "lsn"])
"""

COLUMNS = ("id", "name", "amount", "note")


def tool(name: str) -> str:
    """A command of this Python environment (beside the interpreter), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"bench_auto_cdc: no `{name}` beside {sys.executable} or on PATH")
    return found


def timed_process(command: list[str], log: Path, env: dict[str, str] | None = None,
                  cwd: Path | None = None, timeout: float = 3600.0) -> tuple[float, int]:
    """Run `command` (output to `log`) in a process group of its own; (seconds, exit code).
    On a timeout the whole group is ended, so no JVM is left behind."""
    start = time.perf_counter()
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   cwd=cwd, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            code = -1
    return time.perf_counter() - start, code


def sdp_project(work: Path, feed_dir: Path) -> tuple[Path, dict[str, str]]:
    """The pipeline's directory (spec, transformation, Spark settings) and its environment."""
    from changelake.spark.maven import DELTA_CONF, require_jars

    project = work / "sdp"
    (project / "transformations").mkdir(parents=True)
    (project / "spark-pipeline.yml").write_text(
        SPEC.format(storage=(project / "storage").resolve().as_uri()))
    (project / "transformations" / "auto_cdc.py").write_text(
        TRANSFORMATION.format(feed=str(feed_dir)))
    conf_dir = project / "conf"
    conf_dir.mkdir()
    settings = {
        "spark.driver.extraClassPath": ":".join(str(p) for p in require_jars()),
        **DELTA_CONF,
        "spark.sql.warehouse.dir": str(project / "warehouse"),
        # as a changelake session has them (spark/settings.py DEFAULT_CONF)
        "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": "8",
        "spark.default.parallelism": "4",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{k} {v}\n" for k, v in settings.items()))
    env = {**os.environ, "SPARK_CONF_DIR": str(conf_dir), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return project, env


def sdp_failure(log: Path) -> str:
    """The reason a pipeline run failed, in one line, from its output."""
    text = log.read_text(errors="replace")
    for pattern in (r"(\[AUTOCDC_[A-Z_]+\][^\n]*)", r"(\[[A-Z_]{6,}\][^\n]*)",
                    r"((?:pyspark\.errors\.exceptions\.\S+|\w+Error): [^\n]*)"):
        found = re.findall(pattern, text)
        if found:
            return found[-1].strip()
    lines = [x for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else "no output"


def sdp_run_seconds(log: Path) -> float | None:
    """Seconds from the pipeline CLI's `Starting run...` line to its last timestamped line (the
    run without the process's and session's start-up; the CLI stamps whole seconds)."""
    from datetime import datetime

    stamps = [(datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S"), m[2]) for m in re.finditer(
        r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d): (.*)$", log.read_text(errors="replace"),
        re.MULTILINE)]
    starts = [t for t, text in stamps if text.startswith("Starting run")]
    return (stamps[-1][0] - starts[0]).total_seconds() if starts else None


def checksums(frame: object) -> tuple[int, int, int]:
    """(rows, checksum over every column, checksum without `note`) of a table's rows."""
    from pyspark.sql import functions as F

    row = frame.select(*COLUMNS).agg(  # type: ignore[attr-defined]
        F.count(F.lit(1)),
        F.coalesce(F.sum(F.xxhash64(*COLUMNS).cast("decimal(38,0)")), F.lit(0)),
        F.coalesce(F.sum(F.xxhash64("id", "name", "amount").cast("decimal(38,0)")), F.lit(0)),
    ).first()
    return int(row[0]), int(row[1]), int(row[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_100_000)
    parser.add_argument("--master", default="local[2]",
                        help="both sides' master (SDP: `spark-pipelines --remote MASTER`)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds each process may take before it is ended")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (feed, lakes, pipeline, logs)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-auto-cdc-"))
    try:
        feed_dir = work / "feed"  # a directory of its own: SDP's file source reads all of it
        feed_dir.mkdir()
        feed = feed_dir / "feed.jsonl"
        small = work / "small.jsonl"
        lines = in_child(write_feed, feed, args.events)
        write_feed(small, 600)
        size = feed.stat().st_size

        # A as a process: the CLI, start-up included
        cli_lake = work / "cli-lake"
        ours_cli, code = timed_process(
            [tool("changelake"), "ingest", "--lake", str(cli_lake), "--table", "bench.items",
             "--key", "id", "--from", "debezium", "--close", "--format", "delta",
             "--master", args.master, str(feed)], work / "changelake-ingest.log",
            timeout=args.timeout)
        if code != 0:
            raise SystemExit(f"bench_auto_cdc: changelake ingest failed (exit {code}): "
                             f"{(work / 'changelake-ingest.log').read_text()[-2000:]}")

        # B as a process: spark-pipelines run, start-up included
        project, env = sdp_project(work, feed_dir)
        sdp_log = work / "spark-pipelines.log"
        sdp, sdp_code = timed_process(
            [tool("spark-pipelines"), "--remote", args.master, "run", "--spec",
             str(project / "spark-pipeline.yml")], sdp_log, env=env, cwd=project,
            timeout=args.timeout)
        sdp_error = None if sdp_code == 0 else sdp_failure(sdp_log)
        sdp_run = sdp_run_seconds(sdp_log)

        # A in this process, warmed up as bench_ingest.py does
        from changelake.lake import Lake, ingest, lake_session

        spark = lake_session(work / "lake", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        lake = Lake(spark, work / "lake", storage="delta")
        ingest.ingest(lake, "bench.warm", [small], key=["id"], source="debezium", close=True)
        start = time.perf_counter()
        report = ingest.ingest(lake, "bench.items", [feed], key=["id"], source="debezium",
                                 close=True)
        ours = time.perf_counter() - start

        print(f"{lines:,} Debezium lines over {max(10, args.events // 6):,} keys, "
              f"{size / 2**20:.0f} MiB, master {args.master}")
        rows = [("changelake ingest (process)", ours_cli),
                ("changelake ingest.ingest (in process)", ours)]
        if sdp_error is None:
            rows.append(("AUTO CDC: spark-pipelines run (process)", sdp))
        for name, took in rows:
            ratio = f"{sdp / took:6.2f}x AUTO CDC" if sdp_error is None else ""
            print(f"{name:42} {took:8.2f} s {lines / took / 1000:8.1f} k events/s  {ratio}")
        print(f"changelake: {report.commit.written:,} updates, frontier {report.frontier}")
        if sdp_run is not None:
            print(f"AUTO CDC process: {sdp - sdp_run:.0f} s until its `Starting run`, "
                  f"{sdp_run:.0f} s from there to its last event")
        if sdp_error is not None:
            print(f"AUTO CDC: spark-pipelines run failed after {sdp:.2f} s (exit {sdp_code}), "
                  f"no figure: {sdp_error}")

        ours_rows = checksums(spark.table("bench.items"))
        cli_rows = checksums(spark.read.format("delta").load(
            str(cli_lake / "tables" / "bench" / "items" / "current")))
        print(f"changelake rows now: {ours_rows[0]:,}, checksum {ours_rows[1]}, without note "
              f"{ours_rows[2]}; the CLI's table "
              f"{'the same' if cli_rows == ours_rows else f'DIFFERS: {cli_rows}'}")
        if sdp_error is None:
            target = spark.read.format("delta").load(str(project / "warehouse" / "items"))
            theirs = checksums(target)
            placeholders = target.where(f"note = '{PLACEHOLDER}'").count()
            print(f"AUTO CDC rows now:   {theirs[0]:,}, checksum {theirs[1]}, without note "
                  f"{theirs[2]}; {placeholders:,} rows hold the TOAST placeholder as note")
            same = theirs[0] == ours_rows[0] and theirs[2] == ours_rows[2]
            print(f"rows now: {'the same' if same else 'DIFFERENT'} keys, names and amounts; "
                  f"notes {'the same' if theirs[1] == ours_rows[1] else 'differ'}")
        spark.stop()
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
