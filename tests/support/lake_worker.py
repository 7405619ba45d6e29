"""A separate process working on a lake, for the multi-process and kill -9 tests
(`tests/support/lake_worker.py`):

    python lake_worker.py run   --lake L --table T --seed S [--keyed] [--metastore-uri U]
    python lake_worker.py check --lake L --table T --seed S [--keyed] [--metastore-uri U]
    python lake_worker.py read  --lake L --table T --seed S [--keyed] --metastore-uri U
                                      --stop FILE

`run` delivers a generated history in mangled, overlapping increments (the same ones on every
run with the same seed) and compacts every few increments, printing a line before each step so
a test can kill it at chosen points; running it again after a kill must finish the job.
`check` verifies that the table is readable and equals the truth at its committed frontier.
`read` reads the table until FILE exists and verifies that every read is a state the history
passed through.

    python lake_worker.py ingest  --lake L --table T --seed S --metastore-uri U
                                        --inputs F1,F2 [--inputs F1,F2,F3 ...]
    python lake_worker.py compact --lake L --table T --seed S --metastore-uri U --stop FILE

`ingest` runs `ingest.ingest` of a keyed Debezium feed once per `--inputs` (comma-separated
files), as concurrent deliveries would. `compact` compacts whenever the table exists until FILE
exists, then reports the table's rows and whether its changes apply exactly once. Each prints
one JSON line `RESULT {...}` at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.lake_history import (
    SCHEMA,
    changes_are_exactly_once,
    increments,
    keyed_history,
    messages,
    rows_of,
    state_at,
    to_df,
    unkeyed_history,
)

TIMES = 30


def history(seed: int, keyed: bool) -> tuple[list, random.Random]:
    rng = random.Random(seed)
    h = keyed_history(rng, TIMES, 25, 5) if keyed else unkeyed_history(rng, TIMES, 6, 4)
    return h, rng


def steps(seed: int, keyed: bool, compact_every: int = 3) -> Iterator[tuple[str, Any]]:
    """What `run` does, in order, each step with the line it prints first: `("COMMIT n",
    increment)`, `("COMPACT n", None)` after every `compact_every` increments, and
    `("COMPACT final", None)`. The same on every run with the seed; how many increments
    there are depends on the seed, so a test picks its kill points from these lines."""
    h, rng = history(seed, keyed)
    msgs = messages(h, finish_every=3, rng=rng, last_time=TIMES - 1)
    for n, inc in enumerate(increments(msgs, rng)):
        yield f"COMMIT {n}", inc
        if n % compact_every == compact_every - 1:
            yield f"COMPACT {n}", None
    yield "COMPACT final", None


def printed(seed: int, keyed: bool, compact_every: int = 3) -> list[str]:
    """The lines `run` prints before its steps (`steps`), in order."""
    return [line for line, _ in steps(seed, keyed, compact_every)]


def say(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["run", "check", "read", "ingest", "compact"])
    parser.add_argument("--lake", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--keyed", action="store_true")
    parser.add_argument("--metastore-uri")
    parser.add_argument("--compact-every", type=int, default=3)
    parser.add_argument("--stop")
    parser.add_argument("--inputs", action="append", default=[])
    args = parser.parse_args()

    from changelake.lake import Lake, lake_session
    from changelake.lake.compact import CompactionPolicy, compact

    spark = lake_session(args.lake, "local[1]", metastore_uri=args.metastore_uri,
                         conf={"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    lake = Lake(spark, args.lake)
    h, _ = history(args.seed, args.keyed)
    truth = {t: state_at(h, t, keyed=args.keyed) for t in range(-1, TIMES)}
    result: dict = {}

    if args.action == "run":
        if lake.exists(args.table):  # a re-run: what the last run committed must be readable
            table = lake.table(args.table)
            upper = table.state().upper
            upper = TIMES if upper is None else upper
            say(f"RESUMED {json.dumps(rows_of(spark.table(args.table)) == truth[upper - 1])} "
                f"{upper}")
        table = lake.create_table(args.table, SCHEMA, key=["id"] if args.keyed else (),
                                  buckets=4, exist_ok=True)
        policy = CompactionPolicy(fold_fraction=0.5, max_runs=2)
        for line, inc in steps(args.seed, args.keyed, args.compact_every):
            say(line)
            if inc is not None:
                table.commit(to_df(spark, inc.updates), inc.lower, inc.upper)
            else:
                compact(table, policy=policy)
        args.action = "check"

    if args.action == "check":
        table = lake.table(args.table)
        state = table.state()
        upper = state.upper if state.upper is not None else TIMES
        now = rows_of(spark.table(args.table))
        result = {"frontier": upper, "since": state.since,
                  "ok": now == truth[upper - 1],
                  "as_of_ok": all(rows_of(table.as_of(t)) == truth[t]
                                  for t in sorted({state.since, (state.since + upper) // 2,
                                                   upper - 1}) if t >= state.since)}

    if args.action == "read":
        valid = {frozenset(c.items()) for c in truth.values()}
        reads = bad = 0
        versions: set[int] = set()
        from changelake.lake import TableIdentifier
        from changelake.lake.commit import committed_version

        ident = TableIdentifier.parse(args.table)
        while not Path(args.stop).exists():
            rows = rows_of(spark.table(args.table))
            reads += 1
            if frozenset(rows.items()) not in valid:
                bad += 1
            versions.add(committed_version(spark, ident) or -1)
            time.sleep(0.1)
        result = {"reads": reads, "bad": bad, "versions": len(versions)}

    if args.action == "ingest":
        from changelake.lake import ingest

        commits = []
        for n, files in enumerate(args.inputs):
            say(f"INGEST {n}")
            report = ingest.ingest(lake, args.table, files.split(","), key=["id"],
                                 source="debezium")
            c = report.commit
            commits.append([c.lower, c.upper, c.written, c.skipped])
        result = {"commits": commits}

    if args.action == "compact":
        compactions = 0
        while not Path(args.stop).exists():
            if lake.exists(args.table):
                compactions += compact(lake.table(args.table)).version is not None
            time.sleep(0.2)
        table = lake.table(args.table)
        result = {"compactions": compactions, "upper": table.state().upper,
                  "sums_ok": changes_are_exactly_once(table),
                  "rows": sorted((r.asDict() for r in table.current().collect()),
                                 key=lambda r: r["id"])}

    say("RESULT " + json.dumps(result))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
