"""Step 6, progress: the Debezium frontier from aggregates; one row reaches the driver.

The rule is `convert.progress.frontier_from` (see `DebeziumProgress`), evaluated over the whole
batch as the Python path does:

* `high`: the highest time a change brings with it (`Change.time`, the parser's: snapshot rows
  have none); no such change: frontier 0;
* each transaction with metadata (`transaction.total_order`): its time is the least of its
  changes', its count the number of distinct `total_order`s (a replay counts once), and its
  expected count the `event_count` of its first END (in reading order), or, when that END
  lists `data_collections`, the count of the batch's table (the table of its changes);
* frontier = the least time of an incomplete transaction, capped at `high`; when it is `high`
  and every transaction at `high` is complete, `high + 1`;
* a transaction before `since` (the table's committed frontier) counts for nothing: the table
  holds it whole, and the encoder forgets a transaction once its frontier passes it
  (`DebeziumProgress.frontier`: a replay of one is a duplicate). A read that resumes from the
  offsets a commit recorded may meet one again, re-sent by a connector restart, without its
  END or some of its events (those are before the resume offsets): counted, it would look
  incomplete and hold the frontier below the committed one on every run from then on.

`frontier_from` folds over transactions on the driver; here the fold is three aggregates over
the join of transactions and ENDs, so the number of transactions does not reach the driver.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from changelake.spark.settings import NOT_ADAPTIVE, settings


def debezium_frontier(changes: DataFrame, items: DataFrame, high: int | None,
                      metadata: bool, table: str | None = None, since: int | None = None
                      ) -> int:
    """`changes`: timed change rows (`time`, `tx`, `tx_order`); `items`: every parsed line
    (for the ENDs); `high`: the highest parser time; `metadata`: some line is a transaction
    event or carries `total_order` (else the high water alone decides); `table`: the table of
    the batch's changes (one at most); `since`: the table's committed frontier, before which
    no transaction holds anything back (see the module docstring)."""
    if high is None:
        return 0
    if not metadata:
        return high
    txs = (changes.where(F.col("tx_order").isNotNull() & F.col("tx").isNotNull())
           .groupBy("tx").agg(F.min("time").alias("t"),
                              F.countDistinct("tx_order").alias("seen")))
    if since is not None:  # its END, if read, then joins no time: it holds nothing back
        txs = txs.where(F.col("t") >= since)
    end = F.min_by(F.struct("end_count", "end_collections"),
                   F.struct("file_index", "block", "row"))
    ends = (items.where(F.col("kind") == "END").groupBy("tx").agg(end.alias("end"))
            .select("tx", _expected(F.col("end"), table).alias("expected")))
    joined = txs.join(ends, "tx", "full_outer")
    complete = F.col("expected").isNotNull() & (F.coalesce("seen", F.lit(0)) >= F.col("expected"))
    return held_frontier(joined, F.col("t"), complete, high)


def held_frontier(txs: DataFrame, time: Column, complete: Column, high: int) -> int:
    """The frontier a changefeed's transactions allow (`convert.progress.frontier_from`'s
    rule, as one aggregate on the executors): the least time of a transaction not complete
    holds it there, else it is `high`, and `high + 1` once every transaction at `high` is
    complete. `txs` has a row per transaction, `time` its time (null: not known yet) and
    `complete` whether all its counted events are in."""
    at_high = time == F.lit(high)
    # One job: adaptive execution would run each of the query's stages as a job of its own,
    # five for a handful of rows in a follow's round (benchmarks/README.md, "a round's small
    # queries in one job each").
    with settings(txs.sparkSession, NOT_ADAPTIVE):
        row = txs.agg(
            F.min(F.when(time.isNotNull() & ~complete, time)).alias("held"),
            F.count(F.when(at_high, 1)).alias("at_high"),
            F.count(F.when(at_high & complete, 1)).alias("complete_at_high")).first()
    frontier = high if row["held"] is None else min(high, row["held"])
    if row["at_high"] and row["at_high"] == row["complete_at_high"] and frontier == high:
        frontier = high + 1
    return int(frontier)


def _expected(end: Column, table: str | None) -> Column:
    """END's count of the table's events: its `data_collections` entry for `table` when it
    lists one, else its `event_count` (`DebeziumProgress`'s rule)."""
    if table is None:
        return end["end_count"]
    mine = F.filter(end["end_collections"], lambda c: c["data_collection"] == F.lit(table))
    return F.coalesce(F.get(mine, 0)["event_count"], end["end_count"])
