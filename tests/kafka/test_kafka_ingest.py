"""`ingest --kafka`: topics of Materialize CDC messages into a lake table exactly once, resuming
from the offsets the table's commits recorded (`lake/kafka_ingest.py`).

In-process tests use the session's Spark and metastore with a fresh lake directory each; the
CLI tests run the console script (its own Spark, the lake's own embedded metastore), one of
them killed with SIGKILL at a seeded moment and run again. The lake a CLI test made is checked
from its files (the committed manifest and its Parquet file sets), without another Spark."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from changelake.errors import InputError, LakeError
from changelake.formats.materialize import CdcSchema, encode_confluent
from changelake.kafka import MockCluster, RegistryServer, SchemaRegistry, write_topic
from changelake.lake import Lake, api
from changelake.lake.kafka_ingest import ingest_topics
from changelake.protocol import Progress, Updates
from changelake.protocol.messages import Message
from changelake.simulate import justified, mangle, random_history, write
from tests.support.kafka_helpers import cluster, new_topic, produce_raw, registry, row_schema
from tests.support.seeding import seeded

__all__ = ["cluster", "registry"]  # fixtures

CLI = [str(Path(sys.executable).parent / "changelake")]


def rows_of_truth(updates) -> Counter:
    """Updates (Record, time, diff) as a multiset of (id, v, time, diff)."""
    return Counter((d.get("id"), d.get("v"), t, r) for d, t, r in updates)


def rows_of_table(lake: Lake, name: str) -> Counter:
    """Every update the table holds, as committed (each (row, time) once: nothing doubled)."""
    return Counter((r["id"], r["v"], r["_time"], r["_diff"])
                   for r in lake.table(name).updates().collect())


def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.json"
    path.write_bytes(orjson.dumps(row_schema().avro))
    return path


def split_at_statement(messages: list[Message]) -> int:
    """An index just after a progress statement near the middle: the prefix is complete up to
    that statement's upper, so a reader of it absorbs every message."""
    ends = [i + 1 for i, m in enumerate(messages) if isinstance(m, Progress)]
    return min(ends, key=lambda i: abs(i - len(messages) // 2))


def produce(cluster: MockCluster, topic: str, messages: list[Message], rng: random.Random,
            **options) -> int:
    """The messages, out of order, with about a third of them produced twice; how many
    records that made."""
    records = list(messages) + rng.sample(list(messages), len(messages) // 3)
    rng.shuffle(records)
    report = write_topic(records, bootstrap=cluster.bootstrap, topic=topic,
                         schema=row_schema(), **options)
    return report.messages


@pytest.fixture
def lake(spark, tmp_path) -> Lake:
    return Lake(spark, tmp_path / "lake")


@pytest.mark.spark
def test_resume_reads_only_the_new_offsets(cluster: MockCluster, registry: RegistryServer,
                                           lake: Lake, tmp_path: Path) -> None:
    """The first ingest reads frames whose schema only the registry knows; the second is given
    no registry, so re-reading any record of the first range would fail (unknown schema id):
    it succeeds, reading exactly the offsets produced since."""
    rng = seeded(71)
    history = random_history(rng, updates=240, times=14)
    messages = write(history, batch_size=6)
    cut = split_at_statement(messages)
    topic = new_topic(cluster, partitions=4)
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    produce(cluster, topic, messages[:cut], rng, schema_registry=registry.url)

    first = ingest_topics(lake, name, cluster.bootstrap, topic, schema_registry=registry.url)
    updates, frontier = justified(history.truth, messages[:cut])
    assert first.ingest.created and first.ingest.frontier == frontier != []
    assert rows_of_table(lake, name) == rows_of_truth(updates)
    state = lake.table(name).state()
    assert state.offsets == first.offsets
    recorded = state.offsets.topic(topic)
    assert len(recorded.partitions) == 4
    # everything read was absorbed: every partition resumes at the end of the read
    assert all(p.resume == p.end for p in recorded.partitions)
    assert sum(p.end for p in recorded.partitions) == first.records

    added = produce(cluster, topic, messages[cut:], rng)  # schema id 0: the reader's file
    # status: per partition the committed offset, the end now, the lag between them
    lags = api.table_status(lake, name, count_rows=False, live=True).offsets
    assert [(o["partition"], o["committed"]) for o in lags] == [
        (p.partition, p.resume) for p in recorded.partitions]
    assert all(o["lag"] == o["end"] - o["committed"] and o["error"] is None for o in lags)
    assert sum(o["lag"] for o in lags) == added
    second = ingest_topics(lake, name, cluster.bootstrap, [topic],
                           schema=schema_file(tmp_path))
    assert {(p.partition, p.start) for p in second.partitions} == {
        (p.partition, p.resume) for p in recorded.partitions}
    assert second.records == added
    assert second.ingest.frontier == []
    assert rows_of_table(lake, name) == rows_of_truth(history.truth)
    # the offsets are carried by the version that committed them
    assert lake.table(name).state().offsets == second.offsets

    again = ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema_file(tmp_path))
    assert again.records == 0 and again.ingest.commit.skipped
    assert lake.table(name).state().version == second.ingest.commit.version
    # a compaction's version carries them too
    api.compact(lake, name)
    assert lake.table(name).state().offsets == second.offsets


@pytest.mark.spark
def test_mangled_topic_resumes_exactly(cluster: MockCluster, lake: Lake,
                                       tmp_path: Path) -> None:
    """Two writers' batchings, re-batched, duplicated and shuffled over 3 partitions, ingested
    in three steps: each commit equals what the messages so far justify, each run starts at
    the offsets the last commit recorded, and messages past the frontier are read again."""
    rng = seeded(72)
    history = random_history(rng, updates=200, times=12, closed=False)
    log = mangle([write(history, batch_size=5), write(history, batch_size=9, finish_every=2)],
                 rng)
    topic = new_topic(cluster, partitions=3)
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    schema = schema_file(tmp_path)
    cuts = [0, len(log) // 3, 2 * len(log) // 3, len(log)]
    previous = None
    for lo, hi in itertools.pairwise(cuts):
        write_topic(log[lo:hi], bootstrap=cluster.bootstrap, topic=topic, schema=row_schema())
        run = ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema)
        updates, frontier = justified(history.truth, log[:hi])
        assert run.ingest.frontier == frontier
        assert rows_of_table(lake, name) == rows_of_truth(updates)
        if previous is not None:
            starts = {p.partition: p.start for p in run.partitions}
            assert starts == {p.partition: p.resume for p in previous.partitions}
            assert run.records == sum(p.end - p.start for p in run.partitions)
        previous = run
    assert frontier == [max(history.finish_points) + 1]


@pytest.mark.spark
def test_a_bad_record_stops_before_anything_is_committed(cluster: MockCluster, lake: Lake,
                                                         tmp_path: Path) -> None:
    rng = seeded(73)
    history = random_history(rng, updates=80, times=6)
    messages = write(history, batch_size=6)
    cut = split_at_statement(messages)
    topic = new_topic(cluster, partitions=2)
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    schema = schema_file(tmp_path)
    write_topic(messages[:cut], bootstrap=cluster.bootstrap, topic=topic, schema=row_schema())
    ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema)
    before = lake.table(name).state()
    good = encode_confluent(messages[cut], row_schema(), 0)
    produce_raw(cluster, topic, [(1, good), (1, b'{"not": "a frame"}'), (0, good)])
    bad_offset = before.offsets.topic(topic).partition(1).end + 1
    with pytest.raises(InputError) as caught:
        ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema)
    text = str(caught.value)
    assert f"topic {topic} partition 1" in text and f"offset {bad_offset}" in text, text
    assert "not a Confluent-framed" in text and "\n" not in text
    after = lake.table(name).state()
    assert (after.version, after.offsets, after.frontier) == (
        before.version, before.offsets, before.frontier)


