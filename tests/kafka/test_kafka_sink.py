"""The Kafka sink against the mock cluster: what `write_topic` produces, read back by the source
and the reference Reader, through the adversary of `simulate` (duplicates, re-batching, several
writers, any order across partitions). Transactions against the run's Apache Kafka broker: the
mock models no read-committed isolation, so only a broker shows an aborted one unread."""

from __future__ import annotations

import struct
import time
from collections import defaultdict

import pytest

from changelake.kafka import (
    MockCluster,
    RegistryServer,
    SchemaRegistry,
    TopicError,
    read_topic,
    value_subject,
    write_topic,
)
from changelake.kafka.broker import KafkaBroker
from changelake.kafka.sink import message_key
from changelake.protocol import Progress, collect
from changelake.simulate import justified, mangle, random_history, write
from tests.support.kafka_helpers import (
    as_set,
    cluster,
    new_topic,
    raw_records,
    registry,
    row_schema,
)
from tests.support.seeding import seeded

__all__ = ["cluster", "registry"]  # fixtures


def test_history_written_twice_and_mangled_decodes_to_itself(
    cluster: MockCluster, registry: RegistryServer
) -> None:
    rng = seeded(11)
    history = random_history(rng, updates=600, times=25)
    topic = new_topic(cluster, partitions=4)
    schema = row_schema()
    one, two = write(history, batch_size=5), write(history, batch_size=9, finish_every=2)
    for messages in (one, one, mangle([one, two], rng)):  # a re-run, and a mangled log
        write_topic(messages, bootstrap=cluster.bootstrap, topic=topic, schema=schema,
                    schema_registry=registry.url)
    read = read_topic(cluster.bootstrap, topic, schema_registry=registry.url)
    assert len(read) > 2 * len(one)
    assert {m.origin.file for m in read} == {f"topic {topic} partition {p}" for p in range(4)}
    result = collect(read)
    assert as_set(result.updates) == as_set(history.truth)
    assert result.frontier.to_json() == []
    assert not result.rejected


def test_a_prefix_of_the_topic_decodes_to_what_it_justifies(cluster: MockCluster) -> None:
    rng = seeded(12)
    history = random_history(rng, updates=300, times=20)
    topic = new_topic(cluster, partitions=3)
    delivered = mangle([write(history, batch_size=4)], rng, keep=0.6)
    write_topic(delivered, bootstrap=cluster.bootstrap, topic=topic, schema=row_schema())
    result = collect(read_topic(cluster.bootstrap, topic, schema=row_schema()))
    expected, frontier = justified(history.truth, delivered)
    assert as_set(result.updates) == as_set(expected)
    assert result.frontier.to_json() == frontier


def test_frames_keys_and_partitions(cluster: MockCluster, registry: RegistryServer) -> None:
    """Values are Confluent frames with the id registered under TOPIC-value; keys are the
    values' hashes, so a re-run puts each message on the partition that already holds it."""
    history = random_history(seeded(13), updates=200, times=10)
    topic = new_topic(cluster, partitions=4)
    messages = write(history, batch_size=3)
    first = write_topic(messages, bootstrap=cluster.bootstrap, topic=topic, schema=row_schema(),
                        schema_registry=registry.url)
    again = write_topic(messages, bootstrap=cluster.bootstrap, topic=topic, schema=row_schema(),
                        schema_registry=registry.url)
    schema_id = SchemaRegistry(registry.url).register(value_subject(topic), row_schema())
    assert first.schema_id == again.schema_id == schema_id >= 1
    assert first.messages == len(messages) and first.by_partition == again.by_partition
    assert len(first.by_partition) == 4  # spread over every partition
    records = raw_records(cluster, topic, 4)
    assert len(records) == 2 * len(messages)
    by_key: dict[bytes, set] = defaultdict(set)
    for partition, _offset, key, value in records:
        assert value is not None and value[:1] == b"\x00"
        assert struct.unpack(">I", value[1:5]) == (schema_id,)
        assert key == message_key(value)
        by_key[key].add((partition, value))
    assert all(len(places) == 1 for places in by_key.values())  # each twice, in one place


