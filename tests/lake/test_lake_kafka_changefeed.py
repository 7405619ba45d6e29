"""`ingest --kafka --from debezium|ydb` (`lake/kafka_changefeed.py`): changefeed topics into a
lake table exactly once, resuming from the offsets the table's commits recorded.

The reference is the file ingest of the same events (`ingest.ingest --from`, one run, closed):
after every run over a growing topic, the Kafka table holds exactly the reference's updates
below its frontier; after a closing run, exactly all of them. Runs read only from where the last
commit left each partition, a run with nothing new commits nothing, and a connector restart
that re-sends a tail is absorbed."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.errors import ChangefeedError, InputError, LakeError
from changelake.kafka import MockCluster
from changelake.kafka.broker import KafkaBroker
from changelake.lake import Lake, ingest
from changelake.lake.kafka_changefeed import ingest_changefeed_topics
from tests.convert.test_convert_history import write_ydb
from tests.kafka.test_kafka_changefeed import (
    Feed,
    _key,
    pg_feed,
    producer,
    write_files,
    ydb_history,
)
from tests.support.kafka_helpers import Cluster, cluster, new_topic
from tests.support.seeding import seeded

__all__ = ["cluster"]  # fixtures

pytestmark = pytest.mark.spark

SMALL_YDB = {"columns": [{"name": "id", "type": "Uint64"}, {"name": "name", "type": "Utf8"},
                         {"name": "score", "type": "Double"}], "primary_key": ["id"]}


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


def updates(lake: Lake, name: str, below: int | None = None) -> Counter:
    """Every update the table holds, as committed; only those before `below` if given."""
    out: Counter = Counter()
    for r in lake.table(name).updates().collect():
        if below is None or r["_time"] < below:
            row = r.asDict()
            out[tuple(sorted((k, str(v)) for k, v in row.items()))] += 1
    return out


def group_offsets(cluster: Cluster, group: str, topic: str, partitions: int
                  ) -> dict[int, int]:
    """The offsets a consumer group has committed for the topic's partitions."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        marks = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                   timeout=10)
    finally:
        consumer.close()
    return {m.partition: m.offset for m in marks if m.offset >= 0}


def _xid(value: bytes) -> int:
    event = orjson.loads(value)
    return (event.get("payload") or event)["source"]["txId"]


def produce_debezium(cluster: Cluster, data: str, tx_topic: str | None, feed: Feed,
                     events: slice, partitions: int) -> None:
    """The events of `events` on the table's topic (by key), and the transaction topic's BEGIN
    and END of each transaction whose last event is among them."""
    out = producer(cluster)
    chosen = feed.events[events]
    for n, (key, value) in enumerate(chosen):
        out.produce(data, key=_key(key, n % 3 == 0), value=value,
                    partition=key["id"] % partitions)
    if tx_topic is not None:
        last = {_xid(v): i for i, (_, v) in enumerate(feed.events) if v is not None}
        start, stop, _ = events.indices(len(feed.events))
        for value in feed.transactions:
            xid = int(orjson.loads(value)["id"].split(":")[0])
            if xid in last and start <= last[xid] < stop:
                out.produce(tx_topic, value=value, partition=0)
    assert out.flush(30) == 0


def reference(lake: Lake, paths: list[Path], source: str, **options: Any) -> str:
    name = f"ref_{uuid.uuid4().hex[:8]}.t"
    ingest.ingest(lake, name, paths, source=source, close=True, **options)
    return name


