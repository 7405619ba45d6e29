"""The Kafka source: a bounded read of a topic of Confluent-framed CDCv2 messages.

A read covers every partition from its start (the beginning, or the offset a consumer group
committed) up to the partition's end *when the read starts*: the end offset the cluster answers
this (read-committed) client, the last stable offset on a real cluster, so an open transaction
of a killed transactional sink cannot hold the read back (librdkafka's mock cluster answers the
high watermark: it models no isolation). Messages produced meanwhile are left for the next read,
so a read always ends, and what it covered is exactly the offsets `[start, end)` of each
partition.

Partitions are read together, their messages interleaved as the cluster delivers them: the
CDCv2 reader takes messages in any order, so no ordering across partitions is needed or assumed.
Each message's location is its topic, partition and offset; a record that is not a framed
Materialize CDC message is an `InputError` there (strict), or set aside (lenient).

Offsets are committed to the group only when the caller says so (`commit`), after it has made
durable whatever it derived from the messages: committing first could lose them on a crash.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

from changelake.errors import InputError, Location, SchemaError
from changelake.formats.materialize import CdcSchema, SetAside, Sink, decode_framed
from changelake.kafka.client import client_config, describe, partitions_of, watch_of
from changelake.kafka.errors import OffsetOutOfRange, TopicError
from changelake.kafka.registry import SchemaRegistry
from changelake.kafka.schemas import FrameSchemas
from changelake.protocol.messages import Message

_BATCH = 500  # messages per consume() call, which returns when it has them or after _WAIT s
_WAIT = 0.1
# The group coordinator moving or still loading, as after a broker's start: librdkafka does
# not always mark these retriable when committed() returns them.
_COORDINATOR_MOVING = frozenset({KafkaError.NOT_COORDINATOR,
                                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                 KafkaError.COORDINATOR_NOT_AVAILABLE})


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """The offsets `[start, end)` of one partition that a read covers."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record of the topic, as read."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: dt.datetime | None = None  # UTC
    timestamp_type: int = -1  # as Spark's Kafka source: 0 create time, 1 log append time
    headers: tuple[tuple[str, bytes | None], ...] = ()  # as produced, in order


def record_time(kafka_timestamp: tuple[int, int]) -> tuple[dt.datetime | None, int]:
    """confluent-kafka's `(type, milliseconds)` as Spark's Kafka source gives it."""
    kind, millis = kafka_timestamp
    if kind not in (1, 2):  # TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
        return None, -1
    return dt.datetime.fromtimestamp(millis / 1000, dt.UTC), kind - 1


def location(topic: str, partition: int, offset: int) -> Location:
    """Where a Kafka record is: `topic T partition P, offset O`."""
    return Location(f"topic {topic} partition {partition}", offset=offset)


def decode_record(value: bytes | None, schemas: FrameSchemas, where: Location,
                  set_aside: Sink | None = None) -> Message | None:
    """The Materialize CDC message a record's value holds. A bad record (a tombstone, not a
    frame, an unknown schema, corrupt Avro) raises an `InputError` at `where`, or with
    `set_aside` goes there (None is returned). Shared by every reader of records, whichever
    client fetched them."""
    try:
        if value is None:
            raise InputError("a tombstone (no value) is not a Materialize CDC message", where)
        return decode_framed(value, schemas, where)
    except (InputError, SchemaError) as error:
        reason = error.reason
        if schemas.registry is None and reason.startswith("unknown schema id"):
            reason += " (ids other than 0 need --schema-registry)"
        if set_aside is None:
            raise InputError(reason, where) from None
        set_aside(SetAside(where, reason, (value or b"")[:32].hex()))
        return None


