"""A lake on S3 against the same lake on a local directory (issue 66): ingest, snapshot, and
the object-store requests per commit as a table grows.

The S3 store is moto's server on loopback (`tests/support/s3_server.py`), every request it answers
counted by kind (GET, HEAD, PUT, LIST, DELETE, COPY, POST) with the time the server took to
answer it. Each lake is measured by a child process of its own (a session is on one lake's
metastore), one after the other in the same run, on the same files and the same settings:

* `ingest --from debezium` of `bench_ingest.write_feed`'s PostgreSQL feed (`--events`) into
  a new Delta table (a small feed ingested first, into another table, to warm the JVM);
* `snapshot` of that table: on Spark (`api.snapshot`, every row to the driver), and, after
  the session has stopped, without a JVM (`arrow.merged`, as `snapshot --engine arrow`);
* `--commits` small incremental ingests into one more table, the feed of `--commits` *
  `--chunk` events cut at transaction boundaries into that many files and ingest k given
  files 1..k (as a directory that grows is given again), so that each commits the next
  transactions; the requests of each commit are counted (on S3), and shown for the commits
  `--at` and as means over windows of ten commits (Delta writes a checkpoint of its log
  every ten commits of a table, and a commit here is two Delta commits and a manifest).

Printed: the seconds of each step on each lake and the ratio S3/local, and per commit the
requests by kind and the server's time answering them (the rest of an S3 commit's time over
the local one's is the client's: S3A's round trips and the SDK's work).

    python benchmarks/bench_s3.py
    python benchmarks/bench_s3.py --events 1100000 --commits 80 --at 1,10,20,40,80
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from tests.support.s3_server import RequestCounts  # noqa: E402

from bench_ingest import write_feed  # noqa: E402

KINDS = RequestCounts.KINDS


def cut_feed(feed: Path, out: Path, files: int) -> list[Path]:
    """`feed`'s lines cut into `files` files of about equal lines, each cut where a
    transaction (`source.txId`) ends; the replayed tail stays in the last."""
    import orjson

    lines = feed.read_bytes().splitlines()
    per = max(1, len(lines) // files)
    paths: list[Path] = []
    start = 0
    for n in range(files):
        end = len(lines) if n == files - 1 else min(len(lines), start + per)
        while 0 < end < len(lines) and not _tx_ends(orjson, lines[end - 1], lines[end]):
            end += 1
        path = out / f"part-{n:04d}.jsonl"
        path.write_bytes(b"\n".join(lines[start:end]) + b"\n")
        paths.append(path)
        start = end
    return paths


def _tx_ends(orjson: Any, line: bytes, after: bytes) -> bool:
    """Whether a transaction ends between two lines (a delete's tombstone ends with its
    delete)."""
    if after == b"null":
        return False
    if line == b"null":
        return True
    a, b = orjson.loads(line)["source"], orjson.loads(after)["source"]
    return a.get("snapshot") not in ("true",) and a["txId"] != b["txId"]


# ------------------------------------------------------------------------------- the child


def what(key: str) -> str:
    """What an object of a table is, for the requests' breakdown: the Delta log's commits,
    checkpoints and `_last_checkpoint`, data files, our manifests and pointer, the lock."""
    import re

    key = re.sub(r"^bench/(tables/bench/[a-z]+/)?", "", key)
    key = re.sub(r"/(part|cdc)-[^/]*", r"/\1-*", key)
    key = re.sub(r"/\.\d+\.crc\.[^/]*\.tmp", "/.N.crc.*.tmp", key)
    key = re.sub(r"\d{3,}", "N", key)
    return re.sub(r"v\d+\.json", "vN.json", key)


def objects(requests: list[tuple[str, str]]) -> dict[str, int]:
    counted = Counter(f"{kind} {what(key)}" for kind, key in requests)
    return dict(sorted(counted.items()))


def child(kind: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every step on one lake (`kind`: local or s3), with the S3 server in this process."""
    from contextlib import ExitStack

    from s3_server import s3_server

    counts = RequestCounts()
    with ExitStack() as stack:
        if kind == "s3":
            server = stack.enter_context(s3_server(counts=counts))
            os.environ.update(server.environment())
            os.environ["CHANGELAKE_STATE_HOME"] = str(work / "state")
            lake_uri: str = server.lake("bench")
        else:
            lake_uri = str(work / "local-lake")
        return measure(lake_uri, counts, work, args)


