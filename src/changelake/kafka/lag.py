"""A lake table's Kafka lag for `status`: how far each partition's end is past the offset the
table's last commit recorded. Without Spark's modules, so the JVM-free `status` asks it too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from changelake.lake.follow_lag import NOT_ASKED
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
    reached: int | None = None  # the greatest upper its statements carried (None: none)
    holds_back: bool = False  # see `holding_back`


def status_consumer(bootstrap: str, config: Mapping[str, Any] | None = None) -> Any:
    """A consumer that only asks (watermarks, a record's timestamp) and commits nothing: what
    `status` uses to measure a lag."""
    from confluent_kafka import Consumer

    from changelake.kafka.client import client_config

    settings = client_config(bootstrap, "status", config)
    settings.update({"group.id": "changelake-status", "enable.auto.commit": False})
    return Consumer(settings)


def holding_back(offsets: SourceOffsets, frontier: int | None) -> set[tuple[str, int]]:
    """The partitions that hold the table's `frontier` back: those whose statements reached
    no further than it, while another partition's reached beyond it. One time's updates and
    statements may be spread over all partitions, so the frontier is what they justify
    together; a partition that stopped receiving stops only the frontier, and is the one whose
    `reached` stays behind. None of them while the frontier keeps up (no statement beyond it
    was read) or is closed."""
    if frontier is None:
        return set()
    reached = {(t.topic, p.partition): p.reached for t in offsets.topics for p in t.partitions}
    if not any(r is not None and r > frontier for r in reached.values()):
        return set()
    return {place for place, r in reached.items() if r is None or r <= frontier}


def topic_lags(offsets: SourceOffsets, *, live: bool = True, timeout: float = 5.0,
               config: Mapping[str, Any] | None = None,
               frontier: int | None = None) -> list[PartitionLag]:
    """Each recorded partition's lag (end offset now minus the committed resume offset),
    asked of the cluster at `offsets.address` within `timeout` seconds per call (not `live`:
    not asked, `NOT_ASKED` in place of the error), and whether it holds the table's
    `frontier` back (`holding_back`); an unreachable cluster is reported per partition, not
    raised."""
    from confluent_kafka import KafkaException, TopicPartition

    from changelake.kafka.client import describe

    out: list[PartitionLag] = []
    consumer = status_consumer(offsets.address, config) if live else None
    # once the cluster failed to answer (or is not to be asked), it is not asked again
    failure: str | None = None if live else NOT_ASKED
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
    behind = holding_back(offsets, frontier)
    recorded = {(t.topic, p.partition): p.reached for t in offsets.topics for p in t.partitions}
    return [replace(lag, reached=recorded.get((lag.topic, lag.partition)),
                    holds_back=(lag.topic, lag.partition) in behind) for lag in out]


def offsets_status(offsets: SourceOffsets, *, live: bool = True, timeout: float = 5.0,
                   frontier: int | None = None) -> list[dict[str, Any]]:
    """`topic_lags` as the plain records a `TableStatus` carries."""
    return [asdict(lag) for lag in topic_lags(offsets, live=live, timeout=timeout,
                                              frontier=frontier)]
