"""Records from any Kafka reader decode alike (`spark/kafka_records.py`): `kafka-cdc` with
`output=records` gives the columns of Spark's own `kafka` source, and `messages_from_records`
turns such records into exactly the rows `kafka-cdc` decodes itself, strict and lenient; a
records DataFrame of another shape, or no schema, is refused by name."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.errors import InputError, SchemaError
from changelake.formats.materialize import encode_confluent
from changelake.kafka import MockCluster, RegistryServer, write_topic
from changelake.simulate import random_history, write
from changelake.spark import register
from changelake.spark.errors import translate_errors
from changelake.spark.kafka_records import messages_from_records
from changelake.spark.kafka_source import RECORDS_SCHEMA
from tests.support.kafka_helpers import (
    cluster,
    new_topic,
    produce_raw,
    raw_records,
    registry,
    row_schema,
)
from tests.support.seeding import seeded

__all__ = ["cluster", "registry"]  # fixtures

pytestmark = pytest.mark.spark


def _read(spark: Any, cluster: MockCluster, topic: str, **options: str) -> Any:
    register(spark)
    return (spark.read.format("kafka-cdc").option("kafka.bootstrap.servers", cluster.bootstrap)
            .option("topics", topic).options(**options).load())


def _by_place(rows: list[Any]) -> dict[tuple[str, int], Any]:
    return {(r["_file"], r["_offset"]): r for r in rows}


def test_records_decode_as_the_source_decodes_them(spark: Any, cluster: MockCluster,
                                                   registry: RegistryServer,
                                                   tmp_path: Path) -> None:
    rng = seeded(91)
    messages = write(random_history(rng, updates=100, times=7), batch_size=4)
    records = list(messages) + rng.sample(list(messages), len(messages) // 3)
    random.Random(5).shuffle(records)
    topic = new_topic(cluster, partitions=3)
    half = len(records) // 2
    write_topic(records[:half], bootstrap=cluster.bootstrap, topic=topic, schema=row_schema(),
                schema_registry=registry.url)
    write_topic(records[half:], bootstrap=cluster.bootstrap, topic=topic, schema=row_schema())

    raw = _read(spark, cluster, topic, output="records")
    assert raw.schema.simpleString() == (  # Spark's kafka source's columns
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>")
    assert [f.name for f in raw.schema] == [c.split()[0] for c in RECORDS_SCHEMA.split(", ")]
    got = {(r["partition"], r["offset"]): (r["key"], r["value"], r["topic"])
           for r in raw.collect()}
    assert got == {(p, o): (k, v, topic) for p, o, k, v in raw_records(cluster, topic, 3)}
    assert {(r["timestamp"] is not None, r["timestampType"]) for r in raw.collect()} == {
        (True, 0)}  # the producer's create time

    schema_file = tmp_path / "schema.json"
    schema_file.write_text(orjson.dumps(row_schema().avro).decode())
    direct = _read(spark, cluster, topic, schema=str(schema_file),
                   schemaRegistry=registry.url)
    decoded = messages_from_records(raw, schema=schema_file, schema_registry=registry.url)
    assert decoded.schema == direct.schema
    expected = _by_place(direct.collect())
    assert len(expected) == len(records)
    assert _by_place(decoded.collect()) == expected
    # the registry alone types the rows by the topic's subject, as the source does
    only = messages_from_records(raw, schema_registry=registry.url, topic=topic, lenient=True)
    assert only.schema == direct.schema
    kept = {k: v for k, v in _by_place(only.collect()).items() if v["_error"] is None}
    assert 0 < len(kept) < len(expected) and all(expected[k] == v for k, v in kept.items())


def test_bad_records_are_named_or_set_aside(spark: Any, cluster: MockCluster) -> None:
    messages = write(random_history(seeded(92), updates=10, times=3), batch_size=4)
    good = encode_confluent(messages[0], row_schema(), 0)
    topic = new_topic(cluster, partitions=1)
    produce_raw(cluster, topic, [(0, good), (0, b"\x00\x00\x00\x00\x00\x07junk"), (0, None)])
    raw = _read(spark, cluster, topic, output="records")
    with pytest.raises(InputError) as caught:
        translate_errors(messages_from_records(raw, schema=row_schema()).collect)
    assert f"topic {topic} partition 0, offset 1" in str(caught.value)
    rows = sorted(messages_from_records(raw, schema=row_schema(), lenient=True).collect(),
                  key=lambda r: r["_offset"])
    assert [r["_error"] is None for r in rows] == [True, False, False]
    assert "tombstone" in rows[2]["_error"]

    with pytest.raises(SchemaError, match="missing: offset"):
        messages_from_records(raw.drop("offset"), schema=row_schema())
    with pytest.raises(SchemaError, match="needs the rows' schema"):
        messages_from_records(raw)