def measure(lake_uri: str, counts: RequestCounts, work: Path, args: argparse.Namespace
            ) -> dict[str, Any]:
    from changelake.lake import Lake, api, arrow, ingest, lake_session
    from changelake.lake.identifier import TableIdentifier

    result: dict[str, Any] = {}
    took: dict[str, Any] = {}

    def step(name: str, start: float) -> None:
        taken = counts.take()
        took[name] = {"seconds": time.perf_counter() - start, "requests": taken.counts,
                      "server": taken.seconds, "objects": objects(taken.requests)}

    start = time.perf_counter()
    spark = lake_session(lake_uri, args.master,
                         conf={"spark.sql.shuffle.partitions": str(args.partitions)})
    spark.sparkContext.setLogLevel("ERROR")
    lake = Lake(spark, lake_uri, storage="delta")
    step("session", start)
    ingest.ingest(lake, "bench.warm", [work / "small.jsonl"], key=["id"], source="debezium")
    sum(1 for _ in api.snapshot(lake, "bench.warm"))
    counts.take()

    start = time.perf_counter()
    report = ingest.ingest(lake, "bench.items", [work / "feed.jsonl"], key=["id"],
                           source="debezium")
    step("ingest", start)
    result["written"] = report.commit.written
    start = time.perf_counter()
    result["rows"] = sum(1 for _ in api.snapshot(lake, "bench.items"))
    step("snapshot_spark", start)

    parts = sorted((work / "parts").iterdir())[:args.commits]
    commits: list[dict[str, Any]] = []
    upto = len(parts) if "://" in lake_uri else min(len(parts), args.local_commits)
    for k in range(1, upto + 1):
        start = time.perf_counter()
        done = ingest.ingest(lake, "bench.inc", parts[:k], key=["id"], source="debezium")
        seconds = time.perf_counter() - start
        taken = counts.take()
        commits.append({"seconds": seconds, "requests": taken.counts, "server": taken.seconds,
                        "objects": objects(taken.requests), "written": done.commit.written})
    result["commits"] = commits
    spark.stop()
    counts.take()

    start = time.perf_counter()
    merged = arrow.merged(lake_uri, TableIdentifier.parse("bench.items"))
    result["rows_arrow"] = merged.rows.num_rows
    step("snapshot_arrow", start)
    result["steps"] = took
    return result


# ------------------------------------------------------------------------------ the parent


def run_child(kind: str, work: Path, argv: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--work", str(work),
                          *argv], capture_output=True, text=True, env={
                              **{k: v for k, v in os.environ.items()
                                 if not k.startswith("AWS_")},
                              "PYTHONPATH": str(HERE.parent / "src")})
    found = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not found:
        sys.exit(f"the {kind} run failed:\n{out.stderr[-4000:]}")
    return json.loads(found[-1][len("RESULT "):])


