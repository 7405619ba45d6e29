"""The Kafka sink: CDCv2 messages produced to a topic, Confluent-framed Avro.

Each message (an update batch or a progress statement, as `protocol.Writer` emits them) becomes
one Kafka message: magic byte 0, the 4-byte schema id, the Avro binary of the Materialize CDC
union. The schema id comes from the registry (the schema registered under `<topic>-value`), or
is `NO_REGISTRY_ID` (0) without one: the reader then brings the schema file.

Keys. The reader merges all partitions and takes messages in any order, so any partitioning is
correct; the key is chosen for three other reasons. It is the SHA-256 (first 16 bytes) of the
framed value: it spreads messages evenly over the partitions (murmur2 of the key, Kafka's Java
partitioner), a partition's messages stay in the order produced (an idempotent producer, so
retries neither reorder nor double them), and a re-run after a crash, which writes the very same
bytes (the Writer is deterministic, the registry returns the same id), sends each message to the
partition that already holds it, where a compacted topic can drop the duplicate (equal keys
only for equal values: compaction can never lose a statement).

Size. A message too large for the producer (`message.max.bytes`, librdkafka's 1,000,000 by
default) is cut into several that fit, as the file writers cut theirs (`avro_datums`: a
progress statement counts updates, not messages); an update too large for any message is
refused, naming its time and size.

Crashes. Every message is true of the final history, so a sink killed at any point leaves a
topic that a reader can use, and re-running it from the start adds only duplicates, which the
reader absorbs. With a transactional id, each progress statement commits a transaction holding
it and the updates it counts, so read-committed consumers (Materialize's) see them together; a
re-run with the same id fences the killed producer and its open transaction is aborted.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Message as KafkaMessage

from changelake.errors import InputError
from changelake.formats.materialize import (
    CdcSchema,
    UpdateTooLarge,
    avro_datums,
    confluent_header,
)
from changelake.kafka.client import client_config, describe, partitions_of, watch_of
from changelake.kafka.errors import TopicError
from changelake.kafka.registry import SchemaRegistry, value_subject
from changelake.kafka.schemas import NO_REGISTRY_ID
from changelake.protocol.messages import Message, Progress

MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default `message.max.bytes`: the most a message's value, key and headers may
take, checked by the producer before it sends."""

RECORD_FRAMING_BYTES = 5 + 16 + 128
"""What a message takes besides its Avro datum, at most: the Confluent frame (magic byte and
schema id), the key (`message_key`), and room for the record's own framing in the broker's
batch."""


def datum_bound(settings: Mapping[str, Any]) -> int:
    """The most bytes a message's Avro datum may take under the producer's settings."""
    return int(settings.get("message.max.bytes", MESSAGE_MAX_BYTES)) - RECORD_FRAMING_BYTES


TRANSACTION_TIMEOUT_MS = 60_000


@dataclass(slots=True)
class SinkReport:
    """What a sink wrote: messages per partition, the schema id, transactions committed."""

    topic: str
    schema_id: int
    messages: int = 0
    transactions: int = 0
    by_partition: dict[int, int] = field(default_factory=dict)


def message_key(value: bytes) -> bytes:
    """The key of a framed message: see the module docstring for why it is the value's hash."""
    return hashlib.sha256(value).digest()[:16]


