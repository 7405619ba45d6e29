"""The `kafka-cdc` data source (`spark/kafka_source.py`): topics of Materialize CDC messages
read on the executors, batch and streaming, against librdkafka's mock cluster.

The oracle is `kafka.TopicReader`, the driver-side reader the source's tasks are checked
against record by record: the same (partition, offset) must give the same message."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.errors import InputError
from changelake.formats.materialize import CdcSchema, encode_confluent
from changelake.kafka import (
    MockCluster,
    RegistryServer,
    SchemaRegistry,
    TopicReader,
    write_topic,
)
from changelake.protocol import Updates
from changelake.protocol.messages import Message
from changelake.simulate import random_history, write
from changelake.spark import register
from changelake.spark.errors import translate_errors
from changelake.spark.kafka_source import share
from changelake.spark.source import data_type_of, message_type
from tests.support.kafka_helpers import cluster, new_topic, produce_raw, registry, row_schema
from tests.support.seeding import seeded

__all__ = ["cluster", "registry"]  # fixtures

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def source(spark: Any) -> Any:
    """A fresh `spark.read.format("kafka-cdc")` each call (a reader keeps its options)."""
    register(spark)
    return lambda: spark.read.format("kafka-cdc")


def produce(cluster: MockCluster, topic: str, messages: list[Message], rng: random.Random,
            **options: Any) -> int:
    """The messages, out of order, about a third of them twice; how many records that made."""
    records = list(messages) + rng.sample(list(messages), len(messages) // 3)
    rng.shuffle(records)
    return write_topic(records, bootstrap=cluster.bootstrap, topic=topic,
                       schema=row_schema(), **options).messages


def message_key(message: Message) -> tuple:
    """A message as plain values (the oracle's side)."""
    if isinstance(message, Updates):
        return ("updates", tuple((d.get("id"), d.get("v"), t, r) for d, t, r in message.updates))
    return ("progress", tuple(message.lower.elements), tuple(message.upper.elements),
            tuple(tuple(c) for c in message.counts))


def row_key(row: Any) -> tuple:
    """A source row's message as plain values (the data source's side)."""
    if row["updates"] is not None:
        return ("updates", tuple((u["data"]["id"], u["data"]["v"], u["time"], u["diff"])
                                 for u in row["updates"]))
    p = row["progress"]
    return ("progress", tuple(p["lower"]), tuple(p["upper"]),
            tuple((c["time"], c["count"]) for c in p["counts"]))


def oracle(cluster: MockCluster, topic: str, **options: Any) -> dict[tuple[str, int], tuple]:
    """Every record of the topic as `TopicReader` decodes it: (_file, _offset) -> message."""
    out = {}
    with TopicReader(cluster.bootstrap, topic, **options) as source:
        for record in source.records():
            message = source.message(record)
            assert message is not None
            out[(f"topic {topic} partition {record.partition}", record.offset)] = \
                message_key(message)
    return out


def rows_by_place(rows: list[Any]) -> dict[tuple[str, int], tuple]:
    out = {}
    for row in rows:
        place = (row["_file"], row["_offset"])
        assert place not in out, f"{place} read twice"
        assert row["_line"] is None and row["_error"] is None
        out[place] = row_key(row)
    return out


def within(bounds: tuple[int, int], offset: int) -> bool:
    return bounds[0] <= offset < bounds[1]


def schema_text() -> str:
    return orjson.dumps(row_schema().avro).decode()


def test_rows_equal_what_the_topic_reader_reads(cluster: MockCluster, registry: RegistryServer,
                                               source: Any, tmp_path: Path) -> None:
    """Frames of schema id 0 and of a registry id, produced twice and out of order over four
    partitions: each (partition, offset) gives TopicReader's message, in the materialize-cdc
    source's shape. Without a schema file the rows are typed by the registry's subject."""
    rng = seeded(81)
    messages = write(random_history(rng, updates=150, times=9), batch_size=5)
    topic = new_topic(cluster, partitions=4)
    half = len(messages) // 2
    produced = produce(cluster, topic, messages[:half], rng, schema_registry=registry.url)
    produced += produce(cluster, topic, messages[half:], rng)
    expected = oracle(cluster, topic, schema=row_schema(), schema_registry=registry.url)
    assert len(expected) == produced

    schema_file = tmp_path / "schema.json"
    schema_file.write_text(schema_text())
    df = (source().option("kafka.bootstrap.servers", cluster.bootstrap).option("topics", topic)
          .option("schema", str(schema_file)).option("schemaRegistry", registry.url).load())
    data_type, _ = data_type_of(row_schema())
    assert df.schema == message_type(data_type)
    assert df.rdd.getNumPartitions() == 4  # one task per topic-partition
    assert rows_by_place(df.collect()) == expected
    # the file may hold the rows' record alone, as any --schema FILE may
    schema_file.write_bytes(orjson.dumps(row_schema().avro[0]["items"]["fields"][0]["type"]))
    by_record = (source().option("kafka.bootstrap.servers", cluster.bootstrap)
                 .option("topics", topic).option("schema", str(schema_file))
                 .option("schemaRegistry", registry.url).load())
    assert rows_by_place(by_record.collect()) == expected

    # registry only: typed by the subject's latest schema; id 0 frames are unknown to it
    only = (source().option("bootstrap", cluster.bootstrap).option("topics", topic)
            .option("schemaRegistry", registry.url).option("lenient", "true").load())
    assert only.schema == message_type(data_type)
    rows = only.collect()
    set_aside = [r for r in rows if r["_error"] is not None]
    assert all("unknown schema id 0" in r["_error"] for r in set_aside)
    registry_rows = rows_by_place([r for r in rows if r["_error"] is None])
    assert registry_rows == {k: v for k, v in expected.items() if k in registry_rows}
    assert len(registry_rows) + len(set_aside) == produced
    assert 0 < len(set_aside) < produced

    # registry only, and no subject for the topic: nothing types the rows
    bare = new_topic(cluster, partitions=1)
    with pytest.raises(InputError, match=f"kafka-cdc: the registry at {registry.url} has no "
                                         f"subject {bare}-value"):
        translate_errors(lambda: source().option("bootstrap", cluster.bootstrap)
                         .option("topics", bare).option("schemaRegistry", registry.url).load())


def test_offsets_bound_the_read(cluster: MockCluster, source: Any) -> None:
    rng = seeded(82)
    messages = write(random_history(rng, updates=120, times=5), batch_size=4)
    topic = new_topic(cluster, partitions=3)
    produce(cluster, topic, messages, rng)
    everything = oracle(cluster, topic, schema=row_schema())
    ends = {p: 1 + max(o for (f, o) in everything if f.endswith(f" {p}")) for p in range(3)}
    assert min(ends.values()) >= 4, ends
    starting = {topic: {"0": 2, "2": ends[2] - 1}}  # partition 1: earliest
    ending = {topic: {"0": ends[0] - 1, "1": -1}}  # partition 2: latest

    def load(**options: str) -> Any:
        frame = (source().option("kafka.bootstrap.servers", cluster.bootstrap)
                 .option("topics", topic).option("avroSchema", schema_text()))
        return frame.options(**options).load()

    df = load(startingOffsets=json.dumps(starting), endingOffsets=json.dumps(ending))
    got = rows_by_place(df.collect())
    bounds = {0: (2, ends[0] - 1), 1: (0, ends[1]), 2: (ends[2] - 1, ends[2])}
    assert got == {(f, o): m for (f, o), m in everything.items()
                   if within(bounds[int(f.rsplit(" ", 1)[1])], o)}
    assert len(load(startingOffsets="latest").collect()) == 0
    assert len(load(endingOffsets="earliest").collect()) == 0
    assert len(load().collect()) == len(everything)

    beyond = json.dumps({topic: {"1": ends[1] + 5}})
    with pytest.raises(InputError, match=f"kafka-cdc: topic {topic} partition 1: "
                                         f"startingOffsets {ends[1] + 5} is beyond"):
        translate_errors(load(startingOffsets=beyond).collect)
    with pytest.raises(InputError, match="kafka-cdc: startingOffsets must be"):
        translate_errors(lambda: load(startingOffsets="{nonsense").collect())


def test_a_bad_record_is_named_or_set_aside(cluster: MockCluster, registry: RegistryServer,
                                            source: Any) -> None:
    rng = seeded(83)
    messages = write(random_history(rng, updates=30, times=4), batch_size=4)
    topic = new_topic(cluster, partitions=2)
    good = encode_confluent(messages[0], row_schema(), 0)
    other = CdcSchema.for_fields([{"name": "id", "type": "long"}, {"name": "w", "type": "string"}])
    other_id = SchemaRegistry(registry.url).register("other-value", other)
    wrong = encode_confluent(Updates([({"id": 1, "w": "x"}, 1, 1)]), other, other_id)
    produce_raw(cluster, topic, [(1, good), (1, good), (1, b"\x00\x00\x00\x00\x00\x07junk"),
                                 (0, good), (1, None), (1, good)])

    def load(lenient: bool) -> Any:
        return (source().option("bootstrap", cluster.bootstrap).option("topics", topic)
                .option("avroSchema", schema_text()).option("schemaRegistry", registry.url)
                .option("lenient", str(lenient)).load())

    with pytest.raises(InputError) as caught:
        translate_errors(load(False).collect)
    text = str(caught.value)
    assert f"topic {topic} partition 1, offset 2" in text and "\n" not in text, text
    assert "corrupt Avro" in text or "left over" in text, text

    rows = load(True).collect()
    errors = {(r["_file"], r["_offset"]): r["_error"] for r in rows if r["_error"] is not None}
    assert set(errors) == {(f"topic {topic} partition 1", 2), (f"topic {topic} partition 1", 3)}
    assert "tombstone" in errors[(f"topic {topic} partition 1", 3)]
    assert all(r["updates"] is None and r["progress"] is None for r in rows
               if r["_error"] is not None)
    assert sorted((r["_file"], r["_offset"]) for r in rows if r["_error"] is None) == [
        (f"topic {topic} partition 0", 0), (f"topic {topic} partition 1", 0),
        (f"topic {topic} partition 1", 1), (f"topic {topic} partition 1", 4)]

    # a frame whose rows are of another schema: named in strict mode, set aside in lenient
    topic = new_topic(cluster, partitions=1)
    produce_raw(cluster, topic, [(0, good), (0, wrong), (0, good)])
    with pytest.raises(InputError, match=f"topic {topic} partition 0, offset 1: the topics' "
                                         "frames carry more than one row schema"):
        translate_errors(load(False).collect)
    rows = load(True).collect()
    assert [(r["_offset"], r["_error"] is not None) for r in sorted(
        rows, key=lambda r: r["_offset"])] == [(0, False), (1, True), (2, False)]


def test_stream_resumes_from_its_checkpoint(spark: Any, cluster: MockCluster, source: Any,
                                           tmp_path: Path) -> None:
    """Two availableNow runs on one checkpoint, records produced before each: together they
    read every record exactly once; the second (at most 7 records a micro-batch) only the
    new ones."""
    rng = seeded(84)
    messages = write(random_history(rng, updates=120, times=8), batch_size=4)
    topic = new_topic(cluster, partitions=3)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(**options: str) -> Any:
        stream = (spark.readStream.format("kafka-cdc")
                  .option("kafka.bootstrap.servers", cluster.bootstrap).option("topics", topic)
                  .option("avroSchema", schema_text()).options(**options).load())
        query = (stream.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
                 .start())
        query.awaitTermination(300)
        assert query.exception() is None
        return query

    def read_out() -> dict[tuple[str, int], tuple]:
        return rows_by_place(spark.read.parquet(str(out)).collect())

    cut = len(messages) // 2
    first = produce(cluster, topic, messages[:cut], rng)
    run()
    after_first = read_out()
    assert after_first == oracle(cluster, topic, schema=row_schema())
    assert len(after_first) == first

    second = produce(cluster, topic, messages[cut:], rng)
    query = run(maxRecordsPerTrigger="7")
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(batches) == second and max(batches) <= 7  # only the new records, in steps
    everything = read_out()  # rows_by_place: nothing read twice
    assert everything == oracle(cluster, topic, schema=row_schema())
    assert len(everything) == first + second


def test_share_spreads_a_budget_fairly() -> None:
    backlog = {("t", 0): 10, ("t", 1): 1, ("t", 2): 0, ("u", 0): 5}
    assert share(backlog, 100) == backlog
    granted = share(backlog, 7)
    assert sum(granted.values()) == 7 and granted[("t", 1)] == 1 and granted[("t", 2)] == 0
    assert all(granted[k] <= n for k, n in backlog.items())
    assert abs(granted[("t", 0)] - granted[("u", 0)]) <= 1
    assert share(backlog, 0) == dict.fromkeys(backlog, 0)
