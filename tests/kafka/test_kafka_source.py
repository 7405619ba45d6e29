"""The Kafka source against the mock cluster: bounded reads, consumer-group resumption with the
reader's state, and bad records located at topic, partition and offset (strict stops, lenient
sets aside and goes on)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from changelake.errors import InputError, SchemaError
from changelake.formats.materialize import SetAside, encode_confluent
from changelake.kafka import (
    MockCluster,
    RegistryServer,
    SchemaRegistry,
    TopicError,
    TopicReader,
    decode_topic,
    read_topic,
    value_subject,
    write_topic,
)
from changelake.kafka.broker import KafkaBroker
from changelake.protocol import collect
from changelake.simulate import random_history, write
from tests.support.kafka_helpers import (
    as_set,
    cluster,
    new_topic,
    produce_raw,
    registry,
    row_schema,
)
from tests.support.seeding import seeded

__all__ = ["cluster", "registry"]  # fixtures


def history_lines(out: bytes) -> tuple[set[tuple], list]:
    """A decode's output: its updates, and its last frontier."""
    lines = [orjson.loads(line) for line in out.splitlines()]
    updates = {(repr(sorted(x["data"].items())), x["time"], x["diff"]) for x in lines
               if "data" in x}
    return updates, lines[-1]["frontier"]


def truth_lines(truth: list) -> set[tuple]:
    return {(repr(sorted(dict(d).items())), t, r) for d, t, r in truth}


def test_a_read_is_bounded_by_the_ends_when_it_starts(cluster: MockCluster) -> None:
    history = random_history(seeded(21), updates=120, times=8)
    topic = new_topic(cluster, partitions=3)
    messages = write(history, batch_size=5)
    half = len(messages) // 2
    write_topic(messages[:half], bootstrap=cluster.bootstrap, topic=topic, schema=row_schema())
    with TopicReader(cluster.bootstrap, topic, schema=row_schema()) as reader:
        ranges = reader.plan()
        assert sum(r.end - r.start for r in ranges) == half
        # produced after the plan: left for the next read
        write_topic(messages[half:], bootstrap=cluster.bootstrap, topic=topic,
                    schema=row_schema())
        assert len(list(reader.messages())) == half
    assert len(read_topic(cluster.bootstrap, topic, schema=row_schema())) == len(messages)


def test_an_empty_topic_reads_nothing(cluster: MockCluster) -> None:
    topic = new_topic(cluster, partitions=2)
    out = io.BytesIO()
    report = decode_topic(cluster.bootstrap, topic, out, schema=row_schema())
    assert out.getvalue() == b'{"frontier":[0]}\n' and report.updates == 0


def test_missing_topic_and_missing_schema(cluster: MockCluster) -> None:
    with pytest.raises(TopicError, match="topic 'nothing-here' does not exist"):
        read_topic(cluster.bootstrap, "nothing-here", schema=row_schema(),
                   config={"allow.auto.create.topics": False})
    with pytest.raises(SchemaError, match="--schema FILE or --schema-registry URL"):
        read_topic(cluster.bootstrap, "nothing-here")


