"""Data-parallel CDCv2 encoding: the Writer's messages, computed over a DataFrame of changes.

`protocol.Writer` buffers changes until their time is finished, then emits them consolidated,
in batches, followed by one progress statement with the exact count of distinct updates at
each time. Here the changes of a whole interval `[since, finished_through]` are at hand at once,
so the same messages come from two aggregations: consolidation by `(data, time)` (sum the diffs,
drop zeros: the protocol's definition of an update) and a count per time of what is left.

The messages DataFrame mirrors the Avro union of the Materialize CDC schema: a row is either
`updates` (an array of `{data, time, diff}`, at most `batch_size` long) or `progress`
(`{lower, upper, counts}`), the other column being null. `to_messages` turns rows back into
protocol values, which the codecs in `changelake.formats.materialize` write as Avro OCF or JSON
lines (the `materialize-cdc` data source does that per partition).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from changelake.errors import ProtocolError
from changelake.protocol import Antichain, Message, Progress, Updates
from changelake.spark.map_grouping import groupable, restored
from changelake.values import freeze

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.types import DataType, StructType


def messages_schema(data_type: DataType) -> StructType:
    """The messages DataFrame: one of `updates` or `progress` per row."""
    from pyspark.sql.types import ArrayType, LongType, StructField, StructType

    update = StructType(
        [
            StructField("data", data_type, True),
            StructField("time", LongType(), True),
            StructField("diff", LongType(), True),
        ]
    )
    count = StructType(
        [StructField("time", LongType(), True), StructField("count", LongType(), True)]
    )
    progress = StructType(
        [
            StructField("lower", ArrayType(LongType(), True), True),
            StructField("upper", ArrayType(LongType(), True), True),
            StructField("counts", ArrayType(count, True), True),
        ]
    )
    return StructType(
        [
            StructField("updates", ArrayType(update, True), True),
            StructField("progress", progress, True),
        ]
    )


def encode(
    changes: DataFrame,
    finished_through: int | None,
    *,
    since: int = 0,
    batch_size: int = 1024,
) -> DataFrame:
    """The messages for changes at times in `[since, finished_through]` (None: closed).

    `changes` has `data` (struct), `time` and `diff` (long), not necessarily consolidated.
    Changes after `finished_through` are not yet finished and are left out: encode them with
    the next interval (`since=finished_through + 1`). A change before `since` belongs to an
    interval already written, which is the Writer's `late-change` error; it fails the job
    when the DataFrame is evaluated (the check costs nothing extra, being part of the scan).
    The result is lazy; it is evaluated twice if both its halves are consumed separately.
    """
    from pyspark.sql import functions as F

    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if since < 0:
        raise ValueError("since must be a non-negative time")
    upper: list[int] = [] if finished_through is None else [finished_through + 1]
    if upper and upper[0] < since:
        raise ProtocolError(
            "frontier-regressed",
            f"cannot finish through {finished_through}: already finished through [{since}]",
        )
    schema = messages_schema(changes.schema["data"].dataType)
    updates_type = schema["updates"].dataType
    progress_type = schema["progress"].dataType
    spark = changes.sparkSession
    if upper == [since]:  # nothing to finish: the Writer emits nothing either
        return spark.createDataFrame([], schema)

    time = F.col("time")
    checked = changes.select(
        "data",
        F.when(
            time < F.lit(since),
            F.raise_error(
                F.concat(
                    F.lit("[late-change] change at time "),
                    time.cast("string"),
                    F.lit(f" is before the interval being written, which starts at {since}"),
                )
            ),
        )
        .otherwise(time)
        .cast("long")
        .alias("time"),
        F.col("diff").cast("long").alias("diff"),
    )
    if finished_through is not None:
        checked = checked.where(F.col("time") <= F.lit(finished_through))
    # Maps in `data` grouped as their sorted entries (Spark's map grouping loses null values).
    consolidated = restored(
        groupable(checked).groupBy("data", "time")
        .agg(F.sum("diff").alias("diff"))
        .where(F.col("diff") != 0),
        checked.schema,
    )
    # Consecutive rows of one partition share a batch: monotonically_increasing_id is the
    # partition index in the upper bits and the row number in the lower 33 bits.
    batches = (
        consolidated.withColumn(
            "_batch", F.floor(F.monotonically_increasing_id() / F.lit(batch_size))
        )
        .groupBy("_batch")
        .agg(F.collect_list(F.struct("data", "time", "diff")).alias("updates"))
        .select(
            F.col("updates").cast(updates_type).alias("updates"),
            F.lit(None).cast(progress_type).alias("progress"),
        )
    )
    counts = consolidated.groupBy("time").count()
    statement = counts.agg(
        F.array_sort(F.collect_list(F.struct("time", F.col("count").cast("long")))).alias(
            "counts"
        )
    ).select(
        F.lit(None).cast(updates_type).alias("updates"),
        F.struct(
            F.array(F.lit(since).cast("long")).alias("lower"),
            F.array(*[F.lit(u).cast("long") for u in upper]).cast("array<bigint>").alias(
                "upper"
            ),
            F.col("counts"),
        )
        .cast(progress_type)
        .alias("progress"),
    )
    return batches.unionByName(statement)


def to_messages(rows: Iterable[Row], fields: Sequence[str] | None = None) -> Iterator[Message]:
    """Rows of a messages DataFrame as protocol messages (data frozen in `fields` order)."""
    for row in rows:
        updates = row["updates"]
        if updates is not None:
            yield Updates(
                [(_freeze_row(u["data"], fields), u["time"], u["diff"]) for u in updates]
            )
        else:
            p = row["progress"]
            yield Progress(
                Antichain(p["lower"]),
                Antichain(p["upper"]),
                tuple((c["time"], c["count"]) for c in p["counts"]),
            )


def _freeze_row(data: Any, fields: Sequence[str] | None) -> Any:
    """A data value as the protocol holds it: a struct Row, or JSON text (`dataAs=json`)."""
    if isinstance(data, str):
        import orjson

        data = orjson.loads(data)
    plain = data.asDict(recursive=True) if hasattr(data, "asDict") else data
    return freeze(plain, fields if fields is not None else tuple(plain))
