"""What every changelake Kafka client shares: its settings, its log, and errors as one line.

librdkafka logs to stderr by default, which would break the CLI's contract of one line per
error; its log goes to the `changelake.kafka` logger instead (silent unless the application
configures logging). Failures reach the caller as exceptions, each naming the topic.

A bootstrap no broker answers at fails in `CONNECT_TIMEOUT`, not in librdkafka's request
timeout: every client's error callback (`BrokerWatch`) hears librdkafka say all brokers are
down, which `partitions_of`, the first request of every client, asks when its metadata is late.
`check_topics` asks it for a command's topics before the command starts anything costly (Spark
and the lake's metastore, for `ingest --kafka`), so such a bootstrap or a topic that does not
exist is refused in seconds, with nothing made.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from changelake.kafka.errors import TopicError

log = logging.getLogger("changelake.kafka")
log.addHandler(logging.NullHandler())

CONNECT_TIMEOUT = 5.0
"""Seconds a client's first metadata request waits before a bootstrap that librdkafka found
all down (every connection refused, a name that does not resolve) fails the command: otherwise
librdkafka retries until the request's own timeout (30 s) and only then says "transport
failure". A broker that takes the connection but answers slowly is not down, so its request is
asked again for the rest of the caller's timeout: a loaded cluster is not refused for being
slow. (A host that drops the connection attempts unanswered is down only after librdkafka's
`socket.connection.setup.timeout.ms`, 30 s by default.)"""


class BrokerWatch:
    """A client's `error_cb`: whether librdkafka has reported every broker down
    (`_ALL_BROKERS_DOWN`). It logs each error, as librdkafka does when a client has no
    callback; it hears them when the client is polled."""

    def __init__(self) -> None:
        self.all_down = False
        self.authentication: str | None = None  # librdkafka's reason, when SASL/SSL refused us

    def __call__(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.all_down = True
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL,
                            KafkaError.SASL_AUTHENTICATION_FAILED):
            self.authentication = describe(error)
        log.error("%s", describe(error))


def watch_of(settings: Mapping[str, Any]) -> BrokerWatch | None:
    """The `BrokerWatch` of a client made with `settings` (None if the caller's own settings
    gave another error callback)."""
    watch = settings.get("error_cb")
    return watch if isinstance(watch, BrokerWatch) else None


def client_config(bootstrap: str, role: str, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings of a client of the cluster at `bootstrap`: the process's security settings
    (`security.use`: `--kafka-conf`, `--kafka-config`) over ours; `extra` (the caller's,
    librdkafka names) overrides both."""
    from changelake.kafka.security import current

    if not bootstrap.strip():
        raise TopicError("--kafka: no bootstrap servers given")
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": f"changelake-{role}",
        "logger": log,
        "error_cb": BrokerWatch(),
    }
    config.update(current().config())
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


def partitions_of(client: Any, bootstrap: str, topic: str, timeout: float,
                  watch: BrokerWatch | None = None) -> list[int]:
    """The topic's partition numbers, from the cluster's metadata; a `TopicError` when the
    cluster cannot be reached or has no such topic. With the client's `watch`, a bootstrap
    librdkafka finds all down fails after `CONNECT_TIMEOUT` (call it before partitions are
    assigned: it polls the client, which serves the callback)."""
    metadata = _metadata(client, bootstrap, topic, timeout, watch)
    found = metadata.topics.get(topic)
    if found is None or (found.error is not None
                         and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise TopicError(f"topic {topic!r} does not exist on {bootstrap}")
    if found.error is not None:
        raise TopicError(f"topic {topic!r}: {describe(found.error)}")
    if not found.partitions:
        raise TopicError(f"topic {topic!r} has no partitions")
    return sorted(found.partitions)


def check_topics(bootstrap: str, topics: Sequence[str], *,
                 config: Mapping[str, Any] | None = None, timeout: float = 30.0) -> None:
    """A `TopicError` unless the cluster at `bootstrap` answers and holds every one of
    `topics` (with partitions): `partitions_of` on a consumer of no group's offsets, which
    creates no topic. A check before the work, not a promise: the reader asks again, as a
    topic may be deleted in between."""
    settings = client_config(bootstrap, "check", config)
    settings.update({"group.id": f"changelake-check-{uuid.uuid4()}",
                     "enable.auto.commit": False, "allow.auto.create.topics": False})
    settings.update(config or {})
    consumer = Consumer(settings)
    try:
        for topic in topics:
            partitions_of(consumer, bootstrap, topic, timeout, watch_of(settings))
    finally:
        consumer.close()


def _metadata(client: Any, bootstrap: str, topic: str, timeout: float,
              watch: BrokerWatch | None) -> Any:
    """The topic's metadata: asked for `CONNECT_TIMEOUT`, then (no broker down) again for the
    rest of `timeout` (see `CONNECT_TIMEOUT`)."""
    first = timeout if watch is None else min(timeout, CONNECT_TIMEOUT)
    try:
        return client.list_topics(topic=topic, timeout=first)
    except KafkaException as error:
        failure = error
    late = _code(failure) in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT)
    if watch is not None and late and first < timeout:
        client.poll(0)  # serves the error callback
        if watch.authentication is not None:
            raise TopicError(f"cannot reach Kafka at {bootstrap}: the broker refused our "
                             f"credentials or security settings (--kafka-conf, "
                             f"--kafka-config): {watch.authentication}")
        if watch.all_down:
            raise TopicError(f"cannot reach Kafka at {bootstrap}: no broker answered within "
                             f"{CONNECT_TIMEOUT:g} s (every bootstrap server refused the "
                             "connection, or its name did not resolve)")
        try:
            return client.list_topics(topic=topic, timeout=timeout - first)
        except KafkaException as error:
            failure = error
    raise TopicError(f"cannot reach Kafka at {bootstrap}: {describe(failure)}")


def _code(error: KafkaException) -> int | None:
    if error.args and isinstance(error.args[0], KafkaError):
        return int(error.args[0].code())
    return None
