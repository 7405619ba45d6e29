"""Kafka in and out (issue 11), through confluent-kafka (librdkafka).

The public API:

* `write_topic(messages, bootstrap=..., topic=..., schema=...)`: the sink, CDCv2 messages
  produced Confluent-framed (see `sink`);
* `read_topic(bootstrap, topic, schema=...)` and `TopicReader`: a bounded read of a topic of
  such messages (see `source`); `decode_topic` runs one through the Reader, as
  `changelake decode --kafka` does (see `decode`);
* `SchemaRegistry`: the registry client; `RegistryServer` and `MockCluster`: an in-memory
  registry and librdkafka's mock cluster, served on 127.0.0.1 for tests and the demo.

One module per job: `client` (settings, log, metadata), `registry`, `schemas` (which schema
decodes a frame), `sink`, `source`, `decode`, `cluster`, `registry_server`. Readers of other
topic formats (Debezium, YDB) and the Spark data source are to join as modules beside `source`.
"""

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
    "TopicReader",
    "decode_topic",
    "read_topic",
    "value_subject",
    "write_topic",
]
