"""`ingest --kafka --lenient [--dead-letter-topic T]`: bad records set aside, reported, and
produced to a dead-letter topic before the lake commit (`lake/kafka_ingest.py`,
`kafka/dead_letter.py`), on librdkafka's mock cluster and the session's Spark."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from changelake.errors import InputError, LakeError
from changelake.formats.materialize import encode_confluent
from changelake.kafka import MockCluster, TopicError, TopicReader
from changelake.kafka.dead_letter import HEADERS, _ranges
from changelake.lake import Lake
from changelake.lake.kafka_ingest import SET_ASIDE_SAMPLE, ingest_topics
from changelake.protocol import Progress, Updates
from changelake.simulate import justified, random_history, write
from tests.support.kafka_helpers import cluster, new_topic, row_schema
from tests.support.seeding import seeded

__all__ = ["cluster"]  # fixtures

CLI = [str(Path(sys.executable).parent / "changelake")]

BAD = {  # what a bad record holds, and what its set-aside reason says
    "not a frame": (b'{"not": "a frame"}', "not a Confluent-framed"),
    "unknown schema id": (b"\x00\x00\x00\x03\xe7abc", "unknown schema id 999"),
    "corrupt Avro": (b"\x00\x00\x00\x00\x00\xff", "truncated or corrupt Avro"),
    "tombstone": (None, "a tombstone"),
}


def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.json"
    path.write_bytes(orjson.dumps(row_schema().avro))
    return path


def rows_of_truth(updates) -> Counter:
    return Counter((d.get("id"), d.get("v"), t, r) for d, t, r in updates)


def rows_of_table(lake: Lake, name: str) -> Counter:
    return Counter((r["id"], r["v"], r["_time"], r["_diff"])
                   for r in lake.table(name).updates().collect())


def produce(cluster: MockCluster, topic: str,
            records: list[tuple[int, bytes | None, bytes | None, list]]) -> list[int]:
    """Records (partition, key, value, headers) in order; the offset each got."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    offsets: list[int] = [-1] * len(records)

    def delivered(index: int):
        def callback(error, message) -> None:
            assert error is None, error
            offsets[index] = message.offset()
        return callback

    for i, (partition, key, value, headers) in enumerate(records):
        producer.produce(topic, value=value, key=key, partition=partition,
                         headers=headers or None, on_delivery=delivered(i))
    assert producer.flush(30) == 0
    return offsets


def topic_records(cluster: MockCluster, topic: str) -> list:
    """Every record of a topic (key, value, headers included), in partition and offset order."""
    with TopicReader(cluster.bootstrap, topic, framed=False) as reader:
        return sorted(reader.records(), key=lambda r: (r.partition, r.offset))


def good_and_bad(cluster: MockCluster, messages: list) -> tuple[str, dict]:
    """The messages spread over two partitions (each kind in turn), with the four bad records
    among them (two per partition, each with a key and a header); a fresh topic, and each bad
    record's (partition, offset) -> (key, value, reason)."""
    topic = new_topic(cluster, partitions=2)
    records = [(i % 2, None, encode_confluent(m, row_schema(), 0), [])
               for i, m in enumerate(messages)]
    bad_at = {}
    for n, (kind, (value, reason)) in enumerate(BAD.items()):
        at = (n + 1) * len(records) // (len(BAD) + 1)
        key = f"key-{n}".encode()
        records.insert(at, (n % 2, key, value, [("origin", kind.encode())]))
        bad_at[at] = (key, value, reason)
    offsets = produce(cluster, topic, records)
    return topic, {(records[i][0], offsets[i]): bad for i, bad in bad_at.items()}


@pytest.fixture
def lake(spark, tmp_path) -> Lake:
    return Lake(spark, tmp_path / "lake")