def test_transactional_sink_commits_per_progress_statement(broker: KafkaBroker) -> None:
    history = random_history(seeded(14), updates=200, times=12)
    topic = new_topic(broker, partitions=2)
    messages = write(history, batch_size=6)
    report = write_topic(messages, bootstrap=broker.bootstrap, topic=topic, schema=row_schema(),
                         transactional_id=f"{topic}-sink")
    statements = sum(isinstance(m, Progress) for m in messages)
    assert report.transactions == statements + 1  # each statement's, and the (empty) last
    # the same id again fences the first producer and writes duplicates: absorbed
    write_topic(messages[: len(messages) // 2], bootstrap=broker.bootstrap, topic=topic,
                schema=row_schema(), transactional_id=f"{topic}-sink")
    # every message once or twice, and the transactions' markers: offsets no record has
    records = raw_records(broker, topic, 2)
    assert len(records) == len(messages) + len(messages) // 2
    assert max(o for _, o, _, _ in records) > len(records) // 2
    result = collect(read_topic(broker.bootstrap, topic, schema=row_schema()))
    assert as_set(result.updates) == as_set(history.truth)
    assert result.frontier.to_json() == []


def test_missing_topic_is_refused_before_writing_and_not_created(cluster: MockCluster) -> None:
    """librdkafka's producers ask the broker to create a topic they name, by default: a typo
    had become a topic (of the broker's default partitions) and the write succeeded."""
    for _ in range(2):  # the first attempt created nothing the second could find
        with pytest.raises(TopicError, match="topic 'no-such-topic' does not exist"):
            write_topic([], bootstrap=cluster.bootstrap, topic="no-such-topic",
                        schema=row_schema())


def test_bad_input_aborts_the_open_transaction(broker: KafkaBroker) -> None:
    """An error in the messages (bad input upstream) propagates, after the abort: a reader
    (read-committed) sees the transactions committed before it, not the aborted one, which a
    read-uncommitted consumer shows was written."""
    history = random_history(seeded(15), updates=80, times=5)
    topic = new_topic(broker, partitions=2)
    messages = write(history, batch_size=4)
    first = next(i for i, m in enumerate(messages) if isinstance(m, Progress)) + 1
    assert first + 2 < len(messages) and not isinstance(messages[first + 1], Progress)

    def failing():
        yield from messages[:first + 2]
        time.sleep(1)  # the open transaction's records sent, before the abort
        raise ValueError("upstream input broke")

    with pytest.raises(ValueError, match="upstream input broke"):
        write_topic(failing(), bootstrap=broker.bootstrap, topic=topic, schema=row_schema(),
                    transactional_id=f"{topic}-sink")
    read = read_topic(broker.bootstrap, topic, schema=row_schema())
    assert len(read) == first  # the first transaction's, up to its progress statement
    assert as_set(collect(read).updates) == as_set(collect(messages[:first]).updates)
    uncommitted = raw_records(broker, topic, 2, isolation="read_uncommitted")
    assert len(uncommitted) == first + 2


def test_a_message_too_large_for_the_producer_is_cut_into_messages_that_fit(
        cluster: MockCluster) -> None:
    # Batches of 200 updates take several kB; at message.max.bytes 1000 each is cut into
    # messages that fit, and the topic still reads back to the history, whole.
    history = random_history(seeded(16), updates=2000, times=2, keys=1000)
    topic = new_topic(cluster, partitions=1)
    messages = write(history, batch_size=200)
    report = write_topic(messages, bootstrap=cluster.bootstrap, topic=topic,
                         schema=row_schema(), config={"message.max.bytes": 1000})
    records = raw_records(cluster, topic, 1)
    assert report.messages == len(records) > len(messages)
    assert all(len(key) + len(value) <= 1000 for _, _, key, value in records)
    result = collect(read_topic(cluster.bootstrap, topic, schema=row_schema()))
    assert as_set(result.updates) == as_set(history.truth)
    assert result.frontier.to_json() == [] and not result.rejected


def test_an_update_too_large_for_any_message_is_refused_naming_it(cluster: MockCluster
                                                                   ) -> None:
    from changelake.errors import InputError
    from changelake.formats.materialize import CdcSchema
    from changelake.kafka.sink import RECORD_FRAMING_BYTES
    from changelake.protocol import Writer
    from changelake.values import Record

    schema = CdcSchema.for_fields([{"name": "id", "type": "long"},
                                   {"name": "text", "type": "string"}])
    writer = Writer(batch_size=10)
    writer.push(Record((("id", 1), ("text", "x" * 2000))), 7, 1)  # ~2 kB: no 1000-byte message
    topic = new_topic(cluster, partitions=1)
    limit = 1000  # librdkafka's least
    with pytest.raises(InputError, match=rf"topic '{topic}': an update at time 7 takes \d+ "
                       r"bytes as a message of its own, more than the producer's "
                       rf"message.max.bytes \({limit}\) leaves for it "
                       rf"\({limit - RECORD_FRAMING_BYTES} bytes\)"):
        write_topic(writer.finish_through(7), bootstrap=cluster.bootstrap, topic=topic,
                    schema=schema, config={"message.max.bytes": limit})
    assert raw_records(cluster, topic, 1) == []  # refused before its first message
