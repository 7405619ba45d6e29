"""Reading one `kafka-cdc` input partition on an executor: its topic-partition's range by a
consumer of its own, each record decoded into a message row."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSourceReader,
    InputPartition,
)

from changelake.spark.errors import INPUT_ERROR_MARK
from changelake.spark.kafka_source.options import _TIMEOUT, KafkaOptions, _fail
from changelake.spark.kafka_source.plan import (
    KafkaRange,
    lost_records,
    plan_batch,
    report_loss,
)


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