@pytest.mark.spark
def test_frames_of_another_row_schema_are_refused(cluster: MockCluster,
                                                  registry: RegistryServer, lake: Lake,
                                                  tmp_path: Path) -> None:
    """`--schema` types the table's rows; a registry frame of another row schema stops the run
    at its record (read on an executor), before anything is committed."""
    rng = seeded(75)
    messages = write(random_history(rng, updates=40, times=4), batch_size=6)
    topic = new_topic(cluster, partitions=1)
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    write_topic(messages, bootstrap=cluster.bootstrap, topic=topic, schema=row_schema())
    other = CdcSchema.for_fields([{"name": "id", "type": "long"}, {"name": "w", "type": "string"}])
    other_id = SchemaRegistry(registry.url).register(f"{topic}-value", other)
    produce_raw(cluster, topic, [(0, encode_confluent(Updates([({"id": 1, "w": "x"}, 1, 1)]),
                                                      other, other_id))])
    with pytest.raises(InputError, match=f"topic {topic} partition 0, offset {len(messages)}: "
                                         "the topics' frames carry more than one row schema"):
        ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema_file(tmp_path),
                      schema_registry=registry.url)
    assert not lake.exists(name)


@pytest.mark.spark
def test_changefeed_topics_go_to_their_own_ingest_and_usage_errors(lake: Lake) -> None:
    for source in ("debezium", "ydb"):
        with pytest.raises(LakeError, match=f"not {source}: .*ingest_changefeed_topics"):
            ingest_topics(lake, "t", "127.0.0.1:1", "x", source=source)
    refused = subprocess.run([*CLI, "ingest", "--lake", str(lake.root), "--table", "t",
                              "--from", "debezium", "--kafka", "127.0.0.1:1", "--topic", "x",
                              "--schema-registry", "http://127.0.0.1:1"],
                             capture_output=True, timeout=60)
    assert refused.returncode == 2
    assert b"--schema-registry is for Avro topics" in refused.stderr
    lake_args = ["ingest", "--lake", str(lake.root), "--table", "t"]
    for args, says in [(["--kafka", "127.0.0.1:1", "--schema", __file__], b"--kafka needs --topic"),
                       (["--kafka", "127.0.0.1:1", "--topic", "x"], b"--schema-registry URL"),
                       (["--topic", "x", "f.jsonl"], b"go with --kafka"),
                       (["--from", "debezium", "--follow", "d"], b"follows changefeed topics"),
                       (["--from", "ydb", "--kafka", "127.0.0.1:1", "--topic", "x", "--schema",
                         __file__], b"test_kafka_ingest.py: not valid JSON"),
                       (["--from", "ydb", "--follow", "--kafka", "127.0.0.1:1", "--topic", "x",
                         "--checkpoint", "c"], b"do not go with --follow --from ydb"),
                       ([], b"no INPUT given")]:
        usage = subprocess.run([*CLI, *lake_args, *args], capture_output=True, timeout=60)
        assert usage.returncode == 2 and says in usage.stderr, usage.stderr
    assert not (lake.root / "metastore").exists()  # refused before Spark started