def test_group_resumes_with_the_reader_state(broker: KafkaBroker, tmp_path: Path) -> None:
    """Three runs of one group, each after more messages: each reads only what is new, and
    together they print the history exactly once. On the real broker: its group coordinator
    keeps the committed offsets."""
    history = random_history(seeded(22), updates=300, times=15)
    topic = new_topic(broker, partitions=4)
    messages = write(history, batch_size=4)
    state = tmp_path / "reader.json"
    thirds = [messages[: len(messages) // 3], messages[len(messages) // 3: 2 * len(messages) // 3],
              messages[2 * len(messages) // 3:]]
    printed: list[tuple] = []
    read_before = 0
    for part in thirds:
        write_topic(part, bootstrap=broker.bootstrap, topic=topic, schema=row_schema())
        out = io.BytesIO()
        decode_topic(broker.bootstrap, topic, out, schema=row_schema(), group="g1",
                     state=state)
        updates, frontier = history_lines(out.getvalue())
        printed += sorted(updates)
        with TopicReader(broker.bootstrap, topic, group="g1", schema=row_schema()) as reader:
            committed = reader.committed()
            assert sum(committed.values()) == read_before + len(part)
            read_before += len(part)
    assert len(printed) == len(set(printed))
    assert set(printed) == truth_lines(history.truth)
    assert frontier == []


def test_group_needs_state(cluster: MockCluster) -> None:
    with pytest.raises(InputError, match=r"--group .* --state FILE"):
        decode_topic(cluster.bootstrap, new_topic(cluster), io.BytesIO(), schema=row_schema(),
                     group="g2")


def bad_topic(cluster: MockCluster, registry: RegistryServer) -> tuple[str, list, dict]:
    """A topic of good messages with bad records among them; the bad ones by (partition,
    offset) with the words their error must contain."""
    history = random_history(seeded(23), updates=150, times=10)
    topic = new_topic(cluster, partitions=2)
    schema = row_schema()
    schema_id = SchemaRegistry(registry.url).register(value_subject(topic), schema)
    messages = write(history, batch_size=5)
    good = encode_confluent(messages[0], schema, schema_id)
    bad = {
        (0, b"hello, not avro"): "not a Confluent-framed or single-object Avro message",
        (1, b"\x01" + good[1:]): "not a Confluent-framed or single-object Avro message",
        (0, b"\x00" + struct.pack(">I", 4242) + good[5:]): "unknown schema id 4242",
        (1, good[:-3]): "truncated or corrupt Avro message",
        (0, None): "tombstone",
    }
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for index, message in enumerate(messages):  # good ones round-robin, bad ones in between
        producer.produce(topic, value=encode_confluent(message, schema, schema_id),
                         partition=index % 2)
        if index == 3:
            for partition, value in bad:
                producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0
    return topic, history.truth, {(p, v): why for (p, v), why in bad.items()}


def test_bad_records_strict_and_lenient(cluster: MockCluster, registry: RegistryServer) -> None:
    topic, truth, bad = bad_topic(cluster, registry)
    with pytest.raises(InputError) as caught:
        decode_topic(cluster.bootstrap, topic, io.BytesIO(), schema_registry=registry.url)
    assert f"topic {topic} partition " in str(caught.value) and ", offset " in str(caught.value)
    assert any(why in caught.value.reason for why in bad.values())

    out = io.BytesIO()
    report = decode_topic(cluster.bootstrap, topic, out, schema_registry=registry.url,
                          lenient=True)
    updates, frontier = history_lines(out.getvalue())
    assert updates == truth_lines(truth) and frontier == []
    assert len(report.set_aside) == len(bad)
    for item in report.set_aside:
        assert isinstance(item, SetAside)
        assert item.location.file in {f"topic {topic} partition 0", f"topic {topic} partition 1"}
        assert item.location.offset is not None and item.location.offset >= 2
    reasons = sorted(item.reason for item in report.set_aside)
    for why in bad.values():
        assert sum(why in reason for reason in reasons) == list(bad.values()).count(why)


def test_without_registry_only_id_zero_decodes(cluster: MockCluster,
                                               registry: RegistryServer) -> None:
    topic = new_topic(cluster, partitions=1)
    history = random_history(seeded(24), updates=40, times=4)
    write_topic(write(history), bootstrap=cluster.bootstrap, topic=topic, schema=row_schema(),
                schema_registry=registry.url)
    with pytest.raises(InputError, match=r"unknown schema id \d+ \(ids other than 0 need "
                                         "--schema-registry\\)"):
        read_topic(cluster.bootstrap, topic, schema=row_schema())
    # the registry's ids, and id 0 from the file, in one topic
    write_topic(write(history), bootstrap=cluster.bootstrap, topic=topic, schema=row_schema())
    result = collect(read_topic(cluster.bootstrap, topic, schema=row_schema(),
                                schema_registry=registry.url))
    assert as_set(result.updates) == as_set(history.truth)


def test_protocol_errors_name_the_record(cluster: MockCluster) -> None:
    """A well-framed message that breaks a protocol rule: the Reader's error names the
    topic, partition and offset it came from."""
    from changelake.protocol import Updates

    topic = new_topic(cluster, partitions=1)
    schema = row_schema()
    record = write(random_history(seeded(25), updates=10, times=2))[0]
    assert isinstance(record, Updates)
    data, time, _ = record.updates[0]
    conflicting = Updates([(data, time, 7), (data, time, 8)])
    produce_raw(cluster, topic, [(0, encode_confluent(conflicting, schema, 0))])
    with pytest.raises(Exception, match=rf"topic {topic} partition 0, offset 0.*conflicting-diff"):
        decode_topic(cluster.bootstrap, topic, io.BytesIO(), schema=schema)


def test_statements_on_one_partition_updates_reversed_on_others(cluster: MockCluster) -> None:
    """Any placement is correct: every progress statement first, on partition 0, then the
    update batches in reverse order over partitions 1 and 2, one of them twice."""
    from changelake.protocol import Progress

    history = random_history(seeded(26), updates=200, times=12)
    topic = new_topic(cluster, partitions=3)
    schema = row_schema()
    messages = write(history, batch_size=6)
    statements = [m for m in messages if isinstance(m, Progress)]
    batches = [m for m in messages if not isinstance(m, Progress)][::-1]
    records = [(0, encode_confluent(m, schema, 0)) for m in statements]
    records += [(1 + i % 2, encode_confluent(m, schema, 0)) for i, m in enumerate(batches)]
    records.append((2, encode_confluent(batches[0], schema, 0)))
    produce_raw(cluster, topic, records)
    out = io.BytesIO()
    decode_topic(cluster.bootstrap, topic, out, schema=schema)
    updates, frontier = history_lines(out.getvalue())
    assert updates == truth_lines(history.truth) and frontier == []


def test_one_range_reads_exactly_its_offsets(cluster: MockCluster) -> None:
    """A sub-range of one partition (what an executor of a later Spark source reads)."""
    from changelake.kafka import PartitionRange

    topic = new_topic(cluster, partitions=2)
    produce_raw(cluster, topic, [(p, f"{p}:{i}".encode()) for i in range(10) for p in (0, 1)])
    with TopicReader(cluster.bootstrap, topic, schema=row_schema()) as reader:
        assert {(r.partition, r.start, r.end) for r in reader.plan()} == {(0, 0, 10), (1, 0, 10)}
        got = [(r.partition, r.offset, r.value) for r in reader.records([PartitionRange(1, 3, 7)])]
    assert got == [(1, i, f"1:{i}".encode()) for i in range(3, 7)]
