"""The Spark settings of this project: the defaults a session starts with (`DEFAULT_CONF`,
and `LOCAL_CONF` for a local one; `spark.session.build_session` applies them), and
`settings`, the session's SQL settings changed for the length of a block (`NOT_ADAPTIVE`), for
what Spark reads when it plans a query.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SERIALIZER = "org.apache.spark.serializer.KryoSerializer"
"""Spark's serializer for the blocks it stores and the objects it sends (not the shuffles'
rows, which have their own). A changefeed batch is checkpointed on disk (`stored`) two or three
times, each as big as the batch, and with Java's serialization (Spark's default) writing and
reading those blocks was a share of each step's task time in a profile of a Debezium ingest.
With Kryo the parse and conversion jobs took less executor CPU time (`bench_ingest.py` with
Spark's event log: benchmarks/README.md, "The floor of a keyed conversion", 2026-11-27)."""

LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # Spark sums the checksums where either is on (`ShuffleExchangeExec`): both off.
    "spark.sql.shuffle.orderIndependentChecksum.enabled": "false",
    "spark.sql.shuffle.orderIndependentChecksum.enableFullRetryOnMismatch": "false",
    "spark.python.unix.domain.socket.enabled": "true",
}
"""A local session's defaults besides `DEFAULT_CONF`: loopback only, Unix domain sockets
between Python and the JVM, and no row checksums of the shuffles' map output.

Over loopback TCP, a local iterator's exchange (`toLocalIterator`: Python asks for a
partition, the JVM answers with it and then a short end marker) stalls once a partition
until Python's delayed acknowledgement lets the JVM's socket send the marker (Nagle's
algorithm); a Unix domain socket has neither, and the statements of a `decode` are read in
half the time (benchmarks/README.md, "Spark decode", 2026-12-04).

Without row checksums: Spark 4.3 sums a checksum of every row a shuffle writes, to tell
a retried map task that wrote other rows (a nondeterministic stage) and retry the stages
after it; a local session's one executor is the driver, whose shuffle files no other
executor fetches, so it loses none to retry. The checksums were a share of the task time
of a YDB conversion's map side (a Flight Recorder profile: benchmarks/README.md, "Fewer
decimals, no row checksums, lighter YDB items")."""

DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "8",
    "spark.default.parallelism": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # Python workers hand a Python writer (the materialize-cdc and kafka-cdc sinks) each
    # timestamp as a datetime in their local time without an offset: in UTC, which has no
    # hour that happens twice, it is the instant exactly (not so in New York's November).
    "spark.executorEnv.TZ": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.serializer": SERIALIZER,
    # Jobs that a thread submits in a pool of its own (`lake/current_follower.py`) share the
    # cores with the writer's instead of holding them until they finish (FIFO); jobs of one
    # pool still run first come, first served.
    "spark.scheduler.mode": "FAIR",
    # Spark keeps the classes it compiles for generated code (keyed by their source) in a
    # cache of 100 by default. A follow's round plans about twenty queries of its own and
    # Delta's, whose stages and tasks make more distinct classes than that, so each round
    # compiled most of them again: a fifth of the process's CPU samples were Janino's at
    # 1,000 transactions a second (benchmarks/README.md, "Generated code compiled once").
    # Bounded all the same: a long follow's cache stops at this many classes.
    "spark.sql.codegen.cache.maxEntries": "1000",
}


UNKNOWN_SIZE = 2**50
"""A plan's size estimate this large means no estimate (Spark's default is the largest long):
the input's size is not known before it is read."""


NOT_ADAPTIVE = {"spark.sql.adaptive.enabled": "false"}
"""The `settings` a plan is made with where adaptive execution must not run it: its shuffles
then keep the partitions asked for, the plan reports its partitioning, and each stage is not
a job of its own."""


@contextmanager
def settings(spark: SparkSession, values: Mapping[str, str]) -> Iterator[None]:
    """The session's SQL settings `values` for the length of a block, then the earlier ones
    again (a setting unset before is unset again). For what Spark reads when it plans, caches
    or checkpoints a query, so that only the plans made inside the block are affected."""
    conf = spark.conf
    previous = {key: conf.get(key, None) for key in values}
    for key, value in values.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)
