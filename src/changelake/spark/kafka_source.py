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

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from changelake.spark.errors import INPUT_ERROR_MARK

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

NAME = "kafka-cdc"
EARLIEST = -2  # Spark's own Kafka source's codes in JSON offsets
LATEST = -1
_TIMEOUT = 30.0

Offsets = dict[str, dict[str, int]]  # topic -> partition (as text: JSON keys) -> offset
log = logging.getLogger(__name__)  # data-loss warnings (failOnDataLoss=false)
RECORDS_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
                  "timestamp timestamp, timestampType int")
"""`output=records`: the columns of Spark's own `kafka` source (without headers)."""


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("kafka-cdc")` (and `readStream`) available in this session."""
    spark.dataSource.register(KafkaCdcDataSource)


def reader_options(bootstrap: str, topics: Sequence[str], *, avro_schema: str | None = None,
                   schema_registry: str | None = None,
                   config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The options of a `kafka-cdc` read (batch or streaming) of `topics`: the cluster, the
    schema (`avro_schema`, its JSON text) and the registry, and librdkafka settings as
    `kafka.*` (text or numbers only: options reach the executors as text)."""
    from changelake.kafka.security import shared_file

    options = {"kafka.bootstrap.servers": bootstrap, "topics": ",".join(topics)}
    security = shared_file()  # the command's --kafka-conf: a file's name, not the settings
    if security is not None:
        options["securityFile"] = str(security)
    if avro_schema is not None:
        options["avroSchema"] = avro_schema
    if schema_registry is not None:
        options["schemaRegistry"] = schema_registry
    for name, value in (config or {}).items():
        if not isinstance(value, str | int | float | bool):
            from changelake.kafka.errors import TopicError

            raise TopicError(f"{NAME}: the librdkafka setting {name!r} must be text or a "
                             f"number to reach the executors, not {type(value).__name__}")
        options[f"kafka.{name}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return options


def _fail(message: str) -> ValueError:
    """A planning error: the driver reports `kafka-cdc: ...` as one line (`spark.errors`)."""
    return ValueError(f"{NAME}: {message}")


# ----------------------------------------------------------------------------- options


@dataclass(frozen=True)
class KafkaOptions:
    """What the planner and every reader task need, resolved on the driver (plain values)."""

    bootstrap: str
    topics: tuple[str, ...]
    starting: str  # "earliest", "latest" or JSON offsets
    ending: str
    avro_schema: str | None  # JSON text: frames of schema id 0, single-object frames
    registry: str | None
    lenient: bool
    config: tuple[tuple[str, str], ...]  # librdkafka settings (without the `kafka.` prefix)
    max_records: int | None
    row_schema: str | None = None  # JSON text of the schema whose rows type the DataFrame
    records: bool = False  # output=records: the records undecoded, as Spark's `kafka` gives
    fail_on_data_loss: bool = True  # records gone before they were read: fail (else warn)
    loss_report: str | None = None  # the driver's file of data-loss warnings (`LossReport`)
    # librdkafka security settings, read on the driver from the `securityFile` option
    # (`kafka.security.shared_file`): they reach the executors inside the tasks, never shown
    security: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaOptions:
        raw = {k.lower(): v for k, v in dict(options).items()}
        bootstrap = raw.get("kafka.bootstrap.servers") or raw.get("bootstrap")
        if not bootstrap:
            raise _fail("give the cluster: the kafka.bootstrap.servers (or bootstrap) option")
        topics = tuple(t.strip() for t in raw.get("topics", raw.get("subscribe", "")).split(",")
                       if t.strip())
        if not topics:
            raise _fail("give the topics option (a comma list)")
        from changelake.spark.source import schema_option

        avro = schema_option(raw)
        registry = raw.get("schemaregistry") or None
        output = raw.get("output", "messages").lower()
        if output not in ("messages", "records"):
            raise _fail(f"output must be messages or records, not {raw['output']!r}")
        if avro is None and registry is None and output == "messages":
            raise _fail("reading a Kafka topic needs the schema: the schema (a file), avroSchema "
                        "or schemaRegistry option")
        config = tuple(sorted(
            (k[len("kafka."):], v) for k, v in raw.items()
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers"))
        if "kafka.auto.offset.reset" in raw:
            raise _fail("kafka.auto.offset.reset is not an option: startingOffsets says where a "
                        "read starts, failOnDataLoss what happens when its records are gone")
        fail_on_data_loss = raw.get("failondataloss", "true").strip().lower()
        if fail_on_data_loss not in ("true", "false"):
            raise _fail(f"failOnDataLoss must be true or false, not {raw['failondataloss']!r}")
        limit = raw.get("maxrecordspertrigger")
        if limit is not None and (not limit.isdigit() or int(limit) < 1):
            raise _fail(f"maxRecordsPerTrigger must be a positive integer, not {limit!r}")
        starting = raw.get("startingoffsets", "earliest")
        ending = raw.get("endingoffsets", "latest")
        for name, value in (("startingOffsets", starting), ("endingOffsets", ending)):
            _parse_offsets(name, value)
        security: tuple[tuple[str, str], ...] = ()
        if raw.get("securityfile"):
            from changelake.kafka.security import load_file

            security = tuple(sorted(load_file(raw["securityfile"]).settings.items()))
        return cls(bootstrap, topics, starting, ending, avro, registry,
                   raw.get("lenient", "false").lower() in ("true", "1", "yes"), config,
                   int(limit) if limit else None, records=output == "records",
                   fail_on_data_loss=fail_on_data_loss == "true",
                   loss_report=raw.get("lossreport") or None, security=security)

    def given_schema(self) -> Any:
        from changelake.formats.materialize import CdcSchema

        if self.avro_schema is None:
            return None
        import orjson

        return CdcSchema.from_json(orjson.loads(self.avro_schema))

    def resolved(self) -> KafkaOptions:
        """With `row_schema` set: the given schema, or the registry's latest of the first topic
        subject it has (see the module docstring)."""
        import dataclasses

        import orjson

        from changelake.errors import ChangelakeError
        from changelake.kafka.registry import SchemaRegistry, value_subject

        if self.row_schema is not None or self.records:
            return self
        if self.avro_schema is not None:
            return dataclasses.replace(self, row_schema=self.avro_schema)
        assert self.registry is not None
        try:
            registry = SchemaRegistry(self.registry)
            for topic in self.topics:
                found = registry.latest(value_subject(topic))
                if found is not None:
                    return dataclasses.replace(self, row_schema=orjson.dumps(found.avro).decode())
        except ChangelakeError as error:
            raise _fail(str(error)) from None
        subjects = ", ".join(value_subject(t) for t in self.topics)
        from changelake.redact import redact

        raise _fail(f"the registry at {redact(self.registry)} has no subject {subjects} to "
                    "type the rows with: give the schema or avroSchema option")

    def rows(self) -> Any:
        """The `CdcSchema` whose rows type the DataFrame (after `resolved`)."""
        import orjson

        from changelake.formats.materialize import CdcSchema

        assert self.row_schema is not None
        return CdcSchema.from_json(orjson.loads(self.row_schema))

    def consumer_config(self) -> dict[str, str]:
        """The librdkafka settings of every client of this read: the security settings, then
        the `kafka.*` options."""
        return {**dict(self.security), **dict(self.config)}


def _parse_offsets(name: str, value: str) -> str | Offsets:
    """`earliest`, `latest`, or the JSON offsets (validated)."""
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    ok = isinstance(parsed, dict) and all(
        isinstance(by, dict) and all(
            str(p).isdigit() and type(o) is int and o >= -2 for p, o in by.items())
        for by in parsed.values())
    if not ok:
        raise _fail(f'{name} must be earliest, latest or JSON {{"topic": {{"0": offset}}}}, '
                    f"not {value!r}")
    return {t: {str(p): o for p, o in by.items()} for t, by in parsed.items()}


def _offset_in(spec: str | Offsets, topic: str, partition: int, default: int) -> int:
    """The offset `spec` asks of a partition: EARLIEST, LATEST or an offset."""
    if isinstance(spec, str):
        return EARLIEST if spec == "earliest" else LATEST
    return spec.get(topic, {}).get(str(partition), default)


# ------------------------------------------------------------------------------ planning


@dataclass(frozen=True)
class Watermarks:
    """A partition's offsets now: the first held (`low`) and the next to be written (`high`)."""

    topic: str
    partition: int
    low: int
    high: int


def watermarks(options: KafkaOptions) -> list[Watermarks]:
    """Every partition of the topics and its watermarks: the driver's only calls to Kafka
    (metadata and offsets, no records)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from changelake.errors import ChangelakeError
    from changelake.kafka.client import client_config, describe, partitions_of, watch_of

    settings = client_config(options.bootstrap, "plan", options.consumer_config())
    settings.update({"group.id": f"changelake-plan-{uuid.uuid4()}",
                     "enable.auto.commit": False, "isolation.level": "read_committed"})
    settings.update(options.consumer_config())
    consumer = Consumer(settings)
    try:
        out = []
        for topic in options.topics:
            try:
                partitions = partitions_of(consumer, options.bootstrap, topic, _TIMEOUT,
                                           watch_of(settings))
            except ChangelakeError as error:
                raise _fail(str(error)) from None
            for p in partitions:
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                               timeout=_TIMEOUT)
                except KafkaException as error:
                    raise _fail(f"topic {topic!r} partition {p}: cannot read its offsets: "
                                f"{describe(error)}") from None
                out.append(Watermarks(topic, p, low, high))
        return out
    finally:
        consumer.close()


def _resolve(spec: str | Offsets, mark: Watermarks, default: int, what: str) -> int:
    """An offset of `spec` for this partition, checked against what the partition holds."""
    asked = _offset_in(spec, mark.topic, mark.partition, default)
    if asked == EARLIEST:
        return mark.low
    if asked == LATEST:
        return mark.high
    where = f"topic {mark.topic} partition {mark.partition}"
    if asked < mark.low:
        raise _fail(f"{where}: {what} {asked} is before the partition's first offset "
                    f"{mark.low}: those records were deleted")
    if asked > mark.high:
        raise _fail(f"{where}: {what} {asked} is beyond the partition's end {mark.high}: the "
                    "topic was recreated or truncated")
    return asked


def lost_records(topic: str, partition: int, offset: int, low: int, high: int,
                 what: str = "the query was at offset") -> str:
    """Why records `offset` on are not what the partition holds now (`[low, high)`): the one
    wording of data loss, on the driver and on the executors (see the module docstring)."""
    where = (f"topic {topic} partition {partition}: {what} {offset}, but the partition's "
             f"first offset is {low} and its end {high}")
    if offset < low:
        return f"{where}: records were deleted (retention or DeleteRecords) before being read"
    return f"{where}: the topic was recreated or truncated (offset {offset} is beyond its end)"


def report_loss(options: KafkaOptions, message: str, warned: set[str] | None = None, *,
                then: str = "going on from the first offset held") -> None:
    """Data loss: a `_fail` error with `failOnDataLoss` (the default), else a warning (once per
    message in `warned`), saying what the caller does `then`, in the log and the `lossReport`
    file (see the module docstring)."""
    if options.fail_on_data_loss:
        raise _fail(f"{message} (the option failOnDataLoss=false, `ingest --follow --kafka "
                    "--no-fail-on-data-loss`, goes on from the first offset held)")
    if warned is None or message not in warned:
        log.warning("%s: warning: %s; %s (failOnDataLoss=false)", NAME, message, then)
        if options.loss_report is not None:
            _append_line(options.loss_report, f"{message}; {then}")
        if warned is not None:
            warned.add(message)