@pytest.mark.spark
def test_status_names_the_partition_that_holds_the_frontier_back(
        cluster: MockCluster, lake: Lake, tmp_path: Path) -> None:
    """Messages go round-robin to three partitions, and partition 2 stops receiving halfway:
    the other two carry the stream on, so the frontier stops where partition 2's missing
    messages are, and status says partition 2 holds it back; once they arrive, none does."""
    history = random_history(seeded(73), updates=200, times=30)
    messages = write(history, batch_size=5)
    topic = new_topic(cluster, partitions=3)
    cut = len(messages) // 2
    turns = {Progress: itertools.count(), Updates: itertools.count()}  # each kind round-robin
    placed = [(next(turns[type(m)]) % 3, encode_confluent(m, row_schema(), 0))
              for m in messages]
    withheld = [r for i, r in enumerate(placed) if i >= cut and r[0] == 2]
    produce_raw(cluster, topic, [r for i, r in enumerate(placed) if i < cut or r[0] != 2])
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    first = ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema_file(tmp_path))
    frontier = first.ingest.frontier
    assert frontier and frontier != [] and first.ingest.frontier[0] < max(
        t for _, t, _ in history.truth)
    reached = {p.partition: p.reached for p in first.partitions}
    assert reached[2] is None or reached[2] <= frontier[0]  # None: no statement of its own
    assert frontier[0] < min(reached[0], reached[1])

    def behind() -> list[int]:
        lags = api.table_status(lake, name, count_rows=False, live=True).offsets
        assert [o["reached"] for o in lags] == [
            p.reached for p in lake.table(name).state().offsets.topic(topic).partitions]
        return [o["partition"] for o in lags if o["holds_back"]]

    assert behind() == [2]
    produce_raw(cluster, topic, withheld)
    second = ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema_file(tmp_path))
    assert second.ingest.frontier == []  # the history closes
    assert rows_of_table(lake, name) == rows_of_truth(history.truth)
    assert behind() == []


