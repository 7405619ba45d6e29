"""Steps 2 and 3 of the Python path: the frontier, from a few aggregate rows with the encoder's
own rules (Debezium's `frontier_from` and YDB's frontier of each file's last barrier, both
restated as JVM aggregates), and YDB's barrier rule, one Python call per file
(`barrier_violations`).
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

from changelake.convert.progress import barrier_violations
from changelake.formats.change import Resolved

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def debezium_frontier(parsed: DataFrame, changes: DataFrame, since: int | None = None
                      ) -> int | None:
    """`frontier_from` over the batch's transactions (their time, distinct events and END
    count); `since`, the table's committed frontier, before which no transaction holds the
    frontier back (a replay re-sent without its first events or its END).

    The rule runs as aggregates in the JVM, as the Spark path's does
    (`spark.changefeed.progress.debezium_frontier`): one row reaches the driver, whatever the
    number of transactions (they were each collected once)."""
    from pyspark.sql import functions as F

    from changelake.spark.changefeed.progress import held_frontier

    high = changes.where(F.col("time").isNotNull()).agg(F.max("time")).first()[0]
    if high is None:
        return 0
    events = (changes.where(F.col("tx_order").isNotNull()).groupBy("tx")
              .agg(F.min("time").alias("time"), F.countDistinct("tx_order").alias("seen"),
                   F.first("tbl", ignorenulls=True).alias("tbl")))
    ends = (parsed.where(F.col("kind") == "END").groupBy("tx")
            .agg(F.first("end_count").alias("expected"),
                 F.first("end_collections").alias("collections")))
    txs = events.join(ends, "tx", "full_outer") \
        .select("time", F.coalesce("seen", F.lit(0)).alias("seen"),
                _expected(F.col("expected"), F.col("tbl"), F.col("collections"))
                .alias("expected"))
    if since is not None:
        txs = txs.where(F.col("time").isNull() | (F.col("time") >= since))
    complete = F.col("expected").isNotNull() & (F.col("seen") >= F.col("expected"))
    return held_frontier(txs, F.col("time"), complete, high)


def _expected(total: Any, table: Any, collections: Any) -> Any:
    """END's count of the transaction's events of its table (`DebeziumProgress`'s rule): its
    entry for the table in END's `[[name, count], ...]` (JSON), else END's total."""
    from pyspark.sql import functions as F

    pairs = F.from_json(collections, "array<array<string>>")
    mine = F.filter(pairs, lambda c: c[0] == table)
    return F.when(total.isNull() | table.isNull(), total) \
        .otherwise(F.coalesce(F.get(mine, 0)[1].cast("long"), total))


def ydb_frontier(parsed: DataFrame, lines: DataFrame) -> int:
    """`PartitionFrontiers.frontier` from each file's last barrier
    (`convert.progress.ydb_frontier`): 0 while some file has none, else the least of the
    files' highest barrier steps (a barrier's frontier is its position's step, and positions
    order by step first). As JVM aggregates: one row reaches the driver, whatever the number
    of files (a row a file was collected before)."""
    from pyspark.sql import functions as F

    files = lines.select("file").distinct().count()
    highest = parsed.where(F.col("kind") == "resolved").groupBy("file") \
        .agg(F.max("barrier").alias("barrier"))
    seen, low = highest.agg(F.count(F.lit(1)), F.min("barrier")).first()
    return 0 if seen < files or low is None else int(low)


def barrier_check(parsed: DataFrame, changes: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Records below their partition's last barrier: `PartitionFrontiers.check`, per file
    (`barrier_violations`)."""
    import pandas as pd

    def check(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.sort_values("line", kind="stable")
        seen: set[bytes] = set()
        items = []
        for kind, ident, item, pos, line in zip(frame["kind"], frame["ident"], frame["item"],
                                                frame["pos"], frame["line"], strict=True):
            if kind == "resolved":
                items.append((line, Resolved(pickle.loads(pos)), False))
            else:
                items.append((line, pickle.loads(item), ident in seen))
                seen.add(ident)
        bad = barrier_violations(items)
        return pd.DataFrame({
            "file": pd.Series([frame["file"].iloc[0]] * len(bad), dtype=object),
            "line": pd.Series([b[0] for b in bad], dtype="int64"),
            "error": pd.Series([b[1] for b in bad], dtype=object)})

    from pyspark.sql import functions as F

    late = (parsed.where(F.col("kind").isin("resolved", "change"))
            .groupBy("file").applyInPandas(check, "file string, line long, error string"))
    kept = changes.join(late.select("file", "line"), ["file", "line"], "left_anti")
    return kept, late