# Both in the slow tier (25 s each): the default run measured 19m11s of its 20 minutes.
@pytest.mark.slow
@pytest.mark.parametrize("metadata", [False, True])
def test_debezium_topic_in_three_runs_then_closed_equals_the_file_ingest(
        broker: KafkaBroker, lake: Lake, tmp_path: Path, metadata: bool) -> None:
    """Three runs, a connector's replay, then closed; the runs' positions committed to a
    consumer group too, on the real broker (a group coordinator's offsets)."""
    cluster = broker
    feed = pg_feed(seeded(81 + metadata).randrange(1 << 30), transactions=16,
                   metadata=metadata)
    ref = reference(lake, write_files(feed, tmp_path, metadata=metadata), "debezium",
                    key=["id"])
    expected = updates(lake, ref)
    data = new_topic(cluster, 3)
    tx_topic = new_topic(cluster, 1) if metadata else None
    topics = [data] + ([tx_topic] if tx_topic else [])
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    n = len(feed.events)
    cuts = [0, n // 3, 2 * n // 3, n]
    produced = 0
    frontiers = []
    for i in range(3):
        produce_debezium(cluster, data, tx_topic, feed, slice(cuts[i], cuts[i + 1]), 3)
        produced += cuts[i + 1] - cuts[i]
        if i == 2:  # a connector restart re-sends the last third
            produce_debezium(cluster, data, None, feed, slice(cuts[2], n), 3)
        run = ingest_changefeed_topics(lake, name, cluster.bootstrap, topics,
                                       source="debezium", key=["id"], group=name)
        frontier = run.ingest.frontier[0]
        frontiers.append(frontier)
        assert group_offsets(cluster, name, data, 3) == \
            {p.partition: p.resume for p in run.partitions if p.topic == data}
        assert updates(lake, name) == updates(lake, ref, below=frontier), i
        if i:  # resumed where the last commit left each partition, not from the start
            assert run.records < produced
    assert frontiers == sorted(frontiers) and frontiers[-1] > 0
    version = lake.table(name).state().version
    again = ingest_changefeed_topics(lake, name, cluster.bootstrap, topics,
                                     source="debezium", key=["id"])
    assert lake.table(name).state().version == version and again.ingest.frontier == \
        [frontiers[-1]]
    ingest_changefeed_topics(lake, name, cluster.bootstrap, topics, source="debezium",
                             key=["id"], close=True)
    assert updates(lake, name) == expected
    assert lake.table(name).state().upper is None
    done = ingest_changefeed_topics(lake, name, cluster.bootstrap, topics,
                                    source="debezium", key=["id"])
    assert done.records == 0 and updates(lake, name) == expected


@pytest.mark.slow
def test_ydb_topic_with_barriers_in_two_runs_equals_the_file_ingest(
        cluster: MockCluster, lake: Lake, tmp_path: Path) -> None:
    history = ydb_history(seeded(47).randrange(1 << 30))
    history["txs"] = [(g, [(k, key, w) for k, key, w in ops if key < 100], b)
                      for g, ops, b in history["txs"]]
    history["txs"] = [t for t in history["txs"] if t[1]]
    history["txs"][-1] = (*history["txs"][-1][:2], True)
    paths, _, last_barrier = write_ydb(history, tmp_path)
    schema = tmp_path / "ydb.json"
    schema.write_bytes(orjson.dumps(SMALL_YDB))
    ref_open = f"ref_{uuid.uuid4().hex[:8]}.t"
    ingest.ingest(lake, ref_open, paths, source="ydb", schema=schema, key=["id"])
    topic = new_topic(cluster, 2)
    out = producer(cluster)
    files = [p.read_bytes().splitlines() for p in paths]
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    for half in (0, 1):
        for partition, lines in enumerate(files):
            cut = len(lines) // 2
            for line in (lines[:cut] if half == 0 else lines[cut:]):
                out.produce(topic, value=line, partition=partition)
        assert out.flush(30) == 0
        run = ingest_changefeed_topics(lake, name, cluster.bootstrap, topic, source="ydb",
                                       key=["id"], table_schema=schema)
        frontier = run.ingest.frontier[0]
        assert updates(lake, name) == updates(lake, ref_open, below=frontier)
    assert frontier == last_barrier
    assert updates(lake, name) == updates(lake, ref_open)
    # each partition resumes at its last barrier (or before): a run with nothing new reads
    # little, and keeps the frontier
    again = ingest_changefeed_topics(lake, name, cluster.bootstrap, topic, source="ydb",
                                     key=["id"], table_schema=schema)
    assert again.ingest.frontier == [last_barrier]
    assert 0 < again.records < sum(len(lines) for lines in files)
    # a bad record: strict stops at it, lenient sets it aside and keeps the frontier
    out.produce(topic, value=b'{"update": {}, "key": "not an array"}', partition=1)
    assert out.flush(30) == 0
    with pytest.raises(ChangefeedError, match=f"topic {topic} partition 1, offset [0-9]+: "):
        ingest_changefeed_topics(lake, name, cluster.bootstrap, topic, source="ydb",
                                 key=["id"], table_schema=schema)
    aside = ingest_changefeed_topics(lake, name, cluster.bootstrap, topic, source="ydb",
                                     key=["id"], table_schema=schema, lenient=True)
    assert aside.set_aside_count == 1 and aside.ingest.frontier == [last_barrier]
    assert str(aside.set_aside[0].location).startswith(f"topic {topic} partition 1, offset ")
    assert updates(lake, name) == updates(lake, ref_open)
    with pytest.raises(LakeError, match="offsets of a kafka ydb source"):
        ingest_changefeed_topics(lake, name, cluster.bootstrap, topic, source="debezium",
                                 key=["id"])


def test_a_partition_behind_the_others_holds_the_frontier_back(
        cluster: MockCluster, lake: Lake, tmp_path: Path) -> None:
    """Partition 2's events of the middle third are still on their way when the first run
    reads: the frontier stays below them (the least of the partitions' highest times), so
    once they arrive the table misses nothing; the next run, closed, equals the reference."""
    feed = pg_feed(seeded(86).randrange(1 << 30), transactions=12, metadata=False)
    ref = reference(lake, write_files(feed, tmp_path, metadata=False), "debezium", key=["id"])
    data = new_topic(cluster, 3)
    n = len(feed.events)
    out = producer(cluster)

    def send(events: list[tuple[dict, bytes | None]], partitions: set[int]) -> None:
        for key, value in events:
            if key["id"] % 3 in partitions:
                out.produce(data, key=_key(key, False), value=value, partition=key["id"] % 3)
        assert out.flush(30) == 0

    send(feed.events[:n // 3], {0, 1, 2})
    send(feed.events[n // 3:2 * n // 3], {0, 1})
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    first = ingest_changefeed_topics(lake, name, cluster.bootstrap, data, source="debezium",
                                     key=["id"])
    frontier = first.ingest.frontier[0]
    send(feed.events[n // 3:2 * n // 3], {2})
    send(feed.events[2 * n // 3:], {0, 1, 2})
    assert updates(lake, name) == updates(lake, ref, below=frontier)
    ingest_changefeed_topics(lake, name, cluster.bootstrap, data, source="debezium",
                             key=["id"], close=True)
    assert updates(lake, name) == updates(lake, ref)


def _inside_a_transaction(feed: Feed, start: int) -> int:
    """The first index from `start` on whose event continues the transaction of the event
    before it: a cut there leaves that transaction half read."""
    for i in range(max(start, 1), len(feed.events)):
        before, value = feed.events[i - 1][1], feed.events[i][1]
        if before is not None and value is not None and _xid(before) == _xid(value) != 90:
            return i
    raise AssertionError("no transaction of two events after the start")


@pytest.mark.parametrize("resend_metadata", [False, True])
def test_a_replayed_tail_after_a_cut_transaction_lets_the_frontier_advance(
        cluster: MockCluster, lake: Lake, tmp_path: Path, resend_metadata: bool) -> None:
    """The first run is cut inside a transaction; then the rest arrives, and a connector
    restart re-sends the tail from inside an earlier transaction (with or without its BEGIN
    and END records). The re-sent transactions are behind the committed frontier, their ENDs
    (or some of their events) before the resume offsets: they must not hold the frontier
    back, or every later run re-reads the same records and commits nothing. The next run
    reaches the end of the feed, and the table equals the file ingest of the whole history."""
    feed = pg_feed(seeded(88).randrange(1 << 30), transactions=12)
    ref = reference(lake, write_files(feed, tmp_path), "debezium", key=["id"])
    data, tx_topic = new_topic(cluster, 3), new_topic(cluster, 1)
    n = len(feed.events)
    replay_from = _inside_a_transaction(feed, n // 3)
    cut = _inside_a_transaction(feed, 2 * n // 3)
    assert _xid(feed.events[replay_from][1]) != _xid(feed.events[cut][1])
    name = f"k_{uuid.uuid4().hex[:8]}.t"

    def run() -> int:
        report = ingest_changefeed_topics(lake, name, cluster.bootstrap, [data, tx_topic],
                                          source="debezium", key=["id"])
        return report.ingest.frontier[0]

    produce_debezium(cluster, data, tx_topic, feed, slice(0, cut), 3)
    first = run()
    produce_debezium(cluster, data, tx_topic, feed, slice(cut, n), 3)
    produce_debezium(cluster, data, tx_topic if resend_metadata else None, feed,
                     slice(replay_from, n), 3)
    assert first < feed.times[-1] + 1
    assert [run(), run()] == [feed.times[-1] + 1] * 2  # every transaction is complete
    assert lake.table(name).state().upper == feed.times[-1] + 1
    assert updates(lake, name) == updates(lake, ref)


def test_the_resume_points_are_one_job(spark: Any) -> None:
    """Where each partition resumes (`_resume_facts`, see the module docstring) comes from one
    Spark job however many stages its query has: a follow runs it every round, and adaptive
    execution made each stage a job of its own (five, each with its own fixed cost)."""
    from changelake.lake.kafka_changefeed import _resume_facts

    marks = spark.createDataFrame([
        (0, "BEGIN", 0, None, "tx1"), (0, "change", 1, 5, "tx1"), (0, "END", 2, None, "tx1"),
        (0, "BEGIN", 3, None, "tx2"), (0, "change", 4, 12, "tx2"), (0, "END", 5, None, "tx2"),
        (1, "change", 7, 3, None),
    ], "file_index int, kind string, row long, time long, tx string")
    partitions = [("t", 0), ("t", 1)]
    context = spark.sparkContext
    for absorbed, expected in ((10, {("t", 0): (3, 12), ("t", 1): (None, 3)}),
                               (None, {("t", 0): (None, 12), ("t", 1): (None, 3)})):
        group = f"resume-{absorbed}-{uuid.uuid4().hex[:6]}"
        context.setJobGroup(group, group)
        try:
            # tx1 is committed (its change is below 10): partition 0 resumes at tx2's BEGIN,
            # before its change at 12; partition 1's change is committed, nothing is needed.
            assert _resume_facts(marks, absorbed, partitions) == expected
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
        assert len(context.statusTracker().getJobIdsForGroup(group)) == 1
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"


def test_a_bad_record_is_named_by_topic_partition_and_offset_and_nothing_commits(
        cluster: MockCluster, lake: Lake, tmp_path: Path) -> None:
    feed = pg_feed(5, transactions=6, metadata=False)
    data = new_topic(cluster, 2)
    produce_debezium(cluster, data, None, feed, slice(0, len(feed.events)), 2)
    out = producer(cluster)
    out.produce(data, value=b"{not json", partition=1)
    assert out.flush(30) == 0
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    with pytest.raises(ChangefeedError, match=f"topic {data} partition 1, offset [0-9]+: "):
        ingest_changefeed_topics(lake, name, cluster.bootstrap, data, source="debezium",
                                 key=["id"])
    # Spark's own connector: the same error on the real broker (test_spark_kafka_connector.py;
    # its Java clients do not run against librdkafka's mock cluster)
    assert not lake.exists(name)


def test_a_topic_of_heartbeats_makes_a_table_only_with_a_table_schema(
        cluster: MockCluster, lake: Lake, tmp_path: Path) -> None:
    """A new connector's topic may hold only heartbeats and transaction lines for a while: a
    run over it is no error of the input. Without row images there are no columns to create
    the table with, which the run says in one line (as `ingest --from` does, naming the
    topics and the CLI's option), committing nothing; with the table schema (`ingest
    --schema`) it creates the table, empty, and the changes that follow land in it."""
    data = new_topic(cluster, 1)
    out = producer(cluster)
    for value in (b'{"ts_ms": 5}', b'{"status": "BEGIN", "id": "9", "event_count": null}'):
        out.produce(data, value=value, partition=0)
    assert out.flush(30) == 0
    name = f"h_{uuid.uuid4().hex[:8]}.t"
    with pytest.raises(InputError, match=rf"no row images in the records read from {data} "
                                         r"\(.*\), and no --schema"):
        ingest_changefeed_topics(lake, name, cluster.bootstrap, data, source="debezium",
                                 key=["id"])
    assert not lake.exists(name)
    schema = tmp_path / "table.json"
    schema.write_text(orjson.dumps({"columns": [{"name": "id", "type": "Int64"},
                                                {"name": "name", "type": "Utf8"}],
                                    "primary_key": ["id"]}).decode())
    ingest_changefeed_topics(lake, name, cluster.bootstrap, data, source="debezium",
                             key=["id"], table_schema=schema)
    assert lake.table(name).current().count() == 0
    assert lake.table(name).schema.simpleString() == "struct<id:bigint,name:string>"
    for lsn, key in ((110, 1), (120, 2)):
        out.produce(data, partition=0, value=orjson.dumps({
            "op": "c", "before": None, "after": {"id": key, "name": f"n{key}"},
            "source": {"connector": "postgresql", "lsn": lsn, "txId": lsn,
                       "snapshot": "false", "sequence": f'["{lsn - 5}","{lsn}"]'}}))
    assert out.flush(30) == 0
    ingest_changefeed_topics(lake, name, cluster.bootstrap, data, source="debezium",
                             key=["id"], table_schema=schema, close=True)
    assert sorted((r["id"], r["name"]) for r in lake.table(name).current().collect()) == \
        [(1, "n1"), (2, "n2")]


BAD_RECORDS = [b"{not json", b"[1, 2]", b"\xff\xfe not text",
               b'{"op": "c", "after": {"id": 1}, "source": "not an object"}']


def test_lenient_sets_bad_records_aside_once_and_dead_letters_them(
        cluster: MockCluster, lake: Lake, tmp_path: Path) -> None:
    """Bad records among a Debezium topic's events: strict stops at the first, naming it;
    lenient converts the rest (the table equals the file ingest of the good events), reports
    each bad record once and produces it to the dead-letter topic with its location; a closing
    run re-reads some records but sets nothing aside again."""
    from tests.kafka.test_kafka_dead_letter import topic_records

    feed = pg_feed(seeded(87).randrange(1 << 30), transactions=8, metadata=False)
    ref = reference(lake, write_files(feed, tmp_path, metadata=False), "debezium", key=["id"])
    data, dead = new_topic(cluster, 2), new_topic(cluster, 1)
    n = len(feed.events)
    produce_debezium(cluster, data, None, feed, slice(0, n // 2), 2)
    out = producer(cluster)
    for i, value in enumerate(BAD_RECORDS):
        out.produce(data, value=value, key=b"k%d" % i, partition=i % 2)
    assert out.flush(30) == 0
    produce_debezium(cluster, data, None, feed, slice(n // 2, n), 2)
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    with pytest.raises(ChangefeedError, match=f"topic {data} partition [01], offset [0-9]+: "):
        ingest_changefeed_topics(lake, name, cluster.bootstrap, data, source="debezium",
                                 key=["id"])
    first = ingest_changefeed_topics(lake, name, cluster.bootstrap, data, source="debezium",
                                     key=["id"], lenient=True, dead_letter_topic=dead)
    assert first.set_aside_count == first.dead_lettered == len(BAD_RECORDS)
    assert all(str(s.location).startswith(f"topic {data} partition ") for s in first.set_aside)
    frontier = first.ingest.frontier[0]
    assert updates(lake, name) == updates(lake, ref, below=frontier)
    letters = topic_records(cluster, dead)
    assert sorted(r.value for r in letters) == sorted(BAD_RECORDS)
    assert all(dict(r.headers)["changelake.topic"] == data.encode() for r in letters)
    closing = ingest_changefeed_topics(lake, name, cluster.bootstrap, data, source="debezium",
                                       key=["id"], close=True, lenient=True,
                                       dead_letter_topic=dead)
    assert closing.records > 0 and closing.set_aside_count == closing.dead_lettered == 0
    assert updates(lake, name) == updates(lake, ref)
    assert len(topic_records(cluster, dead)) == len(BAD_RECORDS)


# ------------------------------------------------------------------ follow, in process and CLI


def _table_updates(lake_dir: Path, table: str) -> tuple[Any, Counter]:
    """The committed manifest of a table a CLI run made, and its updates, read as the reads
    without a JVM read them (either table format)."""
    from changelake.lake import arrow
    from changelake.lake.identifier import TableIdentifier

    ident = TableIdentifier.parse(table)
    state = arrow.committed_state(lake_dir, ident)
    rows = arrow.updates(state, ident.directory(arrow.lake_tables_dir(lake_dir))).to_pylist()
    return state, Counter(tuple(sorted((k, str(v)) for k, v in r.items())) for r in rows)


@pytest.mark.slow
def test_cli_follow_killed_and_restarted_then_closed(
        cluster: MockCluster, lake: Lake, tmp_path: Path) -> None:
    """`ingest --follow --kafka --from debezium` follows a topic while its events arrive in
    thirds; it is killed with SIGKILL after its first commit and restarted (until idle);
    `ingest --kafka --close` then finishes it: the table equals the file ingest, nothing
    doubled; `status` shows the offsets."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cli = [str(Path(sys.executable).parent / "changelake")]
    feed = pg_feed(seeded(84).randrange(1 << 30), transactions=18, metadata=False)
    ref = reference(lake, write_files(feed, tmp_path, metadata=False), "debezium", key=["id"])
    data = new_topic(cluster, 3)
    lake_dir = tmp_path / "cli-lake"
    table_dir = lake_dir / "tables" / "default" / "t"
    base = [*cli, "ingest", "--lake", str(lake_dir), "--table", "t", "--key", "id",
            "--from", "debezium", "--kafka", cluster.bootstrap, "--topic", data,
            "--master", "local[1]"]
    n = len(feed.events)
    produce_debezium(cluster, data, None, feed, slice(0, n // 3), 3)
    follow = subprocess.Popen([*base, "--follow", "--trigger-seconds", "0.5"],
                              stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while not list((table_dir / "_state").glob("v*.json")) and time.monotonic() < deadline:
        assert follow.poll() is None, follow.stderr.read().decode() if follow.stderr else ""
        time.sleep(0.2)
    produce_debezium(cluster, data, None, feed, slice(n // 3, 2 * n // 3), 3)
    time.sleep(seeded(85).uniform(0, 3))
    os.killpg(follow.pid, signal.SIGKILL)
    follow.wait()
    produce_debezium(cluster, data, None, feed, slice(2 * n // 3, n), 3)
    again = subprocess.run([*base, "--follow", "--trigger-seconds", "0.5", "--until-idle",
                            "1"], capture_output=True, timeout=600)
    assert again.returncode == 0, again.stderr.decode()
    assert b"round 1: read " in again.stderr
    state, rows = _table_updates(lake_dir, "t")
    frontier = state.frontier[0]
    assert rows == updates(lake, ref, below=frontier)
    closing = subprocess.run([*base, "--close"], capture_output=True, timeout=600)
    assert closing.returncode == 0, closing.stderr.decode()
    state, rows = _table_updates(lake_dir, "t")
    assert state.frontier == () and rows == updates(lake, ref)
    status = subprocess.run([*cli, "status", "--lake", str(lake_dir), "--format", "jsonl",
                             "--master", "local[1]", "--live"], capture_output=True,
                            timeout=300)
    assert status.returncode == 0, status.stderr.decode()
    (table,) = [orjson.loads(line) for line in status.stdout.splitlines()]
    assert {o["topic"] for o in table["offsets"]} == {data}
    assert all(o["lag"] == 0 for o in table["offsets"])


@pytest.mark.slow
def test_a_truncate_on_the_topic_lands_in_two_runs_equal_to_the_file_ingest(
        broker: KafkaBroker, lake: Lake, tmp_path: Path) -> None:
    """Rows; then a truncate, more rows, and a connector's replay of the truncate, read by a
    second run over the first's table (its rows then retracted): the Spark path converts the
    truncate (the Kafka ingest refused it before), and once closed the table equals the file
    ingest of the same events."""
    from tests.convert.test_convert_history import PG_TABLE, write_pg
    from tests.spark.test_spark_changefeed_truncate import LAKE_HISTORY

    paths, _, _ = write_pg(LAKE_HISTORY, tmp_path)
    table = tmp_path / "table.json"
    table.write_bytes(orjson.dumps(PG_TABLE))
    ref = reference(lake, paths, "debezium", key=["id"], schema=table)
    expected = updates(lake, ref)
    lines = paths[0].read_bytes().splitlines()
    assert any(b'"op":"t"' in line for line in lines[4:])
    topic = new_topic(broker, 1)
    name = f"k_{uuid.uuid4().hex[:8]}.t"

    def produce(values: list[bytes]) -> None:
        out = producer(broker)
        for value in values:
            out.produce(topic, value=None if value == b"null" else value, partition=0)
        assert out.flush(30) == 0

    produce(lines[:4])
    first = ingest_changefeed_topics(lake, name, broker.bootstrap, [topic], source="debezium",
                                     key=["id"], table_schema=table)
    assert updates(lake, name) == updates(lake, ref, below=first.ingest.frontier[0])
    produce(lines[4:])
    second = ingest_changefeed_topics(lake, name, broker.bootstrap, [topic], source="debezium",
                                      key=["id"], table_schema=table)
    assert second.ingest.frontier[0] > first.ingest.frontier[0]
    assert updates(lake, name) == updates(lake, ref, below=second.ingest.frontier[0])
    assert any("-1" in dict(row)["_diff"] for row in updates(lake, name))
    ingest_changefeed_topics(lake, name, broker.bootstrap, [topic], source="debezium",
                             key=["id"], table_schema=table, close=True)
    assert updates(lake, name) == expected
