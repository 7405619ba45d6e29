"""A separate process exporting a lake table to Iceberg round by round, for the kill -9 test.

    python tests/support/iceberg_export_worker.py --lake L --catalog URI --seed S [--keyed]

It commits a generated history to the lake table in three rounds (`[0, 4)`, `[4, 8)`,
`[8, 12)`; a commit is exactly once, so a re-run skips what is committed) and exports after
each, printing `EXPORT T` before the export to frontier T, so a test can kill it there. On
start it prints `FOUND F OK` for an Iceberg table a killed run left: its recorded frontier F
and whether its rows equal the truth at F (exactly once: a commit either happened whole or
not at all). At the end one line `RESULT {...}`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.lake_history import SCHEMA, keyed_history, state_at, to_df, unkeyed_history

TIMES = 12
ROUNDS = [(0, 4), (4, 8), (8, 12)]
TABLE = "k.exported"


def history(seed: int, keyed: bool) -> list:
    rng = random.Random(seed)
    return keyed_history(rng, TIMES, 20, 5) if keyed else unkeyed_history(rng, TIMES, 5, 6)


def say(line: str) -> None:
    print(line, flush=True)


def iceberg_state(uri: str) -> tuple[list | None, Counter]:
    from changelake.lake.export.iceberg import FRONTIER_PROPERTY, open_catalog

    catalog = open_catalog(uri)
    if not catalog.table_exists(TABLE):
        return None, Counter()
    table = catalog.load_table(TABLE)
    arrow = table.scan().to_arrow()
    rows = Counter(tuple(r[n] for n in arrow.column_names) for r in arrow.to_pylist())
    return json.loads(table.properties[FRONTIER_PROPERTY]), rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lake", required=True)
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--keyed", action="store_true")
    args = parser.parse_args()

    from changelake.lake import Lake, lake_session
    from changelake.lake.export.iceberg import export_to_iceberg

    h = history(args.seed, args.keyed)
    frontier, rows = iceberg_state(args.catalog)
    if frontier is not None:
        exact = rows == state_at(h, frontier[0] - 1, keyed=args.keyed)
        say(f"FOUND {frontier[0]} {json.dumps(exact)}")
    spark = lake_session(args.lake, "local[1]", conf={"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    lake = Lake(spark, args.lake)
    table = lake.create_table(TABLE, SCHEMA, key=["id"] if args.keyed else (), buckets=2,
                              exist_ok=True)
    modes = []
    for lo, hi in ROUNDS:
        table.commit(to_df(spark, [u for u in h if lo <= u[1] < hi]), lo, hi)
        say(f"EXPORT {hi}")
        modes.append(export_to_iceberg(lake, TABLE, args.catalog).mode)
        upper = table.state().upper  # a re-run's lake may be ahead of this round
        frontier, rows = iceberg_state(args.catalog)
        assert frontier == [upper] and rows == state_at(h, upper - 1, keyed=args.keyed), hi
    say("RESULT " + json.dumps({"frontier": frontier, "modes": modes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
