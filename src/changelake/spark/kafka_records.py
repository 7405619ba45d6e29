"""Kafka records into Materialize CDC message rows, whichever reader fetched them.

The promise: `messages_from_records` turns a DataFrame of Kafka records in the columns of
Spark's own `kafka` source (`topic`, `partition`, `offset`, `value`; others are ignored) into
exactly the rows `spark.read.format("kafka-cdc")` gives for the same records (the
`materialize-cdc` shape: `updates` or `progress`, `_file` = `topic T partition P`, `_offset`,
`_error` when lenient). So a user whose Spark has the built-in `kafka` connector reads with it
and hands the records here, and `split_messages`, `decode` and the lake's ingest cannot tell
the two apart; `kafka-cdc` with `output=records` gives the same columns without the connector.

The decoding is the `kafka-cdc` reader's own (`kafka_source.RecordDecoder`), run on the
executors, a partition of records at a time: Confluent-framed and single-object Avro, the
frame's schema by id (0: the given schema; others: the registry) or fingerprint, every frame's
row schema equal to the rows' type. A bad record fails the job with one line naming topic,
partition and offset (`spark.errors.translate_errors` brings it to the driver as an
`InputError`), or with `lenient` becomes an `_error` row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from changelake.errors import ChangelakeError, SchemaError
from changelake.formats.materialize import CdcSchema, load_schema
from changelake.spark.errors import INPUT_ERROR_MARK
from changelake.spark.kafka_source import NAME, KafkaOptions, RecordDecoder
from changelake.spark.source import data_type_of, message_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RECORD_COLUMNS = ("topic", "partition", "offset", "value")


def messages_from_records(records: DataFrame, *, schema: CdcSchema | Path | str | None = None,
                          schema_registry: str | None = None, topic: str | None = None,
                          lenient: bool = False) -> DataFrame:
    """The records' messages (see the module docstring). `schema` (a `CdcSchema` or the path of
    its file) decodes frames of schema id 0 and types the rows; without it the rows are typed
    by the registry's latest schema of `topic`'s subject `<topic>-value`."""
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise SchemaError(f"Kafka records need the columns {', '.join(RECORD_COLUMNS)} (as "
                          f"Spark's kafka source gives them); missing: {', '.join(missing)}")
    given = load_schema(Path(schema)) if isinstance(schema, str | Path) else schema
    if given is None and (schema_registry is None or topic is None):
        raise SchemaError("decoding Kafka records needs the rows' schema: a schema, or a "
                          "schema registry and the topic whose subject holds it")
    try:
        options = KafkaOptions(
            bootstrap="", topics=(topic,) if topic else ("",), starting="earliest",
            ending="latest",
            avro_schema=orjson.dumps(given.avro).decode() if given is not None else None,
            registry=schema_registry, lenient=lenient, config=(), max_records=None).resolved()
    except ValueError as error:  # the registry has no such subject
        raise SchemaError(str(error).removeprefix(f"{NAME}: ")) from None
    data_type, _ = data_type_of(options.rows())

    def decode(rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        decoder = RecordDecoder(options)
        try:
            for row in rows:
                value = row["value"]
                yield decoder.row(row["topic"], row["partition"], row["offset"],
                                  None if value is None else bytes(value))
        except ChangelakeError as error:
            raise RuntimeError(f"{INPUT_ERROR_MARK}<<{error}>>") from None

    decoded = records.select(*RECORD_COLUMNS).rdd.mapPartitions(decode)
    return records.sparkSession.createDataFrame(decoded, message_type(data_type))


CONFLUENT_HEADER_ID0 = "X'0000000000'"
"""A Confluent frame's 5-byte header (magic byte 0, schema id 0, big-endian) as a SQL literal."""


def messages_from_avro(records: DataFrame, schema: CdcSchema | Path | str) -> DataFrame:
    """The records' messages, decoded in the JVM by spark-avro's `from_avro` (the session
    needs `spark-avro`: `spark.maven.KAFKA_ARTIFACTS`): each value a Confluent frame of
    schema id 0 whose body is the Materialize CDC union `schema` writes, the 5-byte header
    stripped by `substring(value, 6)`. The same rows as `messages_from_records` for such
    records, never leaving the JVM; a record that is not such a frame (another schema id,
    a single-object frame, a tombstone, corrupt Avro) fails the job naming topic, partition
    and offset (`spark.errors.translate_errors` makes it an `InputError`): those take
    `messages_from_records`, which finds schemas by id and fingerprint."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    given = load_schema(Path(schema)) if isinstance(schema, str | Path) else schema
    data_type, _ = data_type_of(given)
    target = message_type(data_type)
    # spark-avro's deserializer takes a record at the root, not the CDC union ("Attempting to
    # treat union[array, progress] as a RECORD"); a record of one field is encoded as that
    # field alone, so the same bytes read as a record whose one field is the union
    envelope = {"type": "record", "name": "envelope", "namespace": "changelake",
                "fields": [{"name": "message", "type": given.avro}]}
    body = from_avro(F.expr("substring(value, 6)"), orjson.dumps(envelope).decode(),
                     {"mode": "PERMISSIVE"})
    framed = F.expr(f"value IS NOT NULL AND substring(value, 1, 5) = {CONFLUENT_HEADER_ID0}")
    where = F.concat(F.lit("topic "), F.col("topic"), F.lit(" partition "),
                     F.col("partition").cast("string"), F.lit(", offset "),
                     F.col("offset").cast("string"))
    bad = F.raise_error(F.concat(F.lit(f"{INPUT_ERROR_MARK}<<"), where, F.lit(
        ": not a Confluent frame of schema id 0 holding a Materialize CDC message "
        "(spark-avro's from_avro reads only those; the reader kafka-cdc also reads "
        "single-object frames)>>")))
    checked = records.select(
        F.when(framed, body).alias("_m"), "topic", "partition", "offset")
    checked = checked.select(
        F.when(F.col("_m").isNull() | F.col("_m.message").isNull(),
               bad.cast(checked.schema["_m"].dataType))
        .otherwise(F.col("_m")).alias("_m"), "topic", "partition", "offset")
    rows = checked.select(
        F.col("_m.message.member0").alias("updates"),
        F.col("_m.message.member1").alias("progress"),
        F.concat(F.lit("topic "), F.col("topic"), F.lit(" partition "),
                 F.col("partition").cast("string")).alias("_file"),
        F.lit(None).cast("long").alias("_line"), F.col("offset").alias("_offset"),
        F.lit(None).cast("string").alias("_error"))
    got = [f.dataType.simpleString() for f in rows.schema.fields]
    want = [f.dataType.simpleString() for f in target.fields]
    if got != want:
        raise SchemaError(f"from_avro types the schema's rows as {got[0]}, changelake as "
                          f"{want[0]}: decode with messages_from_records")
    return rows.select(*(F.col(f.name).cast(f.dataType) for f in target.fields))


__all__ = ["RECORD_COLUMNS", "messages_from_avro", "messages_from_records"]