def _append_line(path: str, line: str) -> None:
    """One line at the end of the driver's `LossReport` file, in one write (lines from several
    processes do not mix); nothing where the file is not (an executor on another host: the
    warning is in its log)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # not created: only the driver's counts
    except FileNotFoundError:
        return
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


class LossReport:
    """The data-loss warnings of a `failOnDataLoss=false` stream, brought to the process that
    runs the query: its planner and (in local mode) its readers run in Python processes that
    Spark starts, whose warnings reach only logs. Give `option` as the source's `lossReport`;
    `drain()` calls `tell` with each line written since, each loss once (the same line again,
    from a task run again, is not repeated). Use as a context manager (the file goes at the
    end)."""

    def __init__(self, tell: Callable[[str], None], directory: str | None = None) -> None:
        import tempfile

        fd, self.path = tempfile.mkstemp(prefix="changelake-data-loss-", suffix=".txt",
                                         dir=directory)
        os.close(fd)
        self.tell = tell
        self._read = 0  # bytes of the file told
        self._told: set[str] = set()
        self._lock = threading.Lock()  # drained by the follow's loop and its batches' thread

    @property
    def option(self) -> str:
        return self.path

    def drain(self) -> None:
        with self._lock:
            try:
                with open(self.path, "rb") as file:
                    file.seek(self._read)
                    text = file.read()
            except FileNotFoundError:
                return
            whole = text.rfind(b"\n") + 1  # a line still being written waits for its end
            self._read += whole
            for line in text[:whole].decode().splitlines():
                if line not in self._told:
                    self._told.add(line)
                    self.tell(line)

    def __enter__(self) -> LossReport:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.drain()
        with self._lock:
            Path(self.path).unlink(missing_ok=True)


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """One topic-partition's offsets `[start, end)`, read by one task."""

    topic: str
    partition: int
    start: int
    end: int


