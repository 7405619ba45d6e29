"""`kafka-cdc`: a Python Data Source for Kafka topics of Materialize CDC messages, batch and
streaming, read on the executors.

This reads through confluent-kafka (librdkafka). Spark's own Kafka connector
(`spark-sql-kafka-0-10`, which the setup fetches: `spark.maven.KAFKA_ARTIFACTS`) reads the same
records as the ingest's `reader="kafka"` (`lake.kafka_ingest.connector_records`, its records
decoded by `kafka_records.messages_from_records`): offsets, partitions, `failOnDataLoss`,
read-committed and SASL/SSL settings as `kafka.*` options all do the job there. `kafka-cdc`
stays the default reader, and the only one, for what the connector does not do here:

* decode frames the JVM cannot: single-object Avro and registry schema ids, decoded where
  they are read; after the connector those cross to a Python UDF, about twice kafka-cdc's
  time (`benchmarks/bench_kafka_readers.py`, benchmarks/README.md). A topic of schema-id-0
  frames is another matter: the connector's records decoded by spark-avro's `from_avro`
  (`kafka_records.messages_from_avro`, what `reader="kafka"` does with a schema and no
  registry) took 0.57x kafka-cdc's time;
* `lenient` (records set aside as `_error` rows, the dead-letter topic) and the streaming
  source of `ingest --follow --kafka` (its `lossReport`, `maxRecordsPerTrigger`), which the
  ingest wires to this source only;
* librdkafka's settings: any `kafka.*` librdkafka takes, and every security setting, which
  the connector gets only where a Java client's equivalent exists
  (`kafka.security.java_config`); and librdkafka's mock cluster (`kafka.MockCluster`), which
  the Java clients cannot use (their admin client's `listNodes` times out), so the fast tests;
* no JVM libraries: a session without the fetched jars still reads Kafka.

The driver plans only: one metadata call per topic and one
watermark call per partition give each partition's offsets; each input partition is one
topic-partition's range `[start, end)`, read on an executor by its own consumer (a
`kafka.source.TopicReader` assigned to that range, no consumer group) and decoded there with
the codecs of `formats.materialize` (Confluent-framed or single-object Avro, the schema of each
frame found by id or fingerprint, see `kafka.schemas`).

A row is one message with exactly the `materialize-cdc` source's shape (`source.message_type`):
`updates` or `progress`, `_file` = `topic T partition P`, `_offset` = the record's offset,
`_line` null, and in lenient mode `_error` for a record set aside (both message columns null).
So `split_messages`, `decode` and the lake's ingest take either source's rows alike.

Options:

* `kafka.bootstrap.servers` (or `bootstrap`): the cluster; `topics`: a comma list.
* `startingOffsets` (`earliest`) and `endingOffsets` (`latest`, batch only): `earliest`,
  `latest`, or JSON `{"topic": {"0": 12, ...}}` (-2 is earliest, -1 latest; a partition not
  named takes `earliest` as its start, `latest` as its end). An offset outside what the
  partition holds is an error naming it: records were deleted, or the topic was recreated.
* `schema` (path of the Avro schema) or `avroSchema` (its JSON text): decodes frames with
  schema id 0 and single-object frames, and types the rows. `schemaRegistry` (URL) decodes the
  other ids; without a schema option the rows are typed by the latest schema of the first
  topic's subject `<topic>-value`. Every frame's row schema must equal the rows' type: a frame
  of another is an error (strict) or set aside (lenient) naming its record.
* `lenient` (`false`): set undecodable records aside in `_error` rows instead of failing.
* `output` (`messages`): `records` gives the records undecoded, in the columns of Spark's own
  `kafka` source (`RECORDS_SCHEMA`; no schema option needed), for
  `kafka_records.messages_from_records`, which decodes either source's records alike.
* `maxRecordsPerTrigger` (streaming): at most this many records per micro-batch, shared fairly
  among the partitions that have new records.
* `failOnDataLoss` (`true`; `true` or `false`, any case), as Spark's own Kafka source: records
  the query has not read are gone (see "Lost records" below). `true` fails the query naming
  topic, partition and offsets; `false` logs a warning naming the same and goes on from the
  partition's first offset still held.
* `lossReport` (with `failOnDataLoss=false`): a file on the driver's host (`LossReport` makes
  it) where each data-loss warning is also written, one line, for the process that runs the
  query to show: the planner runs in a Python process the driver's JVM starts, whose log is
  neither that process's nor its terminal.
* `kafka.*`: other librdkafka settings, passed to every consumer; not
  `kafka.auto.offset.reset` (refused, as Spark's source refuses it: `startingOffsets` says
  where a read starts, `failOnDataLoss` what happens when its records are gone). Options are
  shown by Spark (plans, the UI): no secrets here.
* `securityFile`: a file of this user's on the driver's host holding librdkafka security
  settings (`kafka.security.shared_file`: a command's `--kafka-conf`/`--kafka-config`, which
  `reader_options` names). The planner reads it on the driver; the settings reach the
  executors inside the reader Spark sends them, under every `kafka.*` option, and are never
  an option themselves (`KafkaOptions.security`, left out of its `repr`).

Strict mode: a bad record (not a frame, unknown schema id, corrupt Avro, a tombstone) fails the
job with one line naming topic, partition and offset (`spark.errors.translate_errors` brings it
back to the driver as an `InputError`).

Streaming offsets are `{"topic": {"partition": next offset}}`: the first micro-batch starts at
`startingOffsets` (earliest by default), each later one where the previous one ended; the end
is each partition's high watermark when the batch is planned (the last stable offset on a
read-committed cluster), capped by `maxRecordsPerTrigger`. With `availableNow`, the watermarks
when the query starts are the target. The offsets live in the query's checkpoint, so a
restarted query reads only what it has not committed.

Lost records. A query restarted from its checkpoint (or a long one between two micro-batches)
can find a partition no longer holding the offset it was at: below the partition's first
offset (retention or DeleteRecords removed records the query never read), or beyond its end
(the topic was deleted and recreated, or truncated; a partition gone altogether: recreated with
fewer partitions), or a partition added to a topic since the last batch already missing its
first records (it starts at 0 for the query). Planning checks every partition against its
watermarks, in `latestOffset` (the offset the query was at) and in `partitions` (the
micro-batch's range, also when Spark replays a batch logged before a restart without asking
`latestOffset`): a start outside `[first, end]` or a range end beyond the end is data loss,
an error with `failOnDataLoss` (`_fail`, one line: topic, partition, the offset the query was
at, the partition's first offset and end, and which rule), else a warning and the partition
goes on from its first offset (deleted: the records left; recreated: the new topic's records
from its beginning, since the old offsets name nothing in it). A reset written into the
offsets this way is an end below the start, which `partitions` reads as "from the first
offset"; a replayed batch whose start is beyond the end reads nothing of that partition (the
next one starts it afresh), so nothing is read twice.

Each loss is warned of once (the planner remembers its warnings; `latestOffset` and
`partitions` see the same loss of a micro-batch), in the log and, with `lossReport`, in that
file, which `LossReport.drain` (the follow, between and in its micro-batches) turns into lines
for the user, each line once.

The executors check again, for records deleted between planning and reading: their consumers
run with `auto.offset.reset=error`, so librdkafka reports an offset the partition does not
hold (`kafka.source.OffsetOutOfRange`) instead of silently resetting to the beginning or the
end, and the same rule applies (fail, or warn and go on from the first offset held; the warning
reaches `lossReport` where the executor shares the driver's file system, as in local mode, and
only the executor's log elsewhere, as with Spark's own source). A record
offset *above* the planned start is not checked: compaction removes records (the first one
read may be past the start) and transaction markers take offsets no record has, so only a
reported reset, or a record *below* the next offset wanted (read from the wrong place) fails.
A topic recreated and refilled past the query's offset between two batches cannot be told
from new records (Spark's own source cannot either).
"""