def producer_config(bootstrap: str, *, transactional_id: str | None = None,
                    delivery_timeout: float = 120.0,
                    config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    settings = client_config(bootstrap, "encode", None)
    settings.update({
        "enable.idempotence": True,  # acks=all, no reordering or doubling by retries
        "partitioner": "murmur2_random",
        "linger.ms": 20,
        "message.timeout.ms": int(delivery_timeout * 1000),
        # Written only to topics that exist: librdkafka's producers default to asking the
        # broker to create a topic their metadata request names (a typo became a topic).
        "allow.auto.create.topics": False,
    })
    if transactional_id is not None:
        settings["transactional.id"] = transactional_id
        # A killed sink's open transaction holds read-committed consumers back until the
        # broker aborts it after this long; a message may not outlive its transaction.
        settings["transaction.timeout.ms"] = TRANSACTION_TIMEOUT_MS
        settings["message.timeout.ms"] = min(settings["message.timeout.ms"],
                                             TRANSACTION_TIMEOUT_MS)
    settings.update(config or {})
    return settings


def schema_id_for(topic: str, schema: CdcSchema, schema_registry: str | None) -> int:
    """The id to frame messages with: registered under `<topic>-value`, or `NO_REGISTRY_ID`."""
    if schema_registry is None:
        return NO_REGISTRY_ID
    return SchemaRegistry(schema_registry).register(value_subject(topic), schema)


def write_topic(
    messages: Iterable[Message],
    *,
    bootstrap: str,
    topic: str,
    schema: CdcSchema,
    schema_registry: str | None = None,
    transactional_id: str | None = None,
    config: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
    delivery_timeout: float = 120.0,
) -> SinkReport:
    """Produce `messages` to `topic` and wait until every one is acknowledged.

    The topic must exist (metadata is checked first). `config` adds or overrides librdkafka
    settings (security, ...). `timeout` bounds each call to the cluster (metadata,
    transactions); `delivery_timeout` bounds a message's delivery, retries included. Raises
    `TopicError` when the cluster, the topic or a delivery fails, `RegistryError` when the
    registry does, and whatever the `messages` iterable raises (bad input), in every case after
    aborting an open transaction.
    """
    settings = producer_config(bootstrap, transactional_id=transactional_id,
                               delivery_timeout=delivery_timeout, config=config)
    report = SinkReport(topic, schema_id_for(topic, schema, schema_registry))
    try:
        producer = Producer(settings)
    except KafkaException as error:
        raise TopicError(f"cannot make a producer for {bootstrap}: {describe(error)}") from None
    partitions_of(producer, bootstrap, topic, timeout, watch_of(settings))
    failures: list[tuple[int, KafkaError]] = []

    def delivered(error: KafkaError | None, message: KafkaMessage) -> None:
        if error is not None:
            failures.append((message.partition(), error))
        else:
            partition = message.partition()
            report.by_partition[partition] = report.by_partition.get(partition, 0) + 1

    def check() -> None:
        if failures:
            partition, error = failures[0]
            where = f"partition {partition}" if partition is not None and partition >= 0 \
                else "a partition"
            raise TopicError(f"topic {topic!r}: delivery to {where} failed: {describe(error)}"
                             + (f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""))

    transaction = _Transactions(producer, topic, timeout) if transactional_id else None
    try:
        if transaction is not None:
            transaction.begin()
        frame, bound = confluent_header(report.schema_id), datum_bound(settings)
        for message in messages:
            try:  # all of one message's datums before any is produced
                datums = list(avro_datums((message,), schema, bound=bound))
            except UpdateTooLarge as error:
                raise _too_large(topic, error, settings) from None
            for datum in datums:
                _produce(producer, topic, frame + datum, delivered, report.messages)
                report.messages += 1
                check()
            if transaction is not None and isinstance(message, Progress):
                transaction.commit_and_begin()
                report.transactions += 1
        if transaction is not None:
            transaction.commit()
            report.transactions += 1
        _flush(producer, topic, delivery_timeout + timeout)
        check()
    except BaseException:
        if transaction is not None:
            transaction.abort()
        raise
    return report


def _too_large(topic: str, error: UpdateTooLarge, settings: Mapping[str, Any]) -> InputError:
    """The refusal of an update no Kafka message of the producer's can hold."""
    limit = int(settings.get("message.max.bytes", MESSAGE_MAX_BYTES))
    return InputError(
        f"topic {topic!r}: an update at time {error.update[1]} takes {error.size} bytes as a "
        f"message of its own, more than the producer's message.max.bytes ({limit}) leaves for "
        f"it ({error.bound} bytes); the messages before it were produced (a run again adds only "
        "duplicates; an open transaction is aborted): make the row smaller, or write the "
        "messages to a file (--avro)")


def _produce(producer: Producer, topic: str, value: bytes,
             delivered: Callable[[KafkaError | None, KafkaMessage], None], number: int) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=message_key(value), on_delivery=delivered)
            break
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.1)
        except KafkaException as error:
            kafka_error = error.args[0] if error.args else None
            if isinstance(kafka_error, KafkaError) and \
                    kafka_error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise TopicError(f"topic {topic!r}: message {number} is {len(value)} bytes, more "
                                 "than the producer's message.max.bytes: lower --batch-size") \
                    from None
            raise TopicError(f"topic {topic!r}: cannot produce message {number}: "
                             f"{describe(error)}") from None
    producer.poll(0)


def _flush(producer: Producer, topic: str, timeout: float) -> None:
    left = producer.flush(timeout)
    if left:
        raise TopicError(f"topic {topic!r}: {left} message(s) not acknowledged within "
                         f"{timeout:g} s")


class _Transactions:
    """A transactional producer's calls, with their failures as `TopicError`s."""

    def __init__(self, producer: Producer, topic: str, timeout: float) -> None:
        self.producer = producer
        self.topic = topic
        self.timeout = timeout
        self.open = False

    def _call(self, what: str, call: Callable[[], None]) -> None:
        try:
            call()
        except KafkaException as error:
            raise TopicError(f"topic {self.topic!r}: cannot {what} a transaction: "
                             f"{describe(error)}") from None

    def begin(self) -> None:
        self._call("initialize", lambda: self.producer.init_transactions(self.timeout))
        self._call("begin", self.producer.begin_transaction)
        self.open = True

    def commit_and_begin(self) -> None:
        self.commit()
        self._call("begin", self.producer.begin_transaction)
        self.open = True

    def commit(self) -> None:
        self._call("commit", lambda: self.producer.commit_transaction(self.timeout))
        self.open = False

    def abort(self) -> None:
        if self.open:
            # if this fails, the transaction is aborted when the id is used again
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction(self.timeout)
            self.open = False