def plan_batch(options: KafkaOptions) -> list[KafkaRange]:
    """The ranges of a batch read: each partition from `startingOffsets` to `endingOffsets`."""
    starting = _parse_offsets("startingOffsets", options.starting)
    ending = _parse_offsets("endingOffsets", options.ending)
    ranges = []
    for mark in watermarks(options):
        start = _resolve(starting, mark, EARLIEST, "startingOffsets")
        end = _resolve(ending, mark, LATEST, "endingOffsets")
        if end < start:
            raise _fail(f"topic {mark.topic} partition {mark.partition}: endingOffsets {end} "
                        f"is before startingOffsets {start}")
        ranges.append(KafkaRange(mark.topic, mark.partition, start, end))
    return ranges


# ------------------------------------------------------------------------------ reading


def read_range(options: KafkaOptions, part: KafkaRange) -> Iterator[tuple[Any, ...]]:
    """The rows of one partition's range, read and decoded here (on an executor)."""
    from changelake.errors import ChangelakeError

    try:
        yield from _rows(options, part)
    except ChangelakeError as error:
        # Raised in an executor, this reaches the driver as text: one recognisable line.
        raise RuntimeError(f"{INPUT_ERROR_MARK}<<{error}>>") from None


_RETRIES = 3  # out-of-range answers for an offset the partition's watermarks say it holds


