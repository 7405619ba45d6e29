"""librdkafka's mock cluster: a Kafka protocol server on 127.0.0.1, for tests and the demo.

librdkafka (which confluent-kafka bundles) carries an in-process implementation of the Kafka
protocol, a fast stand-in for a broker (`broker.KafkaBroker` runs Apache Kafka itself, for what
only a broker does): produce, fetch, idempotent and transactional
producers, consumer groups and committed offsets. Any client or process can use it through its
bootstrap address while the `MockCluster` that owns it lives.

confluent-kafka exposes it only through the `test.mock.num.brokers` setting of a client, which
gives no way to create a topic with a chosen number of partitions: the mock answers the Admin
API's CreateTopics with "not supported", and auto-created topics get 4 partitions. So this module
calls librdkafka's own mock API (`rd_kafka_mock_cluster_new`, `rd_kafka_mock_topic_create`)
through ctypes, on the very library confluent-kafka loaded; so do `delete_topic` and
`delete_records` (the mock answers DeleteTopics and DeleteRecords with "not supported" too),
which tests use to lose records under a reader as retention or a recreated topic would.

What the mock does not model, and tests must not rely on: read-committed isolation (a consumer
sees messages of open and aborted transactions; harmless for CDCv2, whose every message is true
of the final history) and abort markers after a producer is fenced.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from functools import cache
from types import TracebackType

from changelake.kafka.errors import TopicError

_RD_KAFKA_PRODUCER = 0
_TOPIC_ALREADY_EXISTS = 36  # the Kafka protocol's error code


@cache
def _librdkafka() -> ctypes.CDLL:
    """The librdkafka that confluent-kafka uses (its wheel bundles one), with the signatures of
    the calls made here declared."""
    import confluent_kafka

    package = os.path.dirname(confluent_kafka.__file__)
    candidates = sorted(glob.glob(os.path.join(package, os.pardir, "confluent_kafka.libs",
                                               "librdkafka*")))
    candidates += sorted(glob.glob(os.path.join(package, ".dylibs", "librdkafka*")))
    path = candidates[0] if candidates else ctypes.util.find_library("rdkafka")
    if path is None:
        raise TopicError("cannot find the librdkafka library that confluent-kafka uses")
    lib = ctypes.CDLL(path)
    pointer, text, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    signatures = {
        "rd_kafka_conf_new": ([], pointer),
        "rd_kafka_conf_set": ([pointer, text, text, text, size], ctypes.c_int),
        "rd_kafka_new": ([ctypes.c_int, pointer, text, size], pointer),
        "rd_kafka_destroy": ([pointer], None),
        "rd_kafka_mock_cluster_new": ([pointer, ctypes.c_int], pointer),
        "rd_kafka_mock_cluster_destroy": ([pointer], None),
        "rd_kafka_mock_cluster_bootstraps": ([pointer], text),
        "rd_kafka_mock_topic_create": ([pointer, text, ctypes.c_int, ctypes.c_int], ctypes.c_int),
        "rd_kafka_mock_topic_delete": ([pointer, text], ctypes.c_int),
        "rd_kafka_mock_partition_delete_records": ([pointer, text, ctypes.c_int32,
                                                    ctypes.c_int64], ctypes.c_int),
    }
    for name, (arguments, result) in signatures.items():
        function = getattr(lib, name)
        function.argtypes = arguments
        function.restype = result
    return lib


class MockCluster:
    """A mock Kafka cluster of `brokers` brokers, served until `close()` (or the `with` block
    ends). `bootstrap` is its address list for any client: `"127.0.0.1:P1,127.0.0.1:P2,..."`."""

    def __init__(self, brokers: int = 3) -> None:
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        lib = _librdkafka()
        error = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        lib.rd_kafka_conf_set(conf, b"log_level", b"3", error, len(error))  # errors only
        # The handle owns the mock cluster's thread; it is a producer only in name.
        self._handle = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, error, len(error))
        if not self._handle:
            raise TopicError(f"cannot start a mock cluster: {error.value.decode()}")
        self._cluster = lib.rd_kafka_mock_cluster_new(self._handle, brokers)
        if not self._cluster:
            lib.rd_kafka_destroy(self._handle)
            raise TopicError("cannot start a mock cluster (librdkafka refused)")
        self.brokers = brokers
        self.bootstrap: str = lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    def create_topic(self, name: str, partitions: int = 1, replication: int = 1) -> None:
        """A topic with `partitions` partitions, each led by one of the brokers in turn."""
        if self._cluster is None:
            raise TopicError("the mock cluster is closed")
        if partitions < 1:
            raise ValueError("a topic needs at least one partition")
        code = _librdkafka().rd_kafka_mock_topic_create(
            self._cluster, name.encode(), partitions, min(replication, self.brokers))
        if code == _TOPIC_ALREADY_EXISTS:
            raise TopicError(f"topic {name!r} already exists on the mock cluster")
        if code:
            raise TopicError(f"cannot create topic {name!r} on the mock cluster (error {code})")

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its records (the Admin API's DeleteTopics is not served by the
        mock); `create_topic` may make it again, its offsets starting at 0."""
        if self._cluster is None:
            raise TopicError("the mock cluster is closed")
        code = _librdkafka().rd_kafka_mock_topic_delete(self._cluster, name.encode())
        if code:
            raise TopicError(f"cannot delete topic {name!r} on the mock cluster (error {code})")

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Delete a partition's records before offset `before`, as retention or the Admin
        API's DeleteRecords (which the mock does not serve) would: its first offset becomes
        `before`."""
        if self._cluster is None:
            raise TopicError("the mock cluster is closed")
        code = _librdkafka().rd_kafka_mock_partition_delete_records(
            self._cluster, topic.encode(), partition, before)
        if code:
            raise TopicError(f"cannot delete the records of topic {topic!r} partition "
                             f"{partition} before offset {before} on the mock cluster "
                             f"(error {code})")

    def close(self) -> None:
        """Stop serving: clients still connected see the brokers go away."""
        if self._cluster is not None:
            lib = _librdkafka()
            lib.rd_kafka_mock_cluster_destroy(self._cluster)
            lib.rd_kafka_destroy(self._handle)
            self._cluster = self._handle = None

    def __enter__(self) -> MockCluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