@pytest.mark.spark
def test_strict_stops_lenient_sets_aside_and_dead_letters(cluster: MockCluster, lake: Lake,
                                                          tmp_path: Path) -> None:
    history = random_history(seeded(81), updates=80, times=6)
    messages = write(history, batch_size=6)
    topic, bad = good_and_bad(cluster, messages)
    dead = new_topic(cluster, partitions=3)
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    schema = schema_file(tmp_path)

    # strict: the first bad record of a partition stops the run, nothing committed
    with pytest.raises(InputError) as caught:
        ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema)
    text = str(caught.value)
    assert "\n" not in text
    assert any(f"topic {topic} partition {p}, offset {o}: " in text and reason in text
               for (p, o), (_, _, reason) in bad.items()), text
    assert not lake.exists(name)
    assert topic_records(cluster, dead) == []

    # lenient: exactly the good updates, each bad record reported and dead-lettered
    first = ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema, lenient=True,
                          dead_letter_topic=dead)
    assert first.ingest.frontier == []  # the history closes: the bad records took nothing
    assert rows_of_table(lake, name) == rows_of_truth(history.truth)
    assert first.records == len(messages) + len(bad)
    assert first.set_aside_count == first.dead_lettered == len(bad)
    assert [str(s.location) for s in first.set_aside] == [
        f"topic {topic} partition {p}, offset {o}" for p, o in sorted(bad)]
    for s, where in zip(first.set_aside, sorted(bad), strict=True):
        assert bad[where][2] in s.reason, s
    # every set-aside record absorbed: each partition resumes at its end
    assert all(p.resume == p.end for p in first.partitions)

    letters = topic_records(cluster, dead)
    assert len(letters) == len(bad)
    found = {}
    for letter in letters:
        headers = dict(letter.headers)
        assert [h for h, _ in letter.headers][-len(HEADERS):] == list(HEADERS)
        assert headers["changelake.topic"] == topic.encode()
        where = (int(headers["changelake.partition"]), int(headers["changelake.offset"]))
        found[where] = (letter.key, letter.value, headers["changelake.error"].decode())
        assert headers["origin"] in {k.encode() for k in BAD}  # the original header kept
    assert set(found) == set(bad)
    for where, (key, value, error) in found.items():
        assert (key, value) == bad[where][:2]  # the original bytes, unchanged
        assert bad[where][2] in error

    # a second lenient ingest reads nothing again and produces nothing again
    again = ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema, lenient=True,
                          dead_letter_topic=dead)
    assert again.records == 0 and again.set_aside_count == again.dead_lettered == 0
    assert again.ingest.commit.skipped
    assert len(topic_records(cluster, dead)) == len(bad)
    assert rows_of_table(lake, name) == rows_of_truth(history.truth)


@pytest.mark.spark
def test_a_record_read_again_is_not_set_aside_again(cluster: MockCluster, lake: Lake,
                                                    tmp_path: Path) -> None:
    """Updates at a time not final yet hold the partition's resume point before a bad record
    that follows them: the next run reads that record again, and neither reports nor
    dead-letters it a second time."""
    history = random_history(seeded(82), updates=60, times=5)
    messages = write(history, batch_size=4)
    last = max(i for i, m in enumerate(messages) if isinstance(m, Progress))
    cut = max(i for i, m in enumerate(messages[:last]) if isinstance(m, Progress)) + 2
    assert isinstance(messages[cut - 1], Updates)  # after the last statement: not final yet
    topic = new_topic(cluster, partitions=1)
    dead = new_topic(cluster, partitions=1)
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    schema = schema_file(tmp_path)
    framed = [(0, None, encode_confluent(m, row_schema(), 0), []) for m in messages]
    (bad_offset,) = produce(cluster, topic, [*framed[:cut], (0, b"k", b"junk", [])])[cut:]

    first = ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema, lenient=True,
                          dead_letter_topic=dead)
    updates, frontier = justified(history.truth, messages[:cut])
    assert first.ingest.frontier == frontier != []
    assert rows_of_table(lake, name) == rows_of_truth(updates)
    (partition,) = first.partitions
    assert partition.resume < bad_offset < partition.end  # the bad record will be read again
    assert first.set_aside_count == first.dead_lettered == 1
    assert str(first.set_aside[0].location) == f"topic {topic} partition 0, offset {bad_offset}"

    produce(cluster, topic, framed[cut:])
    second = ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema, lenient=True,
                           dead_letter_topic=dead)
    assert second.partitions[0].start <= bad_offset  # read again ...
    assert second.set_aside_count == second.dead_lettered == 0  # ... not set aside again
    assert second.ingest.frontier == []
    assert rows_of_table(lake, name) == rows_of_truth(history.truth)
    assert [(r.offset, r.value) for r in topic_records(cluster, dead)] == [(0, b"junk")]


