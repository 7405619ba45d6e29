"""The Spark path's Debezium frontier (`spark.changefeed.progress`): the encoder's rule on a
few transactions, in one Spark job."""

from __future__ import annotations

from changelake.convert.progress import frontier_from
from changelake.spark.changefeed.progress import debezium_frontier

CHANGES = "time long, tx string, tx_order long"
ITEMS = ("kind string, tx string, end_count long, "
         "end_collections array<struct<data_collection:string,event_count:long>>, "
         "file_index int, block long, row long")


def test_the_frontier_is_the_rule_in_one_job(spark) -> None:
    """Transaction a complete at 10, b at 12 with one of its two events, c at 13 complete
    but listing another table's count: the frontier is b's time, as `frontier_from` says. Its
    aggregate (two aggregates, a full outer join and the fold, `held_frontier`) runs as one
    job: a follow computes it every round, and adaptive execution made each of its stages a
    job of its own (five)."""
    changes = spark.createDataFrame(
        [(10, "a", 0), (10, "a", 1), (12, "b", 0), (13, "c", 0), (14, None, None)], CHANGES)
    items = spark.createDataFrame([
        ("END", "a", 2, None, 0, 0, 3), ("END", "b", 2, None, 0, 0, 5),
        ("END", "c", 4, [("shop.other", 3), ("shop.t", 1)], 0, 0, 7),
        ("END", "b", 9, None, 0, 0, 9),  # a replayed END: the first one read counts
    ], ITEMS)
    context = spark.sparkContext
    context.setJobGroup("frontier-one-job", "frontier-one-job")
    try:
        frontier = debezium_frontier(changes, items, 14, True, "shop.t")
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert frontier == frontier_from(14, [(10, 2, 2), (12, 1, 2), (13, 1, 1)]) == 12
    assert len(context.statusTracker().getJobIdsForGroup("frontier-one-job")) == 1
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