def requests_line(requests: dict[str, int], n: float = 1) -> str:
    return " ".join(f"{k} {requests.get(k, 0) / n:5.1f}" for k in KINDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000,
                        help="events of the feed the big ingest and snapshot take")
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--local-commits", type=int, default=6,
                        help="how many of the incremental ingests the local lake runs too "
                             "(for the ratio; its requests are not counted)")
    parser.add_argument("--chunk", type=int, default=120,
                        help="events per incremental ingest")
    parser.add_argument("--at", default="1,10,20",
                        help="the commits whose requests are shown one by one")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=4,
                        help="spark.sql.shuffle.partitions")
    parser.add_argument("--objects", action="store_true",
                        help="also the requests of the commits --at by object (the Delta "
                             "log's commits and checkpoints, data files, manifests, lock)")
    parser.add_argument("--child", choices=("local", "s3"), help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.work, args)), flush=True)
        return

    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    try:
        events = write_feed(work / "feed.jsonl", args.events)
        write_feed(work / "small.jsonl", 600, seed=3)
        write_feed(work / "incremental.jsonl", (args.commits + 1) * args.chunk, seed=5)
        (work / "parts").mkdir()
        # one part more than is ingested: the last holds the feed's replayed tail, and its
        # last transaction, which no later part completes
        cut_feed(work / "incremental.jsonl", work / "parts", args.commits + 1)
        argv = sys.argv[1:]
        local = run_child("local", work, argv)
        s3 = run_child("s3", work, argv)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(args, events, local, s3)


def report(args: argparse.Namespace, events: int, local: dict[str, Any],
           s3: dict[str, Any]) -> None:
    assert local["rows"] == s3["rows"] == local["rows_arrow"] == s3["rows_arrow"], (local, s3)
    print(f"{events:,} Debezium events ({local['written']:,} updates, {local['rows']:,} rows) "
          f"then {args.commits} ingests of ~{args.chunk} events; master {args.master}, "
          f"{args.partitions} shuffle partitions; S3: moto's server on loopback")
    print(f"{'step':16} {'local s':>8} {'S3 s':>8} {'S3/local':>8}   S3 requests")
    for name in ("session", "ingest", "snapshot_spark", "snapshot_arrow"):
        a, b = local["steps"][name], s3["steps"][name]
        print(f"{name:16} {a['seconds']:8.2f} {b['seconds']:8.2f} "
              f"{b['seconds'] / a['seconds']:7.2f}x   {requests_line(b['requests'])}")
    lc, sc = local["commits"], s3["commits"]
    both = len(lc)
    total_l = sum(c["seconds"] for c in lc[1:])
    total_s = sum(c["seconds"] for c in sc[1:both])
    if both > 1:
        print(f"{'commits 2..' + str(both):16} {total_l:8.2f} {total_s:8.2f} "
              f"{total_s / total_l:7.2f}x   (each: local {total_l / (both - 1):.2f} s, "
              f"S3 {total_s / (both - 1):.2f} s; the server's time "
              f"{sum(c['server'] for c in sc[1:both]) / (both - 1):.2f} s)")
    print("requests per commit on S3 (the commit's own, then means over windows):")
    for n in [int(x) for x in args.at.split(",") if 0 < int(x) <= len(sc)]:
        c = sc[n - 1]
        local_s = f"local {lc[n - 1]['seconds']:.2f} s, " if n <= both else ""
        print(f"  commit {n:3}: {sum(c['requests'].values()):4} = "
              f"{requests_line(c['requests'])}  {c['seconds']:.2f} s ({local_s}server "
              f"{c['server']:.2f} s), {c['written']} updates")
    for low in range(2, len(sc) + 1, 10):
        window = sc[low - 1:low + 9]
        total: Counter[str] = Counter()
        for c in window:
            total.update(c["requests"])
        print(f"  commits {low:3}..{low + len(window) - 1:<3} mean: "
              f"{sum(total.values()) / len(window):6.1f} = {requests_line(total, len(window))}")
    if args.objects:
        shown = [int(x) for x in args.at.split(",") if 0 < int(x) <= len(sc)]
        print("requests by object, commits " + ", ".join(map(str, shown)) + ":")
        names = sorted({k for n in shown for k in sc[n - 1]["objects"]})
        for name in names:
            print(f"  {name[:70]:70} " + " ".join(
                f"{sc[n - 1]['objects'].get(name, 0):4}" for n in shown))


if __name__ == "__main__":
    main()
