"""What every changelake Kafka client shares: its settings, its log, and errors as one line.

librdkafka logs to stderr by default, which would break the CLI's contract of one line per
error; its log goes to the `changelake.kafka` logger instead (silent unless the application
configures logging). Failures reach the caller as exceptions, each naming the topic.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from changelake.kafka.errors import TopicError

log = logging.getLogger("changelake.kafka")
log.addHandler(logging.NullHandler())


def client_config(bootstrap: str, role: str, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings of a client of the cluster at `bootstrap`; `extra` (security settings and
    the like, librdkafka names) overrides them."""
    if not bootstrap.strip():
        raise TopicError("--kafka: no bootstrap servers given")
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": f"changelake-{role}",
        "logger": log,
    }
    config.update(extra or {})
    return config


def describe(error: KafkaError | KafkaException | BaseException) -> str:
    """A librdkafka error as text: its own string, which names the code and the reason."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0],
                                                                       KafkaError):
        error = error.args[0]
    if isinstance(error, KafkaError):
        return f"{error.str()} ({error.name()})"
    return str(error)


def partitions_of(client: Any, bootstrap: str, topic: str, timeout: float) -> list[int]:
    """The topic's partition numbers, from the cluster's metadata; a `TopicError` when the
    cluster cannot be reached or has no such topic."""
    try:
        metadata = client.list_topics(topic=topic, timeout=timeout)
    except KafkaException as error:
        raise TopicError(f"cannot reach Kafka at {bootstrap}: {describe(error)}") from None
    found = metadata.topics.get(topic)
    if found is None or (found.error is not None
                         and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise TopicError(f"topic {topic!r} does not exist on {bootstrap}")
    if found.error is not None:
        raise TopicError(f"topic {topic!r}: {describe(found.error)}")
    if not found.partitions:
        raise TopicError(f"topic {topic!r} has no partitions")
    return sorted(found.partitions)
