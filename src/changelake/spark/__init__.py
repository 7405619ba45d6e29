"""CDCv2 on Spark: the data-parallel decode and encode, and the `materialize-cdc` data source.

What users import:

    from changelake.spark import build_session, decode, encode, register, split_messages

* `decode(updates, progress, since=...)`: the Reader's result over DataFrames (`Decoded`).
* `encode(changes, finished_through, since=...)`: the Writer's messages as a DataFrame.
* `register(spark)`: makes `spark.read.format("materialize-cdc")` (files) and
  `spark.read.format("kafka-cdc")` (topics) available, batch and streaming.
* `split_messages(messages)`: a messages DataFrame (one message per row) into decode's input.
* `messages_from_records(records, schema=...)`: Kafka records from any reader (Spark's own
  `kafka` source, or `kafka-cdc` with `output=records`) into `kafka-cdc`'s message rows.
* `build_session(...)`: a SparkSession with the project's defaults. Library functions take the
  session, or DataFrames, as arguments; the few that build one when none is given say so
  (`lake.api.open_lake` without `spark`, `decode_files.decode_with_spark`).

The modules, one job each: `decoder` and `encoder` (the two directions of the protocol over
DataFrames), `source` and `kafka_source` (the data sources of files and of Kafka topics),
`kafka_records` (records of any Kafka reader into messages), `kafka_set_aside` (the records
a lenient `kafka-cdc` read set aside: counted, named, sent to a dead-letter topic),
`stream` (decoding a growing log with Structured Streaming), `decode_files` (`changelake
decode --engine spark`), `session` (building a SparkSession), `settings` (its defaults, and
SQL settings for a block), `checkpoint` (a plan run once and its result kept: `stored`,
`kept_shuffle`), `errors` (input errors from the executors),
`expressions` (column expressions built once per JVM), `driver_rows` (a few driver rows as a
DataFrame the JVM reads, no Python worker), `json_schema` (Spark's JSON inference over a column,
in the JVM), `jvm` (the project's Java classes), and
`changefeed/` (Debezium and YDB feeds into CDCv2 updates, a module a step;
`changefeed/python_path/` is the Python path it hands what it does not cover to).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from changelake.spark import kafka_source, source
from changelake.spark.decoder import Decoded, decode, split_messages
from changelake.spark.encoder import encode, messages_schema, to_messages
from changelake.spark.kafka_records import messages_from_records
from changelake.spark.session import build_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "Decoded",
    "build_session",
    "decode",
    "encode",
    "messages_from_records",
    "messages_schema",
    "register",
    "split_messages",
    "to_messages",
]


def register(spark: SparkSession) -> None:
    """Make the `materialize-cdc` and `kafka-cdc` formats available in this session."""
    source.register(spark)
    kafka_source.register(spark)