def _rows(options: KafkaOptions, part: KafkaRange) -> Iterator[tuple[Any, ...]]:
    """The range's records, read with `auto.offset.reset=error`: an offset the partition no
    longer holds is data loss (failOnDataLoss: an error; else a warning, and the read goes on
    from the first offset held, or ends if the topic was recreated), never librdkafka's silent
    reset. A record below the next offset wanted came from the wrong place: an error. One
    above it is fine (compaction, transaction markers): see the module docstring."""
    from changelake.kafka.errors import OffsetOutOfRange
    from changelake.kafka.source import PartitionRange, TopicReader

    decoder = RecordDecoder(options) if not options.records else None
    config = {**options.consumer_config(), "auto.offset.reset": "error"}
    position = part.start  # the next offset of the range not read yet
    retries = 0
    while position < part.end:
        with TopicReader(options.bootstrap, part.topic, framed=False, config=config,
                         timeout=_TIMEOUT) as reader:
            try:
                for record in reader.records([PartitionRange(part.partition, position,
                                                             part.end)]):
                    if record.offset < position:
                        raise _fail(f"topic {part.topic} partition {part.partition}: expected "
                                    f"offset {position} or later (of the range [{part.start}, "
                                    f"{part.end})), got offset {record.offset}: the consumer "
                                    "was reset to another place")
                    position = record.offset + 1
                    if decoder is None:
                        yield (record.key, record.value, part.topic, part.partition,
                               record.offset, record.timestamp, record.timestamp_type)
                    else:
                        yield decoder.row(part.topic, part.partition, record.offset,
                                          record.value)
                return
            except OffsetOutOfRange:
                low, high = reader.watermarks(part.partition)
        if low <= position <= high and retries < _RETRIES:
            retries += 1  # held again (a race with the answer): ask again
            continue
        report_loss(options, lost_records(part.topic, part.partition, position, low, high,
                                          f"the task reading offsets [{part.start}, "
                                          f"{part.end}) was at offset"),
                    then=(f"reading nothing of offsets [{position}, {part.end})"
                          if position > high else f"going on from offset {low}"))
        if position > high:
            return  # recreated: nothing of this range is held
        position = max(position, low)