def test_an_unknown_reader_is_refused(cluster: MockCluster, lake: Lake,
                                     tmp_path: Path) -> None:
    """`reader="kafka"` reads through Spark's own connector (on the real broker:
    test_spark_kafka_connector.py); another name is refused, committing nothing."""
    topic = new_topic(cluster, partitions=1)
    with pytest.raises(LakeError, match="unknown reader 'nope'"):
        ingest_topics(lake, "t", cluster.bootstrap, topic, schema=schema_file(tmp_path),
                      reader="nope")
    assert lake.handle("t").load() is None  # nothing created, nothing committed


# ------------------------------------------------------------------------------ CLI, kill -9


def committed_rows(lake_dir: Path, table: str) -> tuple[dict, Counter]:
    """The last manifest of a table a CLI run committed (the run ended: it is the committed
    one) and the updates its segments hold."""
    directory = lake_dir / "tables" / "default" / table
    states = sorted((directory / "_state").glob("v*.json"), key=lambda p: int(p.stem[1:]))
    state = json.loads(states[-1].read_text())
    rows: Counter = Counter()
    for fs in state["files"]:
        for path in sorted((directory / fs["path"]).rglob("*.parquet")):
            for r in pq.read_table(path).to_pylist():
                rows[(r["id"], r["v"], r["_time"], r["_diff"])] += 1
    return state, rows


