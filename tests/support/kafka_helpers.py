"""Shared pieces of the Kafka tests: a mock cluster and a registry per test module (the real
broker is the run's `broker` fixture, in conftest.py), fresh topics on either, the schema of
`simulate`'s rows, and the checks every decode must pass."""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator, Sequence
from typing import Protocol

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from changelake.formats.materialize import CdcSchema
from changelake.kafka import MockCluster, RegistryServer
from changelake.protocol import Update

ROW_FIELDS = [{"name": "id", "type": "long"}, {"name": "v", "type": "long"}]
_names = itertools.count()

SASL_USER = "changelake-test"
SASL_PASSWORD = f"pw-{secrets.token_hex(12)}"
"""The test broker's SASL/PLAIN user: a password made for the run, which tests look for in
every output (it must never be printed)."""


class Cluster(Protocol):
    """A cluster tests make topics on: `MockCluster` or `KafkaBroker`."""

    @property
    def bootstrap(self) -> str: ...

    def create_topic(self, name: str, partitions: int = 1, replication: int = 1) -> None: ...

    def delete_records(self, topic: str, partition: int, before: int) -> None: ...


def row_schema() -> CdcSchema:
    """The Materialize CDC schema of `simulate.random_history`'s rows."""
    return CdcSchema.for_fields(ROW_FIELDS)


@pytest.fixture(scope="module")
def cluster() -> Iterator[MockCluster]:
    with MockCluster(brokers=3) as mock:
        yield mock


@pytest.fixture(scope="module")
def registry() -> Iterator[RegistryServer]:
    with RegistryServer() as server:
        yield server


def new_topic(cluster: Cluster, partitions: int = 4) -> str:
    """A fresh topic (each test its own, on the module's mock cluster or the run's broker)."""
    name = f"cdc-{next(_names)}"
    cluster.create_topic(name, partitions)
    return name


def produce_raw(cluster: Cluster, topic: str, records: Sequence[tuple[int, bytes | None]]
                ) -> None:
    """Records (partition, value) as they are: for messages a sink would never write."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for partition, value in records:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0


def produce_keyed(cluster: Cluster, topic: str, records: Sequence[tuple[bytes, bytes]]
                  ) -> None:
    """Records (key, value) in order, to the partition the producer's partitioner picks by key
    (as a Debezium connector writes a table topic)."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def raw_records(cluster: Cluster, topic: str, partitions: int, *,
                isolation: str = "read_committed"
                ) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of the topic as (partition, offset, key, value); `isolation`
    read_uncommitted shows aborted transactions' records too (on a broker)."""
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "raw",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)}
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    open_parts = {p for p, end in ends.items() if end > 0}
    while open_parts:
        record = consumer.poll(10)
        assert record is not None, "the mock cluster stopped delivering"
        if record.error():
            if record.offset() >= ends[record.partition()]:
                open_parts.discard(record.partition())
            continue
        out.append((record.partition(), record.offset(), record.key(), record.value()))
        if record.offset() + 1 >= ends[record.partition()]:
            open_parts.discard(record.partition())
    consumer.close()
    return out


def as_set(updates: Sequence[Update]) -> set[tuple]:
    """Updates as a set, each once (asserting they were each once)."""
    out = {(repr(d), t, r) for d, t, r in updates}
    assert len(out) == len(updates), "an update was reported twice"
    return out