class RecordDecoder:
    """Records' values into message rows (the `materialize-cdc` shape), on an executor: the
    one decoding of every reader of records, this source's or Spark's own `kafka` format's
    (`kafka_records.messages_from_records`). Strict: a bad record raises an `InputError` at
    topic, partition and offset; lenient: it becomes an `_error` row."""

    def __init__(self, options: KafkaOptions) -> None:
        import orjson

        from changelake.kafka.registry import SchemaRegistry
        from changelake.kafka.schemas import FrameSchemas
        from changelake.spark.source import data_type_of

        self.lenient = options.lenient
        self.expected = options.rows()
        _, self.convert = data_type_of(self.expected)
        self.row_type = orjson.dumps(self.expected.data_type, option=orjson.OPT_SORT_KEYS)
        registry = SchemaRegistry(options.registry) if options.registry else None
        self.schemas = FrameSchemas(options.given_schema(), registry)
        self.verdicts: dict[int | bytes, str | None] = {}  # frame key -> why its rows cannot be

    def _verdict(self, key: int | bytes) -> str | None:
        import orjson

        if key not in self.verdicts:
            schema = self.schemas.get(key)  # unknown: the decode says so
            self.verdicts[key] = None if schema is None or orjson.dumps(
                schema.data_type, option=orjson.OPT_SORT_KEYS) == self.row_type else (
                f"the topics' frames carry more than one row schema ({self.expected.data_type} "
                f"and {schema.data_type}): one table takes one (schema changes over "
                "Kafka: not yet)")
        return self.verdicts[key]

    def row(self, topic: str, partition: int, offset: int,
            value: bytes | None) -> tuple[Any, ...]:
        from changelake.errors import InputError
        from changelake.formats.materialize import SetAside
        from changelake.kafka.source import decode_record, location
        from changelake.protocol import Updates

        where = location(topic, partition, offset)
        key = frame_key(value)
        reason = self._verdict(key) if key is not None else None
        if reason is not None:
            if not self.lenient:
                raise InputError(reason, where)
            return None, None, where.file, None, offset, reason
        set_aside: list[SetAside] = []
        message = decode_record(value, self.schemas, where,
                                set_aside.append if self.lenient else None)
        if message is None:
            return None, None, where.file, None, offset, set_aside[0].reason
        if isinstance(message, Updates):
            updates = [(self.convert(d), t, r) for d, t, r in message.updates]
            return updates, None, where.file, None, offset, None
        progress = (list(message.lower.elements), list(message.upper.elements),
                    [(t, c) for t, c in message.counts])
        return None, progress, where.file, None, offset, None


