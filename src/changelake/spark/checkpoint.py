"""A frame's plan run once and its result kept for the steps after it: `stored` (rows
checkpointed on the executors' local disk) and `kept_shuffle` (a shuffle's map side run once),
each by the project's Java (`spark.jvm`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from changelake.spark.settings import NOT_ADAPTIVE, settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def stored(frame: DataFrame) -> DataFrame:
    """`frame` checkpointed on the executors' local disk (DISK_ONLY), not in the heap: its
    plan runs once, in one job that also makes its observations, and never again.

    A changefeed batch is checkpointed more than once (its parsed lines, its keyed events, its
    updates), each as big as the batch. Held in the heap, they leave less of it to the sorts,
    which then spill more. On disk (mostly the page cache) they took no more time at 1.1M
    events, and less at 11M (benchmarks/README.md, "Checkpoints on disk, driver memory
    measured apart").

    The rows are stored as chunks of their bytes (`StoredRows.java`), where Spark's
    `localCheckpoint` stores each row as an object of its own, serialized one by one: measured
    apart, both the store and the read back are faster (`benchmarks/bench_stored.py`;
    benchmarks/README.md, "The parse's checkpoint measured, and stored as chunks of row
    bytes"). The stored frame keeps none of the plan's partitioning, ordering or size
    estimate, which `localCheckpoint`'s keeps (see `StoredRows.java`)."""
    from pyspark.sql import DataFrame

    from changelake.spark.jvm import java_class

    chunks = java_class(frame.sparkSession, STORED_ROWS_CLASS)
    return DataFrame(chunks.store(frame._jdf), frame.sparkSession)


STORED_ROWS_CLASS = "changelake.jvm.StoredRows"


def kept_shuffle(frame: DataFrame) -> DataFrame:
    """`frame`, whose plan ends in a shuffle (a `repartition` by columns), with the shuffle's
    map side run once, by one job that also makes the plan's observations; the frame returned
    reads the shuffle's files and says it is partitioned as the shuffle made it, so a later
    step that needs those partitions shuffles nothing (`KeptShuffle.java`). Planned without
    adaptive execution, so that the shuffle keeps the partitions asked for."""
    from pyspark.sql import DataFrame

    from changelake.spark.jvm import java_class

    keeper = java_class(frame.sparkSession, KEPT_SHUFFLE_CLASS)
    with settings(frame.sparkSession, NOT_ADAPTIVE):
        return DataFrame(keeper.keep(frame._jdf), frame.sparkSession)


KEPT_SHUFFLE_CLASS = "changelake.jvm.KeptShuffle"
