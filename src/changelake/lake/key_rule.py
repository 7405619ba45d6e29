"""One row per key: the rule a commit to a keyed table is checked by, before anything is written.

A keyed table is read (`sql.py`, `arrow.py`) by taking, per key, its update at the latest
time, an insertion before a retraction at that time. That answer is exact, and the same on
every engine, only if a key's updates at one time are at most one retraction (of the row it
had) and at most one insertion (of the row it has after), each of diff -1 or +1. A log that
breaks this describes a relation in which the key is not one: a row inserted with diff 2 (the
row twice), two different rows inserted for a key at one time. Read as a keyed table it would
show one row where the log has two, and which one would depend on the engine. So such a commit
is refused, naming the key, the time and, where the input says, the file and line (or topic,
partition and offset) of one of the updates, with nothing written.

What is not checked, because the reading above gives it one answer: that a retraction
retracts the row the key had (after a column was added, a retraction need not match the
older row exactly), and that an insertion finds its key absent (the latest version wins: an
upsert). Checking those would need the table's current rows at every commit.

The check is one aggregate by key and time over the commit's updates: `commit_input` makes it
before a missing table is created (so a refused input leaves no table), `TableWriter.commit`
for any other caller. Updates built one per key and time skip it (`check_key=False`): a
changefeed's conversion, which derives each key's retraction from its previous row, and a
PostgreSQL capture's changes, made from each key's current row (its snapshot is checked: a
table keyed by `REPLICA IDENTITY FULL` may hold a row twice).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from changelake.errors import LakeError, Location
from changelake.lake.arrow import plain
from changelake.spark.expressions import quote
from changelake.spark.instants import with_instants
from changelake.values import json_safe

Locate = Callable[[dict[str, Any], int, int], Location | None]
"""locate(key values by column, time, sign of the diff): where in the input one update of
that key at that time with a diff of that sign sits, if the input says. A timestamp among the
values is its UTC instant."""

class KeyRuleError(LakeError):
    """A commit that would give a key of a keyed table two rows (the module docstring)."""


RULE = ("a keyed table holds one row per key: a key's updates at one time are at most one "
        "retraction and one insertion, of diff -1 and +1")


def check_one_row_per_key(rows: DataFrame, key: Sequence[str], table: str,
                          locate: Locate | None = None) -> None:
    """Raise a `KeyRuleError` naming the earliest (time, key) of `rows` (the table's columns,
    `_time`, `_diff`; no zero diffs) that breaks the rule (module docstring). When none does,
    that is one query: the aggregate, and the first of what breaks (none); the count of the
    others, and `locate`, run only on the way to the error."""
    columns = [F.col(quote(c)) for c in key]
    broken = rows.groupBy(*columns, "_time").agg(
        F.expr("count_if(_diff > 0)").alias("_inserted"),
        F.expr("count_if(_diff < 0)").alias("_retracted"),
        F.min("_diff").alias("_least"),
        F.max("_diff").alias("_most"),
    ).where("_inserted > 1 OR _retracted > 1 OR _most > 1 OR _least < -1")
    earliest, instants = with_instants(broken.orderBy("_time", *columns).limit(1))
    first = earliest.collect()
    if not first:
        return
    found = instants(first[0].asDict(recursive=True))  # a timestamp as its UTC instant
    if found["_most"] > 1:
        what, sign = f"an insertion with diff {found['_most']}", 1
    elif found["_least"] < -1:
        what, sign = f"a retraction with diff {found['_least']}", -1
    elif found["_inserted"] > 1:
        what, sign = f"{found['_inserted']} insertions", 1
    else:
        what, sign = f"{found['_retracted']} retractions", -1
    values = {c: found[c] for c in key}
    time = found["_time"]
    shown = ", ".join(f"{c}={orjson.dumps(json_safe(plain(v))).decode()}"
                      for c, v in values.items())
    others = broken.count() - 1  # only on the way to the error
    more = f" (and {others} more (key, time) pair{'s' if others > 1 else ''})" if others else ""
    raise KeyRuleError(
        f"table {table}: key ({shown}) has {what} at time {time}{more}; {RULE}. "
        "Nothing was written",
        locate(values, time, sign) if locate is not None else None,
    )