@pytest.mark.spark
def test_the_report_names_a_bounded_sample(cluster: MockCluster, lake: Lake,
                                           tmp_path: Path) -> None:
    """More records set aside than the sample holds: all counted, the first ones named in
    partition and offset order; without a dead-letter topic nothing is produced."""
    topic = new_topic(cluster, partitions=2)
    junk = SET_ASIDE_SAMPLE + 7
    messages = write(random_history(seeded(83), updates=20, times=3), batch_size=5)
    produce(cluster, topic, [(i % 2, None, f"junk {i}".encode(), []) for i in range(junk)]
            + [(0, None, encode_confluent(m, row_schema(), 0), []) for m in messages])
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    run = ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema_file(tmp_path),
                        lenient=True)
    assert run.set_aside_count == junk and run.dead_lettered == 0
    expected = sorted((i % 2, i // 2) for i in range(junk))[:SET_ASIDE_SAMPLE]
    assert [str(s.location) for s in run.set_aside] == [
        f"topic {topic} partition {p}, offset {o}" for p, o in expected]
    assert run.ingest.frontier == []


@pytest.mark.spark
def test_dead_letter_topic_refusals(cluster: MockCluster, lake: Lake, tmp_path: Path) -> None:
    topic = new_topic(cluster, partitions=1)
    schema = schema_file(tmp_path)
    with pytest.raises(LakeError, match="give --lenient too"):
        ingest_topics(lake, "t", cluster.bootstrap, topic, schema=schema,
                      dead_letter_topic="dlq")
    with pytest.raises(LakeError, match="is one of the topics read"):
        ingest_topics(lake, "t", cluster.bootstrap, topic, schema=schema, lenient=True,
                      dead_letter_topic=topic)
    with pytest.raises(LakeError, match="reads with kafka-cdc only, not reader kafka"):
        ingest_topics(lake, "t", cluster.bootstrap, topic, schema=schema, lenient=True,
                      reader="kafka")
    with pytest.raises(TopicError, match="dead-letter topic: topic 'no-such' does not exist"):
        ingest_topics(lake, "t", cluster.bootstrap, topic, schema=schema, lenient=True,
                      dead_letter_topic="no-such")
    assert not lake.exists("t")


@pytest.mark.slow
@pytest.mark.spark
def test_a_lenient_topic_follow_sets_aside_and_dead_letters(cluster: MockCluster, lake: Lake,
                                                            tmp_path: Path) -> None:
    """`ingest --follow --kafka --lenient`: each micro-batch's bad records are reported and
    dead-lettered before its commit; the table holds exactly the good updates."""
    from changelake.lake.follow import TOPICS, follow, topic_source, topics_address
    from changelake.spark.kafka_set_aside import FollowSetAside

    history = random_history(seeded(85), updates=40, times=4)
    messages = write(history, batch_size=6)
    topic, bad = good_and_bad(cluster, messages)
    dead = new_topic(cluster, partitions=2)
    name = f"f_{uuid.uuid4().hex[:8]}"
    reports = []
    hook = FollowSetAside(cluster.bootstrap, dead, report=reports.append)
    ran = follow(lake, name, topic_source(cluster.bootstrap, [topic],
                                          schema=schema_file(tmp_path), lenient=True,
                                          max_records_per_trigger=len(messages) // 2),
                 topics_address(cluster.bootstrap, [topic]), kind=TOPICS, trigger_seconds=0.5,
                 until_idle=3, set_aside=hook)
    assert ran.committed >= 2
    assert rows_of_table(lake, name) == rows_of_truth(history.truth)
    assert sum(r.count for r in reports) == sum(r.dead_lettered for r in reports) == len(bad)
    named = sorted((s.location.file, s.location.offset) for r in reports for s in r.sample)
    assert named == sorted((f"topic {topic} partition {p}", o) for p, o in bad)
    letters = topic_records(cluster, dead)
    assert sorted((int(dict(x.headers)["changelake.partition"]),
                   int(dict(x.headers)["changelake.offset"]), x.key, x.value)
                  for x in letters) == sorted((*where, *bad[where][:2]) for where in bad)


def test_offsets_to_fetch_are_read_in_few_ranges() -> None:
    assert _ranges([3]) == [(3, 4)]
    assert _ranges([3, 4, 5, 60, 200, 201]) == [(3, 61), (200, 202)]


def test_cli_usage_errors(tmp_path: Path) -> None:
    lake_args = ["ingest", "--lake", str(tmp_path / "lake"), "--table", "t"]
    kafka = ["--kafka", "127.0.0.1:1", "--topic", "x", "--schema", __file__]
    for args, says in [
            (["--lenient", "f.jsonl"], b"--lenient and --dead-letter-topic go with --kafka"),
            (["--dead-letter-topic", "d", "f.jsonl"], b"go with --kafka"),
            ([*kafka, "--dead-letter-topic", "d"], b"give --lenient too"),
            (["--lenient", "--follow", str(tmp_path)], b"go with --kafka")]:
        usage = subprocess.run([*CLI, *lake_args, *args], capture_output=True, timeout=60)
        assert usage.returncode == 2 and says in usage.stderr, (args, usage.stderr)
    assert not (tmp_path / "lake").exists()  # refused before Spark started


@pytest.mark.slow
@pytest.mark.spark
def test_cli_lenient_ingest_reports_and_dead_letters(cluster: MockCluster,
                                                     tmp_path: Path) -> None:
    history = random_history(seeded(84), updates=40, times=4)
    messages = write(history, batch_size=6)
    topic, bad = good_and_bad(cluster, messages)
    dead = new_topic(cluster, partitions=1)
    run = subprocess.run(
        [*CLI, "ingest", "--lake", str(tmp_path / "lake"), "--table", "t", "--kafka",
         cluster.bootstrap, "--topic", topic, "--schema", str(schema_file(tmp_path)),
         "--lenient", "--dead-letter-topic", dead, "--master", "local[1]"],
        capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr.decode()
    lines = run.stderr.decode().splitlines()
    named = [line for line in lines if line.startswith("changelake: set aside: ")]
    assert named == [f"changelake: set aside: topic {topic} partition {p}, offset {o}: "
                     + line.split(f"offset {o}: ", 1)[1]
                     for (p, o), line in zip(sorted(bad), named, strict=True)]
    assert f"changelake: {len(bad)} record(s) set aside (lenient mode)" in lines
    assert f"changelake: {len(bad)} record(s) produced to dead-letter topic {dead}" in lines
    assert len(topic_records(cluster, dead)) == len(bad)


@pytest.mark.slow
@pytest.mark.spark
def test_cli_lenient_topic_follow_reports_and_dead_letters(cluster: MockCluster,
                                                           tmp_path: Path) -> None:
    history = random_history(seeded(86), updates=30, times=3)
    messages = write(history, batch_size=6)
    topic, bad = good_and_bad(cluster, messages)
    dead = new_topic(cluster, partitions=1)
    run = subprocess.run(
        [*CLI, "ingest", "--lake", str(tmp_path / "lake"), "--table", "t", "--follow",
         "--kafka", cluster.bootstrap, "--topic", topic, "--schema", str(schema_file(tmp_path)),
         "--lenient", "--dead-letter-topic", dead, "--trigger-seconds", "0.5",
         "--until-idle", "4", "--master", "local[1]"],
        capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr.decode()
    lines = run.stderr.decode().splitlines()
    named = sorted(line.split(": set aside: ", 1)[1].split(":", 1)[0] for line in lines
                   if ": set aside: " in line)
    assert named == sorted(f"topic {topic} partition {p}, offset {o}" for p, o in bad), lines
    totals = [int(line.split(": ")[2].split()[0]) for line in lines
              if "record(s) produced to dead-letter topic" in line]
    assert sum(totals) == len(bad), lines
    assert len(topic_records(cluster, dead)) == len(bad)
