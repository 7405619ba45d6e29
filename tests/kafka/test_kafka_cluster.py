"""The test infrastructure of Kafka, itself tested: librdkafka's mock cluster with topics of
chosen partition counts, and the schema registry client against the in-memory HTTP registry."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from changelake.errors import SchemaError
from changelake.formats.materialize import CdcSchema
from changelake.kafka import (
    MockCluster,
    RegistryError,
    RegistryServer,
    SchemaRegistry,
    TopicError,
    value_subject,
)
from tests.support.kafka_helpers import cluster, new_topic, registry, row_schema

__all__ = ["cluster", "registry"]  # fixtures


def test_mock_cluster_serves_topics_with_chosen_partitions(cluster: MockCluster) -> None:
    assert len(cluster.bootstrap.split(",")) == 3
    topic = new_topic(cluster, partitions=5)
    metadata = Producer({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=10)
    assert sorted(metadata.topics[topic].partitions) == [0, 1, 2, 3, 4]
    assert len(metadata.brokers) == 3
    with pytest.raises(TopicError, match=f"topic '{topic}' already exists"):
        cluster.create_topic(topic, 2)


def test_closed_cluster_refuses_topics() -> None:
    mock = MockCluster(brokers=1)
    mock.close()
    mock.close()  # twice is harmless
    with pytest.raises(TopicError, match="closed"):
        mock.create_topic("late", 1)


def test_registry_ids_are_stable_per_schema(registry: RegistryServer) -> None:
    client = SchemaRegistry(registry.url)
    schema = row_schema()
    other = CdcSchema.for_fields([{"name": "name", "type": "string"}])
    first = client.register(value_subject("orders"), schema)
    assert first >= 1  # 0 is the "no registry" id
    assert SchemaRegistry(registry.url).register(value_subject("orders"), schema) == first
    second = client.register(value_subject("names"), other)
    assert second != first
    assert registry.subjects()["orders-value"] == [first]
    fresh = SchemaRegistry(registry.url)  # no cache: over HTTP
    assert fresh.schema(first).avro == schema.avro  # type: ignore[union-attr]
    assert fresh.schema(second).data_fields == ("name",)  # type: ignore[union-attr]
    assert fresh.schema(9999) is None


def test_registry_schema_that_is_not_cdc_is_a_schema_error(registry: RegistryServer) -> None:
    import urllib.request

    import orjson

    from changelake.kafka.registry import CONTENT_TYPE

    body = orjson.dumps({"schema": orjson.dumps({"type": "string"}).decode()})
    request = urllib.request.Request(f"{registry.url}/subjects/plain-value/versions", data=body,
                                     method="POST", headers={"Content-Type": CONTENT_TYPE})
    with urllib.request.urlopen(request, timeout=10) as response:
        schema_id = orjson.loads(response.read())["id"]
    with pytest.raises(SchemaError, match=f"schema id {schema_id}"):
        SchemaRegistry(registry.url).schema(schema_id)


def test_registry_errors_name_the_registry() -> None:
    with pytest.raises(RegistryError, match="expected http"):
        SchemaRegistry("mock://nowhere")
    server = RegistryServer()
    url = server.url
    server.close()
    with pytest.raises(RegistryError, match=f"{url}: cannot reach the schema registry"):
        SchemaRegistry(url, timeout=5).register("t-value", row_schema())