def run_ingest(lake_dir: Path, table: str, cluster: MockCluster, topic: str, schema: Path,
               *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, "ingest", "--lake", str(lake_dir), "--table", table, "--kafka",
         cluster.bootstrap, "--topic", topic, "--schema", str(schema), "--master", "local[1]",
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


KILL_POINTS = ("anywhere", "segment", "manifest")
"""Where a kill lands: a moment after the start (Spark's start, the read, the decode), once
the table's change segment is being written, or once the commit's manifest is written (the
commit point, the view's replacement, follows it)."""


def wait_for(process: subprocess.Popen, found, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if found():
            return True
        time.sleep(0.02)
    return False


def kill_at(process: subprocess.Popen, table_dir: Path, point: str, versions: int,
            rng: random.Random) -> None:
    """Kill -9 the run's process group (its Spark JVM too) at `point` (see KILL_POINTS);
    `versions`: how many manifests the table had before the run."""
    if point == "segment":
        old = set((table_dir / "seg").glob("*"))
        wait_for(process, lambda: any(d not in old for d in (table_dir / "seg").glob("*")))
    elif point == "manifest":
        wait_for(process, lambda: len(list((table_dir / "_state").glob("v*.json"))) > versions
                 + (0 if versions else 1))  # a new table's first manifest is its creation
    time.sleep(rng.uniform(0, 0.3) if point != "anywhere" else rng.uniform(1.0, 20.0))
    # ESRCH: it finished before the kill point, and the rerun has nothing to do
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def killed_then_rerun(tmp_path: Path, cluster: MockCluster, seed: int, *,
                      ingested_before: bool) -> None:
    """An ingest killed at a seeded point, then run again: the table equals the history,
    nothing doubled, and the offsets resume at the end. With `ingested_before`, a first run
    committed part of the topic, so the killed run and the rerun start at its offsets."""
    rng = seeded(seed)
    history = random_history(rng, updates=150, times=10)
    log = mangle([write(history, batch_size=5)], rng)
    topic = new_topic(cluster, partitions=3)
    schema = schema_file(tmp_path)
    lake_dir = tmp_path / "lake"
    table_dir = lake_dir / "tables" / "default" / "t"
    cut = len(log) // 2 if ingested_before else 0
    produced = write_topic(log[:cut], bootstrap=cluster.bootstrap, topic=topic,
                           schema=row_schema()).messages if cut else 0
    if ingested_before:
        first = run_ingest(lake_dir, "t", cluster, topic, schema)
        _, err = first.communicate(timeout=600)
        assert first.returncode == 0, err.decode()
    produced += write_topic(log[cut:], bootstrap=cluster.bootstrap, topic=topic,
                            schema=row_schema()).messages
    versions = len(list((table_dir / "_state").glob("v*.json")))
    point = rng.choice(KILL_POINTS)
    print(f"kill point: {point}")
    kill_at(run_ingest(lake_dir, "t", cluster, topic, schema), table_dir, point, versions, rng)
    rerun = run_ingest(lake_dir, "t", cluster, topic, schema)
    _, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err.decode()
    state, rows = committed_rows(lake_dir, "t")
    assert rows == rows_of_truth(history.truth)
    assert state["frontier"] == []
    partitions = state["offsets"]["topics"][0]["partitions"]
    assert sum(p["end"] for p in partitions) == produced
    assert all(p["resume"] == p["end"] for p in partitions)
    lines = err.decode().splitlines()
    assert any(line.startswith("changelake: read ") for line in lines), lines


@pytest.mark.slow  # a minute; test_cli_ingest_killed_more beside it
@pytest.mark.spark
def test_cli_ingest_killed_and_rerun(tmp_path: Path, cluster: MockCluster) -> None:
    killed_then_rerun(tmp_path, cluster, random.randrange(1000), ingested_before=False)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("seed", [29])  # ~2-4 min each: CI time is shared
def test_cli_ingest_killed_more(tmp_path: Path, cluster: MockCluster, seed: int) -> None:
    killed_then_rerun(tmp_path, cluster, seed, ingested_before=seed % 2 == 1)


@pytest.mark.slow
@pytest.mark.spark
def test_cli_status_shows_offsets_and_lag(tmp_path: Path, cluster: MockCluster) -> None:
    rng = seeded(74)
    history = random_history(rng, updates=60, times=5)
    messages = write(history, batch_size=6)
    cut = split_at_statement(messages)
    topic = new_topic(cluster, partitions=2)
    schema = schema_file(tmp_path)
    lake_dir = tmp_path / "lake"
    write_topic(messages[:cut], bootstrap=cluster.bootstrap, topic=topic, schema=row_schema())
    first = run_ingest(lake_dir, "t", cluster, topic, schema)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err.decode()
    more = write_topic(messages[cut:], bootstrap=cluster.bootstrap, topic=topic,
                       schema=row_schema()).messages
    status = subprocess.run([*CLI, "status", "--lake", str(lake_dir), "--format", "jsonl",
                             "--master", "local[1]", "--live"], capture_output=True,
                            timeout=300)
    assert status.returncode == 0, status.stderr.decode()
    (table,) = [orjson.loads(line) for line in status.stdout.splitlines()]
    offsets = table["offsets"]
    assert {o["topic"] for o in offsets} == {topic} and len(offsets) == 2
    assert all(o["lag"] == o["end"] - o["committed"] and o["error"] is None for o in offsets)
    assert sum(o["lag"] for o in offsets) == more
    # a bad record: one line naming topic, partition and offset; nothing committed
    ends = {o["partition"]: o["end"] for o in offsets}
    produce_raw(cluster, topic, [(0, b"not a frame")])
    bad = run_ingest(lake_dir, "t", cluster, topic, schema)
    _, err = bad.communicate(timeout=600)
    assert bad.returncode == 2 and err.decode().count("\n") == 1, err.decode()
    assert f"topic {topic} partition 0, offset {ends[0]}" in err.decode(), err.decode()
    state, _ = committed_rows(lake_dir, "t")
    assert [p["resume"] for p in state["offsets"]["topics"][0]["partitions"]] == [
        o["committed"] for o in offsets]


def test_status_reports_an_unreachable_cluster_without_failing() -> None:
    from changelake.kafka.lag import topic_lags
    from changelake.lake.layout import PartitionOffsets, SourceOffsets, TopicOffsets

    offsets = SourceOffsets("kafka", "materialize", "127.0.0.1:1", (
        TopicOffsets("a", (PartitionOffsets(0, 3, 5), PartitionOffsets(1, 0, 0))),))
    lags = topic_lags(offsets, timeout=1.0)
    assert [(x.partition, x.committed, x.end, x.lag) for x in lags] == [
        (0, 3, None, None), (1, 0, None, None)]
    assert all(x.error is not None and x.error.startswith("unreachable") for x in lags)
    assert [x.error for x in topic_lags(offsets, live=False)] == ["not asked (--live)"] * 2


@pytest.mark.spark
def test_logical_types_land_typed_from_a_topic(cluster: MockCluster, lake: Lake,
                                               tmp_path: Path) -> None:
    """Decimals, dates and instants in Confluent-framed messages land as the table's decimal,
    date and timestamp columns (the `materialize-cdc` source's mapping, which `kafka-cdc`
    shares), exactly: the instants compared as epoch microseconds."""
    import datetime as dt
    import decimal

    from changelake.formats.materialize import cdc_schema_around
    from changelake.protocol import Writer
    from changelake.values import freeze

    record = {"type": "record", "name": "row", "fields": [
        {"name": "id", "type": "long"},
        {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                            "precision": 12, "scale": 3}]},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
        {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]}]}
    schema = CdcSchema.from_json(cdc_schema_around(record))
    rows = [{"id": 1, "price": "-12.345", "day": "2024-02-29",
             "at": "2024-11-03T05:30:00.000001+00:00"},
            {"id": 2, "price": None, "day": "0001-01-01", "at": "1969-07-20T20:17:40+00:00"}]
    writer = Writer(batch_size=1)
    for at, row in enumerate(rows):
        writer.push(freeze(row, ("id", "price", "day", "at")), at, 1)
    topic = new_topic(cluster, partitions=2)
    write_topic([*writer.finish_through(len(rows) - 1), *writer.close()],
                bootstrap=cluster.bootstrap, topic=topic, schema=schema)
    path = tmp_path / "typed.json"
    path.write_bytes(orjson.dumps(record))
    name = f"k_{uuid.uuid4().hex[:8]}.typed"

    run = ingest_topics(lake, name, cluster.bootstrap, topic, key=["id"], schema=path)
    assert run.ingest.frontier == []
    current = lake.table(name).current()
    assert [current.schema[c].dataType.simpleString() for c in ("price", "day", "at")] == [
        "decimal(12,3)", "date", "timestamp"]
    landed = {r["id"]: r for r in current.selectExpr(
        "id", "price", "day", "unix_micros(at) AS at").collect()}
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    for row in rows:
        got = landed[row["id"]]
        assert got["price"] == (None if row["price"] is None
                                else decimal.Decimal(row["price"]))
        assert got["day"] == dt.date.fromisoformat(row["day"])
        assert got["at"] == (dt.datetime.fromisoformat(row["at"]) - epoch) // dt.timedelta(
            microseconds=1)
