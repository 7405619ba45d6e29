"""A lake table's Kafka lag for `status`: how far each partition's end is past the offset the
table's last commit recorded. Without Spark's modules, so the JVM-free `status` asks it too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from changelake.lake.layout import SourceOffsets


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """`status` per partition of a table's topics: the committed (resume) offset, the
    partition's end now, and the lag between them (None with `error` when the cluster could
    not be asked)."""

    topic: str
    partition: int
    committed: int
    end: int | None
    lag: int | None
    error: str | None = None


def topic_lags(offsets: SourceOffsets, *, live: bool = True, timeout: float = 5.0,
               config: Mapping[str, Any] | None = None) -> list[PartitionLag]:
    """Each recorded partition's lag (end offset now minus the committed resume offset),
    asked of the cluster at `offsets.address` within `timeout` seconds per call; an
    unreachable cluster is reported per partition, not raised."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from changelake.kafka.client import client_config, describe

    out: list[PartitionLag] = []
    consumer = None
    failure: str | None = None  # once the cluster failed to answer, it is not asked again
    if live:
        settings = client_config(offsets.address, "status", config)
        settings.update({"group.id": "changelake-status", "enable.auto.commit": False})
        consumer = Consumer(settings)
    try:
        for topic in offsets.topics:
            for p in topic.partitions:
                if consumer is None or failure is not None:
                    out.append(PartitionLag(topic.topic, p.partition, p.resume, None, None,
                                            failure))
                    continue
                try:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(topic.topic, p.partition), timeout=timeout)
                except KafkaException as error:
                    failure = f"unreachable: {describe(error)}"
                    out.append(PartitionLag(topic.topic, p.partition, p.resume, None, None,
                                            failure))
                    continue
                out.append(PartitionLag(topic.topic, p.partition, p.resume, high,
                                        max(0, high - p.resume)))
    finally:
        if consumer is not None:
            consumer.close()
    return out


def offsets_status(offsets: SourceOffsets, *, live: bool = True,
                   timeout: float = 5.0) -> list[dict[str, Any]]:
    """`topic_lags` as the plain records a `TableStatus` carries."""
    return [asdict(lag) for lag in topic_lags(offsets, live=live, timeout=timeout)]