from __future__ import annotations

from changelake.spark.kafka_source.options import (
    EARLIEST,
    LATEST,
    NAME,
    RECORDS_SCHEMA,
    KafkaOptions,
    Offsets,
    reader_options,
)
from changelake.spark.kafka_source.plan import (
    KafkaRange,
    LossReport,
    Watermarks,
    lost_records,
    plan_batch,
    report_loss,
    watermarks,
)
from changelake.spark.kafka_source.read import (
    KafkaCdcReader,
    RecordDecoder,
    frame_key,
    read_partition,
    read_range,
)
from changelake.spark.kafka_source.source import (
    KafkaCdcDataSource,
    register,
)
from changelake.spark.kafka_source.stream import (
    KafkaCdcStreamReader,
    share,
)

__all__ = [
    "EARLIEST",
    "LATEST",
    "NAME",
    "RECORDS_SCHEMA",
    "KafkaCdcDataSource",
    "KafkaCdcReader",
    "KafkaCdcStreamReader",
    "KafkaOptions",
    "KafkaRange",
    "LossReport",
    "Offsets",
    "RecordDecoder",
    "Watermarks",
    "frame_key",
    "lost_records",
    "plan_batch",
    "read_partition",
    "read_range",
    "reader_options",
    "register",
    "report_loss",
    "share",
    "watermarks",
]