class TopicReader:
    """One bounded read of `topic`. Use as a context manager; `messages()` once, then
    `commit()` if a group should remember how far it got.

    `schema` decodes frames with schema id 0 (and single-object frames of that schema); the
    registry at `schema_registry` decodes the other ids. `config` adds librdkafka settings.
    `idle_timeout` bounds the wait for a partition that stops delivering before its end.
    `framed=False` reads records of another format (`records()` only): no schema needed.
    An offset a partition no longer holds is reset to its beginning (`auto.offset.reset`
    earliest, librdkafka's silent reset); with `auto.offset.reset=error` in `config`,
    `records()` raises `OffsetOutOfRange` instead (the `kafka-cdc` source's executors do).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        group: str | None = None,
        schema: CdcSchema | None = None,
        schema_registry: str | None = None,
        config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        idle_timeout: float = 60.0,
        framed: bool = True,
    ) -> None:
        if framed and schema is None and schema_registry is None:
            raise SchemaError("reading a Kafka topic needs the schema: --schema FILE or "
                              "--schema-registry URL")
        self.bootstrap = bootstrap
        self.topic = topic
        self.group = group
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.registry = SchemaRegistry(schema_registry) if schema_registry else None
        self.schemas = FrameSchemas(schema, self.registry)
        settings = client_config(bootstrap, "decode", None)
        settings.update({
            # A group id is required even for assigned partitions; without a group, a fresh
            # one that commits nothing.
            "group.id": group if group is not None else f"changelake-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        })
        settings.update(config or {})
        self._consumer: Consumer | None = Consumer(settings)
        self._watch = watch_of(settings)
        self.ranges: list[PartitionRange] = []
        self.read = 0  # records read so far

    # ---------------------------------------------------------------------------- the plan

    def _with_coordinator(self, call: Any, doing: str) -> Any:
        """`call()` against the group's coordinator. An error the broker calls retriable, or
        the coordinator moving or still loading (as after a broker's start), is asked again
        until the timeout; any other is one line saying what was being done."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return call()
            except KafkaException as error:
                cause = error.args[0] if error.args else None
                moving = getattr(cause, "retriable", lambda: False)() or \
                    getattr(cause, "code", lambda: None)() in _COORDINATOR_MOVING
                if moving and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise TopicError(f"topic {self.topic!r}: cannot {doing} of group "
                                 f"{self.group!r}: {describe(error)}") from None

    def _committed(self, consumer: Consumer, partitions: list[int]) -> list[TopicPartition]:
        """The group's committed offsets of `partitions`."""
        wanted = [TopicPartition(self.topic, p) for p in partitions]
        return self._with_coordinator(
            lambda: consumer.committed(wanted, timeout=self.timeout), "read the offsets")

    def plan(self) -> list[PartitionRange]:
        """Each partition's range for this read: from the group's committed offset (or the
        partition's beginning) to its end now."""
        consumer = self._open()
        partitions = partitions_of(consumer, self.bootstrap, self.topic, self.timeout,
                                   self._watch)
        committed: dict[int, int] = {}
        if self.group is not None:
            found = self._committed(consumer, partitions)
            committed = {tp.partition: tp.offset for tp in found if tp.offset >= 0}
        ranges = []
        for partition in partitions:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), timeout=self.timeout)
            except KafkaException as error:
                raise TopicError(f"topic {self.topic!r} partition {partition}: cannot read its "
                                 f"offsets: {describe(error)}") from None
            start = committed.get(partition, low)
            ranges.append(PartitionRange(partition, min(max(start, low), high), high))
        self.ranges = ranges
        return ranges

    # ------------------------------------------------------------------------------ reading

    def messages(self, set_aside: Sink | None = None) -> Iterator[Message]:
        """The messages of the planned ranges (planned now if not yet). A bad record raises an
        `InputError` at its place, or with `set_aside` goes there and reading goes on."""
        for record in self.records():
            message = self.message(record, set_aside)
            if message is not None:
                yield message

    def message(self, record: Record, set_aside: Sink | None = None) -> Message | None:
        """The message a record of this topic holds (see `messages`); None if set aside."""
        return self._decode(record.value, record.partition, record.offset, set_aside)

    def records(self, ranges: Sequence[PartitionRange] | None = None) -> Iterator[Record]:
        """The records of `ranges` (default: the planned ones), undecoded: the bounded read
        that readers of other topic formats and of one partition's range share."""
        consumer = self._open()
        if ranges is None:
            ranges = self.ranges or self.plan()
        open_ends = {r.partition: r.end for r in ranges if r.start < r.end}
        if not open_ends:
            return
        consumer.assign([TopicPartition(self.topic, r.partition, r.start) for r in ranges
                         if r.partition in open_ends])
        last_progress = time.monotonic()
        while open_ends:
            batch = consumer.consume(_BATCH, timeout=_WAIT)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self.idle_timeout:
                stuck = ", ".join(f"partition {p} (end {e})" for p, e in sorted(open_ends.items()))
                raise TopicError(f"topic {self.topic!r}: no records for {self.idle_timeout:g} s "
                                 f"before the end of {stuck}")
            for record in batch:
                partition, offset = record.partition(), record.offset()
                error = record.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # the end, past control records (transaction markers) a reader never
                        # sees as records
                        if partition in open_ends and offset >= open_ends[partition]:
                            del open_ends[partition]
                        continue
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        # auto.offset.reset=error (the caller's setting): the offset is gone
                        raise OffsetOutOfRange(self.topic, partition, offset, describe(error))
                    if not error.fatal() and error.retriable():
                        continue
                    raise TopicError(f"topic {self.topic!r} partition {partition}: "
                                     f"{describe(error)}")
                end = open_ends.get(partition)
                if end is None or offset >= end:  # produced after the read started
                    open_ends.pop(partition, None)
                    continue
                if offset + 1 >= end:
                    del open_ends[partition]
                self.read += 1
                yield Record(partition, offset, record.key(), record.value(),
                             *record_time(record.timestamp()), tuple(record.headers() or ()))
        consumer.unassign()

    def watermarks(self, partition: int) -> tuple[int, int]:
        """A partition's first offset held and its end (the next offset to be written), now."""
        try:
            low, high = self._open().get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=self.timeout)
        except KafkaException as error:
            raise TopicError(f"topic {self.topic!r} partition {partition}: cannot read its "
                             f"offsets: {describe(error)}") from None
        return int(low), int(high)

    def _decode(self, value: bytes | None, partition: int, offset: int,
                set_aside: Sink | None) -> Message | None:
        return decode_record(value, self.schemas, location(self.topic, partition, offset),
                             set_aside)

    # --------------------------------------------------------------------------- committing

    def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Record in the group that every planned range was read to its end, or (`offsets`:
        partition -> offset) that each partition was read up to that offset."""
        if self.group is None:
            raise TopicError("committing offsets needs a consumer group (--group)")
        ends = ({r.partition: r.end for r in self.ranges} if offsets is None
                else dict(offsets))
        positions = [TopicPartition(self.topic, p, end) for p, end in sorted(ends.items())
                     if end > 0]
        if not positions:
            return
        consumer = self._open()
        answer = self._with_coordinator(
            lambda: consumer.commit(offsets=positions, asynchronous=False),
            "commit the offsets")
        failed = [tp for tp in answer or [] if tp.error is not None]
        if failed:
            raise TopicError(f"topic {self.topic!r} partition {failed[0].partition}: cannot "
                             f"commit the offset of group {self.group!r}: "
                             f"{describe(failed[0].error)}")

    def committed(self) -> dict[int, int]:
        """The group's committed offset of each partition that has one."""
        if self.group is None:
            return {}
        consumer = self._open()
        partitions = partitions_of(consumer, self.bootstrap, self.topic, self.timeout,
                                   self._watch)
        found = self._committed(consumer, partitions)
        return {tp.partition: tp.offset for tp in found if tp.offset != OFFSET_INVALID}

    # ---------------------------------------------------------------------------- lifecycle

    def _open(self) -> Consumer:
        if self._consumer is None:
            raise TopicError(f"the reader of topic {self.topic!r} is closed")
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    schema: CdcSchema | None = None,
    schema_registry: str | None = None,
    group: str | None = None,
    set_aside: Sink | None = None,
    config: Mapping[str, Any] | None = None,
) -> list[Message]:
    """Every message of a bounded read of `topic` (see `TopicReader`), in the order read.
    Commits nothing: with a group, the read starts at the group's committed offsets."""
    with TopicReader(bootstrap, topic, group=group, schema=schema,
                     schema_registry=schema_registry, config=config) as reader:
        return list(reader.messages(set_aside))