def frame_key(value: bytes | None) -> int | bytes | None:
    """The schema id (Confluent frame) or fingerprint (single-object frame) a record names;
    None if it is no frame (its decode says why)."""
    import struct

    from changelake.formats.materialize import CONFLUENT_MAGIC, SINGLE_OBJECT_MAGIC

    if value is None:
        return None
    if value[:1] == CONFLUENT_MAGIC and len(value) >= 5:
        return int(struct.unpack(">I", value[1:5])[0])
    if value[:2] == SINGLE_OBJECT_MAGIC and len(value) >= 10:
        return bytes(value[2:10])
    return None


def read_partition(options: KafkaOptions, part: KafkaRange) -> Iterator[Any]:
    """A read task's output: the records as tuples, or the decoded messages as Arrow batches
    of the source's schema (`source.arrow_batches`: converted by pyarrow, not value by value
    by PySpark's worker)."""
    from changelake.spark.source import arrow_batches, data_type_of, message_type

    rows = read_range(options, part)
    if options.records:
        return rows
    data_type, _ = data_type_of(options.rows())
    return arrow_batches(rows, message_type(data_type))


class KafkaCdcReader(DataSourceReader):
    def __init__(self, options: KafkaOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return [r for r in plan_batch(self.options) if r.start < r.end]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, KafkaRange):  # with no ranges, Spark reads one empty partition
            yield from read_partition(self.options, partition)


# ----------------------------------------------------------------------------- streaming


