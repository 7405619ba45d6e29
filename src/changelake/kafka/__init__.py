"""Kafka in and out, through confluent-kafka (librdkafka).

The public API:

* `write_topic(messages, bootstrap=..., topic=..., schema=...)`: the sink, CDCv2 messages
  produced Confluent-framed (see `sink`);
* `read_topic(bootstrap, topic, schema=...)` and `TopicReader`: a bounded read of a topic of
  such messages (see `source`); `decode_topic` runs one through the Reader, as
  `changelake decode --kafka` does (see `decode`);
* `changefeed_messages(bootstrap, topics, source="debezium"|"ydb", keys=...)` and `TopicFeed`:
  a bounded read of Debezium or YDB changefeed topics converted to CDCv2 messages, as
  `changelake encode --from debezium|ydb --kafka` does (see `changefeed`);
* `SchemaRegistry`: the registry client; `RegistryServer` and `MockCluster`: an in-memory
  registry and librdkafka's mock cluster, served on 127.0.0.1 for tests and the demo.

One module per job: `client` (settings, log, metadata), `security` (`--kafka-conf`,
`--kafka-config`: SASL and SSL settings for every client), `registry`, `schemas` (which schema
decodes a frame), `sink`, `source`, `decode`, `changefeed`, `cluster` (librdkafka's mock),
`broker` (a real Apache Kafka broker, for tests), `registry_server`, and `dead_letter`
(records a lenient read set aside, produced to a dead-letter topic). The Spark data source
`kafka-cdc`, whose executors read the partitions with `source`, is
`changelake.spark.kafka_source`.
"""

from changelake.kafka.changefeed import TopicFeed, changefeed_messages
from changelake.kafka.cluster import MockCluster
from changelake.kafka.decode import decode_topic
from changelake.kafka.errors import RegistryError, TopicError
from changelake.kafka.registry import SchemaRegistry, value_subject
from changelake.kafka.registry_server import RegistryServer
from changelake.kafka.schemas import NO_REGISTRY_ID
from changelake.kafka.sink import SinkReport, write_topic
from changelake.kafka.source import PartitionRange, TopicReader, read_topic

__all__ = [
    "NO_REGISTRY_ID",
    "MockCluster",
    "PartitionRange",
    "RegistryError",
    "RegistryServer",
    "SchemaRegistry",
    "SinkReport",
    "TopicError",
    "TopicFeed",
    "TopicReader",
    "changefeed_messages",
    "decode_topic",
    "read_topic",
    "value_subject",
    "write_topic",
]
