"""Dead letters: the records a lenient read set aside, produced to a topic of their own.

A dead letter is the original record as it was read: its value bytes unchanged (None for a
tombstone), its key, and its headers, followed by four headers of ours (text, UTF-8) that say
where it came from and why it was set aside:

* `changelake.topic`: the source topic;
* `changelake.partition`: the source partition (decimal);
* `changelake.offset`: the record's offset there (decimal);
* `changelake.error`: why it was set aside (the line strict mode would have stopped with,
  without the location).

The records come back to the driver by offset (`fetch`), read again with a `TopicReader`
assigned to just their offsets (runs of nearby offsets read as one range), because the rows of
a lenient read carry only the location and the reason of a record set aside (`_error`), not
its bytes: the message rows keep `materialize-cdc`'s shape. So what passes through the driver
is the set-aside records (and at most `_GAP` records between two of them in a partition),
never the input.

Delivery is at least once: `DeadLetterTopic.send` returns once every dead letter is
acknowledged (an idempotent producer, acks from all replicas), and a caller that commits
afterwards (the lake ingest) produces them again when it is killed between the two; the
`(changelake.topic, changelake.partition, changelake.offset)` headers identify the duplicates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Message as KafkaMessage

from changelake.formats.materialize import SetAside
from changelake.kafka.client import describe, partitions_of, watch_of
from changelake.kafka.errors import TopicError
from changelake.kafka.sink import producer_config
from changelake.kafka.source import PartitionRange, Record, TopicReader, location

HEADER_TOPIC = "changelake.topic"
HEADER_PARTITION = "changelake.partition"
HEADER_OFFSET = "changelake.offset"
HEADER_ERROR = "changelake.error"
HEADERS = (HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET, HEADER_ERROR)

_GAP = 64
"""Two set-aside records of a partition at most this many offsets apart are fetched by one
range read (the records between are read and dropped): fewer round trips, bounded waste."""


@dataclass(frozen=True, slots=True, order=True)
class BadRecord:
    """A record a lenient read set aside: where it is, and why."""

    topic: str
    partition: int
    offset: int
    reason: str

    def set_aside(self) -> SetAside:
        """As lenient readers report what they set aside (`topic T partition P, offset O`)."""
        return SetAside(location(self.topic, self.partition, self.offset), self.reason)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A set-aside record with what was read of it again: the record to produce."""

    bad: BadRecord
    record: Record

    def headers(self) -> list[tuple[str, bytes | None]]:
        """The original record's headers, then ours (see the module docstring)."""
        return [*self.record.headers,
                (HEADER_TOPIC, self.bad.topic.encode()),
                (HEADER_PARTITION, str(self.bad.partition).encode()),
                (HEADER_OFFSET, str(self.bad.offset).encode()),
                (HEADER_ERROR, self.bad.reason.encode())]


def _ranges(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct offsets of one partition as ranges `[start, end)`, runs closer than
    `_GAP` merged."""
    ranges: list[list[int]] = []
    for offset in offsets:
        if ranges and offset - ranges[-1][1] < _GAP:
            ranges[-1][1] = offset + 1
        else:
            ranges.append([offset, offset + 1])
    return [(start, end) for start, end in ranges]


def fetch(bootstrap: str, bad: Iterable[BadRecord], *,
          config: Mapping[str, Any] | None = None) -> list[DeadLetter]:
    """Each bad record read again by its offset, in the order of `bad` (see the module
    docstring). A record the topic no longer holds is a `TopicError`: its bytes are gone."""
    wanted: dict[str, dict[int, set[int]]] = {}
    for b in bad:
        wanted.setdefault(b.topic, {}).setdefault(b.partition, set()).add(b.offset)
    found: dict[tuple[str, int, int], Record] = {}
    for topic, partitions in wanted.items():
        with TopicReader(bootstrap, topic, framed=False, config=config) as reader:
            for partition, offsets in sorted(partitions.items()):
                for start, end in _ranges(sorted(offsets)):
                    for record in reader.records([PartitionRange(partition, start, end)]):
                        if record.offset in offsets:
                            found[(topic, partition, record.offset)] = record
    letters = []
    for b in bad:
        record = found.get((b.topic, b.partition, b.offset))
        if record is None:
            raise TopicError(f"topic {b.topic!r} partition {b.partition}: the record at offset "
                             f"{b.offset}, set aside, could not be read again for its dead "
                             "letter (deleted by retention, or the topic was recreated)")
        letters.append(DeadLetter(b, record))
    return letters


class DeadLetterTopic:
    """A producer of dead letters to `topic` on the cluster at `bootstrap`; the topic must
    exist (checked when made, before anything is read; never auto-created). `config` adds
    librdkafka settings."""

    def __init__(self, bootstrap: str, topic: str, *, config: Mapping[str, Any] | None = None,
                 timeout: float = 30.0, delivery_timeout: float = 120.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.timeout = timeout
        self.delivery_timeout = delivery_timeout
        # idempotent, acks from all replicas; partitioned by the original key (murmur2)
        settings = producer_config(bootstrap, delivery_timeout=delivery_timeout, config=config)
        try:
            self._producer = Producer(settings)
        except KafkaException as error:
            raise TopicError(f"cannot make a producer for {bootstrap}: "
                             f"{describe(error)}") from None
        try:  # the producer creates no topic (`producer_config`)
            partitions_of(self._producer, bootstrap, topic, timeout, watch_of(settings))
        except TopicError as error:
            raise TopicError(f"dead-letter topic: {error}") from None

    def send(self, letters: Sequence[DeadLetter]) -> int:
        """Produce `letters` and wait until every one is acknowledged; how many were sent. A
        delivery that fails is a `TopicError` (some may have been delivered: at least once)."""
        failures: list[KafkaError] = []

        def delivered(error: KafkaError | None, _message: KafkaMessage) -> None:
            if error is not None:
                failures.append(error)

        for letter in letters:
            while True:
                try:
                    self._producer.produce(self.topic, value=letter.record.value,
                                           key=letter.record.key, headers=letter.headers(),
                                           on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self._producer.poll(0.1)
                except KafkaException as error:
                    raise TopicError(f"dead-letter topic {self.topic!r}: cannot produce the "
                                     f"record of topic {letter.bad.topic} partition "
                                     f"{letter.bad.partition}, offset {letter.bad.offset}: "
                                     f"{describe(error)}") from None
            self._producer.poll(0)
        left = self._producer.flush(self.delivery_timeout + self.timeout)
        if left:
            raise TopicError(f"dead-letter topic {self.topic!r}: {left} record(s) not "
                             f"acknowledged within {self.delivery_timeout + self.timeout:g} s")
        if failures:
            raise TopicError(f"dead-letter topic {self.topic!r}: delivery failed: "
                             f"{describe(failures[0])}"
                             + (f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""))
        return len(letters)


__all__ = ["HEADERS", "BadRecord", "DeadLetter", "DeadLetterTopic", "fetch"]
