"""What the one-row-per-key check (`lake/key_rule.py`) adds to an ingest into a keyed table.

A Materialize CDC log of `--updates` updates (a key column `id`, two more columns; each key
inserted once, a fifth of them updated later: a retraction and an insertion at one time; every
message delivered twice, shuffled, in `--files` Avro container files) is ingested into a new
keyed table, `--rounds` times with the check and as many without it
(`ingest.check_one_row_per_key` swapped for a no-op), alternating, in one process after one
unmeasured ingest of each. Printed: each way's median seconds and their ratio, and the
check's own time (timed around its call in the rounds with it) against the whole ingest.

    python benchmarks/bench_key_rule.py --updates 1000000 --rounds 5
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path


def write_log(directory: Path, updates: int, files: int, seed: int = 5) -> int:
    """The log (module docstring) as `files` Avro container files; the number of distinct
    updates written."""
    from changelake.formats.materialize import CdcSchema, write_ocf
    from changelake.protocol import Writer
    from changelake.values import Record

    schema = CdcSchema.for_fields([{"name": "id", "type": "long"},
                                   {"name": "name", "type": "string"},
                                   {"name": "amount", "type": "long"}])
    rng = random.Random(seed)
    keys = updates * 5 // 7  # each key 1 update, a fifth 3: about `updates` in all
    times = 100
    writer = Writer(batch_size=5000)
    messages = []
    written = 0
    changed = set(rng.sample(range(keys), keys // 5))
    by_time: dict[int, list] = {}
    for k in range(keys):
        row = Record((("id", k), ("name", f"n{k % 97}"), ("amount", k % 1000)))
        first = k % (times // 2)
        by_time.setdefault(first, []).append((row, 1))
        if k in changed:
            later = first + 1 + k % (times // 2 - 1)
            new = Record((("id", k), ("name", f"m{k % 89}"), ("amount", k % 1000 + 1)))
            by_time.setdefault(later, []).extend([(row, -1), (new, 1)])
    for t in range(times):
        for row, diff in by_time.get(t, []):
            writer.push(row, t, diff)
            written += 1
        if t % 10 == 9:
            messages.extend(writer.finish_through(t))
    delivered = messages + messages
    rng.shuffle(delivered)
    directory.mkdir(parents=True)
    for n in range(files):
        with open(directory / f"part-{n:03d}.avro", "wb") as fo:
            write_ocf(fo, delivered[n::files], schema)
    return written


def alternate(ways: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each way once, not measured, then `rounds` rounds of every way in turn, the order
    reversed every other round (each way returns its own seconds); each way's median."""
    for way in ways.values():
        way()
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    order = list(ways.items())
    for r in range(rounds):
        for name, way in order if r % 2 == 0 else order[::-1]:
            seconds[name].append(way())
            print(f"  round {r + 1}: {name:<20} {seconds[name][-1]:6.2f} s", flush=True)
    return {name: statistics.median(times) for name, times in seconds.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=500_000)
    parser.add_argument("--files", type=int, default=8, help="the log's files (each one "
                        "partition of the read)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()

    from changelake.lake import Lake, ingest
    from changelake.lake.catalog import lake_session

    root = Path(tempfile.mkdtemp(prefix="bench-key-rule-"))
    try:
        log = root / "log"
        started = time.perf_counter()
        distinct = write_log(log, args.updates, args.files)
        print(f"log: {distinct:,} distinct updates, each message twice, {args.files} files "
              f"({time.perf_counter() - started:.1f} s to write)", flush=True)
        spark = lake_session(root / "lake", master=args.master)
        spark.sparkContext.setLogLevel("ERROR")
        lake = Lake(spark, root / "lake")
        checked = ingest.check_one_row_per_key
        check_seconds: list[float] = []

        def timed_check(*a: object, **k: object) -> None:
            start = time.perf_counter()
            checked(*a, **k)
            check_seconds.append(time.perf_counter() - start)

        def timed_ingest(check: bool) -> float:
            ingest.check_one_row_per_key = timed_check if check else (lambda *a, **k: None)
            start = time.perf_counter()
            report = ingest.ingest(lake, f"t_{uuid.uuid4().hex[:8]}", [log], key=["id"])
            seconds = time.perf_counter() - start
            assert report.commit.written == distinct, report.commit
            return seconds

        medians = alternate({"with the check": lambda: timed_ingest(True),
                             "without the check": lambda: timed_ingest(False)}, args.rounds)
        ingest.check_one_row_per_key = checked
        with_s, without_s = medians["with the check"], medians["without the check"]
        own = statistics.median(check_seconds[1:])  # not the warm-up's
        print(f"\ningest into a keyed table, median of {args.rounds}:")
        print(f"  with the check     {with_s:6.2f} s")
        print(f"  without it         {without_s:6.2f} s")
        print(f"  ratio              {with_s / without_s:6.2f}x")
        print(f"  the check itself   {own:6.2f} s  ({own / with_s:.2f} of the ingest with it)")
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
