"""A separate process that makes the lake the SQL endpoint test serves, and says what
`snapshot --as-of` answers on it (the lake's embedded Derby admits one JVM: the endpoint can
only open the lake once this process has ended).

    python tests/support/sql_endpoint_lake.py LAKE

Two tables, each committed in several steps:

* `shop.orders`, keyed by `id`: inserts, an update, a delete, compacted to `since` 5, then
  another update; frontier 30 (open).
* `events`, unkeyed: duplicate rows, then a schema change at time 10 (column `n` dropped,
  `note` added); frontier 20.

Prints one line `RESULT {"as_of": ..., "now": ...}`: per table and time, the rows
`api.snapshot(as_of=T)` gives (what `changelake snapshot --as-of T` prints), or for a
refused time {"error": its message}; and the orders as they are now. `build` and
`as_of_answers` also make the same tables in a test's own session (under other names).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import LongType, StringType, StructField, StructType

from changelake.errors import ChangelakeError
from changelake.lake import api
from changelake.lake.catalog import Lake

ORDERS = StructType([StructField("id", LongType()), StructField("item", StringType()),
                     StructField("qty", LongType())])
EVENTS_1 = StructType([StructField("kind", StringType()), StructField("n", LongType())])
EVENTS_2 = StructType([StructField("kind", StringType()), StructField("note", StringType())])
META = [StructField("_time", LongType()), StructField("_diff", LongType())]

TIMES = {"orders": [4, 5, 12, 15, 25, 30], "events": [0, 9, 10, 19, 20]}


def build(lake: Lake, orders: str = "shop.orders", events: str = "events") -> None:
    """Make the two tables (names as given) on `lake`."""
    spark = lake.spark

    def frame(schema: StructType, rows: list[tuple]) -> DataFrame:
        return spark.createDataFrame(rows, StructType([*schema.fields, *META]))

    table = lake.create_table(orders, ORDERS, key=["id"], buckets=2)
    table.commit(frame(ORDERS, [(1, "apple", 1, 2, 1), (2, "pear", 2, 3, 1),
                                (3, "plum", None, 5, 1)]), 0, 10)
    table.commit(frame(ORDERS, [(1, "apple", 1, 12, -1), (1, "apple", 5, 12, 1),
                                (2, "pear", 2, 15, -1), (4, "fig", 4, 18, 1)]), 10, 20)
    api.compact(lake, orders, since=5)
    table.commit(frame(ORDERS, [(3, "plum", None, 25, -1), (3, "plum", 7, 25, 1)]), 20, 30)

    table = lake.create_table(events, EVENTS_1, buckets=2)
    table.commit(frame(EVENTS_1, [("x", 1, 1, 2), ("y", 2, 4, 1)]), 0, 10)
    table.commit(frame(EVENTS_2, [("z", "new", 12, 1), ("x", None, 19, -1)]), 10, 20)


def as_of_answers(lake: Lake, tables: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per table (`tables`: role in TIMES -> name) and time: the rows of `snapshot --as-of`
    (`api.snapshot`), or {"error": its message}."""
    result: dict[str, dict[str, Any]] = {}
    for role, times in TIMES.items():
        table = tables[role]
        answers: dict[str, Any] = {}
        for t in times:
            try:
                answers[str(t)] = list(api.snapshot(lake, table, as_of=t))
            except ChangelakeError as error:
                answers[str(t)] = {"error": str(error)}
        result[table] = answers
    return result


def main(lake_dir: str) -> None:
    lake = api.open_lake(lake_dir, master="local[1]")
    build(lake)
    result = {"as_of": as_of_answers(lake, {"orders": "shop.orders", "events": "events"}),
              "now": {"shop.orders": list(api.snapshot(lake, "shop.orders"))}}
    lake.spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
