"""A Spark command's time on a tiny input, with and without the JVM's class archive.

On a tiny input a Spark command's time is its start: the JVM, Spark, the metastore, and the
first jobs' classes. `spark/class_archive.py` maps Spark's classes from an archive made once
(`changelake jvm-archive`, which the setup runs). Each command below runs `--rounds` times
with the archive and as often without it (`CHANGELAKE_CLASS_ARCHIVE` set empty), alternating,
each a fresh process on a fresh lake where it writes one; printed: the median seconds of
each and their ratio (with / without), per command.

* `ingest --from debezium`: a Debezium feed (`simulate.debezium_orders`, `--rows` rows) into a
  new keyed table: the changefeed's Spark path and the embedded metastore;
* `snapshot --engine spark` of that table;
* `decode --engine spark` of a Materialize CDC log of the same feed.

    .venv/bin/python benchmarks/bench_startup.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from changelake.convert import encode_changefeed
from changelake.formats.materialize import CdcSchema, write_json_lines
from changelake.simulate import debezium_orders
from changelake.spark.class_archive import ARCHIVE_ENV, archive_path

CLI = str(Path(sys.executable).parent / "changelake")
FIELDS = [{"name": "id", "type": "long"}, {"name": "customer", "type": ["null", "string"]},
          {"name": "amount_cents", "type": ["null", "long"]},
          {"name": "status", "type": ["null", "string"]}]


def inputs(root: Path, rows: int) -> tuple[Path, Path, Path]:
    """The Debezium feed, and its Materialize CDC log with the log's schema."""
    feed = debezium_orders(random.Random(1), rows=rows, transactions=rows)
    debezium = root / "orders.jsonl"
    debezium.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in feed.events))
    messages = encode_changefeed([debezium], source="debezium", keys=["id"], table_schema=None,
                                 close=True, lenient=False)
    schema = CdcSchema.for_fields(FIELDS)
    log = root / "orders.cdc.jsonl"
    with log.open("wb") as out:
        write_json_lines(out, list(messages), schema)
    schema_file = root / "orders.avsc"
    schema_file.write_bytes(orjson.dumps(schema.avro))
    return debezium, log, schema_file


def run(command: list[str], archive: bool) -> float:
    env = dict(os.environ)
    if not archive:
        env[ARCHIVE_ENV] = ""
    start = time.perf_counter()
    done = subprocess.run([CLI, *command], capture_output=True, env=env, timeout=600)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed: {done.stderr.decode()[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=50)
    args = parser.parse_args()
    archive = archive_path()
    if archive is None or not archive.is_file():
        raise SystemExit(f"no class archive at {archive}: run `changelake jvm-archive`")
    print(f"Spark command start-up: {args.rounds} rounds each with the class archive "
          f"({archive.stat().st_size / 2**20:,.0f} MiB) and without, alternating; "
          f"{os.cpu_count()} cores", flush=True)
    root = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        debezium, log, schema = inputs(root, args.rows)
        times: dict[tuple[str, bool], list[float]] = {}
        for round_ in range(args.rounds):
            for archived in ((True, False) if round_ % 2 == 0 else (False, True)):
                lake = root / f"lake-{round_}-{archived}"
                commands = {
                    "ingest --from debezium": ["ingest", "--lake", str(lake), "--table", "t",
                                               "--from", "debezium", "--key", "id", "--close",
                                               str(debezium)],
                    "snapshot --engine spark": ["snapshot", "--lake", str(lake), "--table",
                                                "t", "--engine", "spark"],
                    "decode --engine spark": ["decode", "--engine", "spark", "--schema",
                                              str(schema), str(log)],
                }
                for name, command in commands.items():
                    times.setdefault((name, archived), []).append(run(command, archived))
                shutil.rmtree(lake)
        for name in ("ingest --from debezium", "snapshot --engine spark",
                     "decode --engine spark"):
            with_, without = (statistics.median(times[(name, a)]) for a in (True, False))
            print(f"  {name:<26} with {with_:6.2f} s   without {without:6.2f} s   "
                  f"{with_ / without:5.2f}x the time", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