def _as_offsets(positions: Mapping[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _positions(offsets: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, int], int]:
    return {(t, int(p)): o for t, by in offsets.items() for p, o in by.items()}


def share(backlog: Mapping[tuple[str, int], int], budget: int) -> dict[tuple[str, int], int]:
    """How many records each partition may read of `budget`: even shares, what a partition
    does not need going to the others (so the whole budget is used while records wait)."""
    granted = dict.fromkeys(backlog, 0)
    waiting = sorted(k for k, n in backlog.items() if n > 0)
    while budget > 0 and waiting:
        each = max(1, budget // len(waiting))
        for key in list(waiting):
            take = min(each, backlog[key] - granted[key], budget)
            granted[key] += take
            budget -= take
            if granted[key] == backlog[key]:
                waiting.remove(key)
            if budget == 0:
                break
    return granted


class KafkaCdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """New records since the last offset, per topic-partition (see the module docstring)."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self.target: dict[tuple[str, int], int] | None = None
        self._marks: list[Watermarks] | None = None  # latestOffset's, for the partitions after
        self._warned: set[str] = set()  # data-loss warnings given (failOnDataLoss=false)

    def _lost(self, message: str, then: str) -> None:
        report_loss(self.options, message, self._warned, then=then)

    def _gone(self, topic: str, partition: int, offset: int) -> None:
        self._lost(f"topic {topic} partition {partition}: the query was at offset {offset}, "
                   f"but the topic has no partition {partition} now: the topic was recreated "
                   "with fewer partitions", "going on without it")

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {(m.topic, m.partition): m.high for m in watermarks(self.options)}

    def initialOffset(self) -> dict:
        starting = _parse_offsets("startingOffsets", self.options.starting)
        return _as_offsets({(m.topic, m.partition): _resolve(starting, m, EARLIEST,
                                                             "startingOffsets")
                            for m in watermarks(self.options)})

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        marks = self._marks = watermarks(self.options)
        held = {(m.topic, m.partition): m for m in marks}
        begun = _positions(start) if start else {}
        kept = {}  # partitions of topics no longer read: kept as they are
        for (topic, partition), offset in sorted(begun.items()):
            if topic not in self.options.topics:
                kept[(topic, partition)] = offset
            elif (topic, partition) not in held:
                self._gone(topic, partition, offset)  # failOnDataLoss=false: dropped
        froms, ends = {}, {}
        for key, m in held.items():
            froms[key] = self._from(m, begun[key] if key in begun else self._new(begun, key))
            high = m.high if self.target is None else min(m.high, self.target.get(key, m.high))
            ends[key] = max(high, froms[key])
        if isinstance(limit, ReadMaxRows):
            granted = share({k: ends[k] - froms[k] for k in ends}, limit.max_rows)
            ends = {k: froms[k] + granted[k] for k in ends}
        return _as_offsets({**kept, **ends})

    @staticmethod
    def _new(begun: Mapping[tuple[str, int], int], key: tuple[str, int]) -> int:
        """Where a partition not in the offsets starts: at 0 if it was added to a topic the
        query reads (its records are all new to it: a first offset above 0 is data loss, as
        Spark's source says of an added partition), else (a topic added to `topics`, or the
        first batch) at its first offset."""
        return 0 if any(topic == key[0] for topic, _ in begun) else EARLIEST

    def _from(self, mark: Watermarks, offset: int) -> int:
        """Where a partition the query was at `offset` goes on: there if the partition holds
        it; else data loss, and (failOnDataLoss=false) its first offset. An end below the
        batch's start says so to `partitions` (recreated); deleted records give a start below
        the first offset, which `partitions` reads from the first offset."""
        if offset == EARLIEST:
            return mark.low
        if mark.low <= offset <= mark.high:
            return offset
        self._lost(lost_records(mark.topic, mark.partition, offset, mark.low, mark.high),
                   f"going on from offset {mark.low}")
        return mark.low

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        if self.options.max_records:
            return ReadMaxRows(self.options.max_records)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return _as_offsets({(m.topic, m.partition): m.high for m in watermarks(self.options)})

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """The batch's ranges, each checked against the partition's watermarks (those
        `latestOffset` just read, or fresh ones for a batch Spark replays after a restart):
        see "Lost records" in the module docstring."""
        begun = _positions(start)
        marks, self._marks = self._marks, None
        held = None if marks is None else {(m.topic, m.partition): m for m in marks}
        ranges = []
        for (topic, partition), stop in sorted(_positions(end).items()):
            first = begun.get((topic, partition))
            if first == stop:
                continue  # nothing to read (a topic no longer read keeps its offsets so)
            if topic not in self.options.topics:  # dropped from `topics` since it was planned
                if first is not None and first < stop:
                    ranges.append(KafkaRange(topic, partition, first, stop))
                continue
            if held is None:
                held = {(m.topic, m.partition): m for m in watermarks(self.options)}
            mark = held.get((topic, partition))
            if mark is None:
                self._gone(topic, partition, stop if first is None else first)
                continue
            if first is None:  # a partition that appeared since: from its beginning
                first = self._from(mark, self._new(begun, (topic, partition)))
            elif stop < first:
                first = mark.low  # latestOffset's reset (failOnDataLoss=false): from the start
            elif not mark.low <= first <= mark.high:
                self._lost(lost_records(topic, partition, first, mark.low, mark.high),
                           f"reading nothing of offsets [{first}, {stop})"
                           if first > mark.high else f"going on from offset {mark.low}")
                if first > mark.high:
                    continue  # recreated: nothing of the range is held; the next batch resets
                first = mark.low
            if stop > mark.high:
                self._lost(lost_records(topic, partition, stop, mark.low, mark.high,
                                        "the micro-batch reads up to offset"),
                           f"reading up to offset {mark.high}")
                stop = mark.high
            if first < stop:
                ranges.append(KafkaRange(topic, partition, first, stop))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, KafkaRange):  # with no ranges, Spark reads one empty partition
            yield from read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        pass  # the offsets live in the query's checkpoint, not in a consumer group


# -------------------------------------------------------------------------- data source


class KafkaCdcDataSource(DataSource):
    """`spark.read.format("kafka-cdc")`, also `readStream`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _resolved(self) -> KafkaOptions:
        return KafkaOptions.parse(self.options).resolved()

    def schema(self) -> StructType | str:
        from changelake.spark.source import data_type_of, message_type

        options = self._resolved()
        if options.records:
            return RECORDS_SCHEMA  # DDL: no session in the worker that asks
        data_type, _ = data_type_of(options.rows())
        return message_type(data_type)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaCdcReader(self._resolved())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaCdcStreamReader(self._resolved())
