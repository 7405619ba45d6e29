"""Changefeed topics as the source of `encode --from debezium|ydb` (issue 11, slice 2), against
the mock cluster: a Debezium table topic partitioned by key, with tombstones, envelopes with and
without `schema`, a connector restart that re-sends a tail, and the transaction metadata topic;
the result must equal what the file path (`encode --from debezium` on JSON lines of the same
events) gives, over 1 and over 3 partitions. Bad records follow the error contract."""

from __future__ import annotations

import logging
import random
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from changelake.convert import encode_changefeed
from changelake.errors import ChangefeedError
from changelake.formats.materialize import CdcSchema, SetAside
from changelake.kafka import MockCluster, TopicFeed, TopicReader, changefeed_messages
from changelake.protocol import collect
from changelake.values import thaw
from tests.convert.test_convert_history import BIG, YDB_TABLE, write_ydb
from tests.support.kafka_helpers import cluster, new_topic
from tests.support.paths import SAMPLES
from tests.support.seeding import seeded

__all__ = ["cluster"]  # fixtures

QUIET = logging.getLogger("test_kafka_changefeed.librdkafka")
CLI = [str(Path(sys.executable).parent / "changelake")]
KEY_SCHEMA = {"type": "struct", "name": "pg.public.items.Key", "optional": False,
              "fields": [{"field": "id", "type": "int32", "optional": False}]}
ROW = {"type": "struct", "optional": True, "fields": [
    {"field": "id", "type": "int32", "optional": False},
    {"field": "name", "type": "string", "optional": True},
    {"field": "v", "type": "int64", "optional": True}]}
VALUE_SCHEMA = {"type": "struct", "name": "pg.public.items.Envelope", "fields": [
    {**ROW, "field": "before"}, {**ROW, "field": "after"},
    {"field": "op", "type": "string"}]}


# ----------------------------------------------------------------- a PostgreSQL-style feed


@dataclass
class Feed:
    """A table's Debezium events in the database's order (`(key, value)`, value None for a
    tombstone), the transaction topic's events, and each transaction's CDCv2 time."""

    events: list[tuple[dict[str, Any], bytes | None]] = field(default_factory=list)
    transactions: list[bytes] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    deletes: int = 0


def pg_feed(seed: int, transactions: int = 14, *, metadata: bool = True) -> Feed:
    """A snapshot, then transactions of inserts, updates and deletes (each delete followed by
    its tombstone) as Debezium >= 1.5 sends them on PostgreSQL: `sequence` set, transaction
    blocks, values in both envelopes. Some transactions also touched another table: their END
    counts more events than this table's topic holds, and `data_collections` says how many are
    this table's. Without `metadata` (no `provide.transaction.metadata`), events carry no
    transaction block."""
    rng = random.Random(seed)
    feed = Feed()
    source = {"version": "2.7.0.Final", "connector": "postgresql", "name": "pg", "db": "db",
              "schema": "public", "table": "items"}
    rows: dict[int, dict[str, Any]] = {}
    lsn = 5000
    for key in range(1, 6):
        rows[key] = {"id": key, "name": f"n{key}", "v": rng.randrange(100)}
        value = {"op": "r", "before": None, "after": rows[key], "ts_ms": 1,
                 "source": {**source, "snapshot": "true" if key < 5 else "last", "txId": 90,
                            "lsn": lsn, "sequence": f'[null,"{lsn}"]'}}
        feed.events.append(({"id": key}, _envelope(value, rng)))
    previous_commit = lsn
    next_key = 100
    for index in range(transactions):
        xid = 700 + index
        order = 0
        for _ in range(rng.randint(1, 4)):
            lsn += 16
            order += 1
            kind = rng.choice(["insert", "update", "update", "delete"] if rows else ["insert"])
            if kind == "insert":
                next_key += 1
                key, before = next_key, None
                rows[key] = after = {"id": key, "name": f"n{key}", "v": rng.randrange(100)}
                op = "c"
            else:
                key = rng.choice(sorted(rows))
                before = None
                if kind == "update":
                    rows[key] = after = {**rows[key], "v": rng.randrange(100)}
                    op = "u"
                else:
                    before, after, op = {"id": key, "name": None, "v": None}, None, "d"
                    del rows[key]
            value = {"op": op, "before": before, "after": after, "ts_ms": 2,
                     "source": {**source, "snapshot": "false", "txId": xid, "lsn": lsn,
                                "sequence": orjson.dumps([str(previous_commit),
                                                          str(lsn)]).decode()}}
            if metadata:
                value["transaction"] = {"id": f"{xid}:{lsn}", "total_order": order,
                                        "data_collection_order": order}
            feed.events.append(({"id": key}, _envelope(value, rng)))
            if op == "d":
                feed.events.append(({"id": key}, None))
                feed.deletes += 1
        other = rng.random() < 0.4  # the transaction also wrote another table's one row
        commit = lsn + 16
        feed.times.append(previous_commit)
        previous_commit = lsn = commit
        collections = [{"data_collection": "public.items", "event_count": order}]
        if other:
            collections.append({"data_collection": "public.other", "event_count": 1})
        feed.transactions.append(orjson.dumps({
            "status": "BEGIN", "id": f"{xid}:{commit - 200}", "event_count": None,
            "data_collections": None}))
        feed.transactions.append(orjson.dumps({
            "status": "END", "id": f"{xid}:{commit}", "event_count": order + other,
            "data_collections": collections}))
    return feed


def _envelope(value: dict[str, Any], rng: random.Random) -> bytes:
    """The value with or without the `schema`/`payload` wrapper (converters' schemas.enable)."""
    if rng.random() < 0.5:
        return orjson.dumps({"schema": VALUE_SCHEMA, "payload": value})
    return orjson.dumps(value)


def _key(key: dict[str, Any], wrapped: bool) -> bytes:
    return orjson.dumps({"schema": KEY_SCHEMA, "payload": key} if wrapped else key)


def write_files(feed: Feed, directory: Path, *, metadata: bool = True) -> list[Path]:
    """The file path's input: the values in the database's order, and the transaction file."""
    items = directory / "items.jsonl"
    items.write_bytes(b"\n".join(v if v is not None else b"null" for _, v in feed.events)
                      + b"\n")
    if not metadata:
        return [items]
    tx = directory / "transactions.jsonl"
    tx.write_bytes(b"\n".join(feed.transactions) + b"\n")
    return [tx, items]


def produce_feed(cluster: MockCluster, feed: Feed, partitions: int, *, replay_from: float,
                 metadata: bool = True) -> list[str]:
    """The table's topic partitioned by key, then a connector restart that re-sends every event
    from `replay_from` (a fraction of the feed) on; the transaction topic (one partition, as
    Debezium makes it) with a duplicate END. The topics' names."""
    data = new_topic(cluster, partitions)
    out = producer(cluster)
    cut = int(replay_from * len(feed.events))
    for n, (key, value) in enumerate(feed.events + feed.events[cut:]):
        out.produce(data, key=_key(key, n % 3 == 0), value=value,
                         partition=key["id"] % partitions)
    topics = [data]
    if metadata:
        tx = new_topic(cluster, 1)
        for value in feed.transactions + feed.transactions[-1:]:
            out.produce(tx, key=orjson.dumps({"id": orjson.loads(value)["id"]}),
                             value=value, partition=0)
        topics.append(tx)
    assert out.flush(30) == 0
    return topics


def producer(cluster: MockCluster) -> Producer:
    """A producer whose librdkafka log stays off stderr (the module's cluster outlives it)."""
    return Producer({"bootstrap.servers": cluster.bootstrap, "logger": QUIET})


def updates_of(messages: Any) -> tuple[Counter[Any], list[int]]:
    """The consolidated `(data, time)` multiplicities and the final frontier."""
    got = collect(messages)
    out: Counter[Any] = Counter()
    for data, time, diff in got.updates:
        out[(orjson.dumps(thaw(data, json_safe=True), option=orjson.OPT_SORT_KEYS), time)] \
            += diff
    return Counter({k: v for k, v in out.items() if v}), got.frontier.to_json()


def file_path(paths: list[Path], *, close: bool = False) -> tuple[Counter[Any], list[int]]:
    return updates_of(encode_changefeed(paths, source="debezium", keys=["id"],
                                        table_schema=None, close=close, lenient=False))


# --------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("partitions", [1, 3])
def test_partitions_and_a_replayed_tail_give_the_file_paths_history(
        cluster: MockCluster, tmp_path: Path, partitions: int) -> None:
    feed = pg_feed(seeded(41).randrange(1 << 30))
    expected, expected_frontier = file_path(write_files(feed, tmp_path))
    # The transaction topic finishes the last transaction without --close.
    assert expected_frontier == [feed.times[-1] + 1]
    assert {t for _, t in expected} <= {0, *feed.times}
    topics = produce_feed(cluster, feed, partitions, replay_from=0.6)
    source = TopicFeed(cluster.bootstrap, topics, source="debezium", keys=["id"])
    assert updates_of(source.messages()) == (expected, expected_frontier)
    assert source.report.skipped["tombstone"] > feed.deletes  # the replayed tail's too
    assert source.report.stats.duplicates + source.report.stats.late > 0
    assert source.report.set_aside == []
    assert len(source.read.ranges[topics[0]]) == partitions


def test_without_the_transaction_topic_the_last_transaction_waits(
        cluster: MockCluster, tmp_path: Path) -> None:
    feed = pg_feed(seeded(42).randrange(1 << 30), transactions=8, metadata=False)
    expected = file_path(write_files(feed, tmp_path, metadata=False))
    assert expected[1] == [feed.times[-1]]  # high water only: the last time stays open
    topics = produce_feed(cluster, feed, 3, replay_from=0.3, metadata=False)
    assert updates_of(changefeed_messages(cluster.bootstrap, topics[0], source="debezium",
                                          keys=["id"])) == expected
    closed = file_path(write_files(feed, tmp_path, metadata=False), close=True)
    assert closed[1] == []
    assert updates_of(changefeed_messages(cluster.bootstrap, topics, source="debezium",
                                          keys=["id"], close=True)) == closed


def test_merging_the_partitions_is_what_makes_it_exact(cluster: MockCluster,
                                                       tmp_path: Path) -> None:
    """The partitions' records read one partition after another (as a file per partition)
    break the high-water rule: the file path refuses them. The topic read merges them."""
    feed = pg_feed(seeded(43).randrange(1 << 30), transactions=10, metadata=False)
    topics = produce_feed(cluster, feed, 3, replay_from=1.0, metadata=False)
    by_partition: dict[int, list[bytes]] = {}
    for key, value in feed.events:
        by_partition.setdefault(key["id"] % 3, []).append(value if value is not None
                                                          else b"null")
    files = []
    for partition, values in sorted(by_partition.items()):
        files.append(tmp_path / f"p{partition}.jsonl")
        files[-1].write_bytes(b"\n".join(values) + b"\n")
    with pytest.raises(ChangefeedError, match="arrives after times below"):
        file_path(files)
    assert updates_of(changefeed_messages(cluster.bootstrap, topics, source="debezium",
                                          keys=["id"])) == \
        file_path(write_files(feed, tmp_path, metadata=False))


def test_real_samples_keys_envelopes_and_tombstones(cluster: MockCluster,
                                                    tmp_path: Path) -> None:
    """The Debezium tutorial's records for customer 1004: its key with the `schema` wrapper, the
    snapshot value with it, the update and delete values without it, and the tombstone both as
    Kafka has it (a null value) and as the tutorial prints it."""
    key = (SAMPLES / "dbz-doc-tutorial-mysql-key-read-tombstone.jsonl").read_bytes() \
        .splitlines()[1]
    tutorial = (SAMPLES / "dbz-doc-tutorial-mysql-key-read-tombstone.jsonl").read_bytes() \
        .splitlines()
    snapshot, printed_tombstone = tutorial[2], tutorial[3]
    update, delete = (SAMPLES / "derived-dbz-doc-tutorial-mysql-update-delete-payloads.jsonl") \
        .read_bytes().splitlines()
    values = [snapshot, update, delete, None, printed_tombstone]
    topic = new_topic(cluster, 2)
    out = producer(cluster)
    for value in values:
        out.produce(topic, key=key, value=value, partition=1)
    assert out.flush(30) == 0
    path = tmp_path / "customers.jsonl"
    path.write_bytes(b"\n".join(v if v is not None else b"null" for v in values) + b"\n")
    expected = file_path([path], close=True)
    source = TopicFeed(cluster.bootstrap, topic, source="debezium", keys=["id"], close=True)
    got = updates_of(source.messages())
    assert got == expected
    rows = {(orjson.loads(data)["first_name"], diff) for (data, _), diff in got[0].items()}
    assert rows == {("Anne", 1), ("Anne", -1), ("Anne Marie", 1), ("Anne Marie", -1)}
    assert source.report.skipped == {"tombstone": 2}
    assert source.report.changes == 3


def test_bad_records_strict_stops_lenient_sets_aside(cluster: MockCluster,
                                                     tmp_path: Path) -> None:
    feed = pg_feed(seeded(44).randrange(1 << 30), transactions=5)
    topics = produce_feed(cluster, feed, 2, replay_from=1.0)
    out = producer(cluster)
    out.produce(topics[0], key=b'{"id": 1}', value=b"{not json", partition=1)
    out.produce(topics[0], key=b'{"id": 1}', value=b'{"hello": 1}', partition=1)
    out.produce(topics[0], key=b"\xff", value=b'{"hello": 1}', partition=0)
    assert out.flush(30) == 0
    with pytest.raises(ChangefeedError) as raised:
        list(changefeed_messages(cluster.bootstrap, topics, source="debezium", keys=["id"]))
    # The partitions are read side by side: whichever bad record comes first stops the read.
    message = str(raised.value)
    assert any(f"topic {topics[0]} partition {p}, offset " in message and reason in message
               for p, reason in [(0, "the record key is not JSON"),
                                 (1, "the record value is not JSON"),
                                 (1, "not a Debezium change event")]), message
    aside: list[SetAside] = []
    got = updates_of(changefeed_messages(cluster.bootstrap, topics, source="debezium",
                                         keys=["id"], lenient=True, set_aside=aside.append))
    assert got == file_path(write_files(feed, tmp_path))
    reasons = sorted((str(a.location).split(", ")[0], a.reason.split(":")[0]) for a in aside)
    assert reasons == [
        (f"topic {topics[0]} partition 0", "the record key is not JSON"),
        (f"topic {topics[0]} partition 1", "not a Debezium change event (no op), transaction "
                                           "event (no status) or schema change (no ddl); fields"),
        (f"topic {topics[0]} partition 1", "the record value is not JSON")]


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=300, input=stdin)


def decoded(out: bytes) -> tuple[list[bytes], Any]:
    lines = [orjson.loads(line) for line in out.splitlines()]
    updates = sorted(orjson.dumps(x, option=orjson.OPT_SORT_KEYS) for x in lines if "data" in x)
    return updates, lines[-1]["frontier"]


def test_cli_encode_from_topics_then_decode_equals_the_file_path(cluster: MockCluster,
                                                                 tmp_path: Path) -> None:
    feed = pg_feed(seeded(45).randrange(1 << 30), transactions=8)
    data, tx = produce_feed(cluster, feed, 3, replay_from=0.5)
    paths = [str(p) for p in write_files(feed, tmp_path)]
    from_files = run("encode", "--from", "debezium", "--key", "id", *paths)
    assert from_files.returncode == 0, from_files.stderr
    expected = decoded(run("decode", stdin=from_files.stdout).stdout)
    assert expected[1] == [feed.times[-1] + 1]
    for topic_args in (["--topic", data, "--topic", tx],
                       ["--topic", f"{data},{tx}", "--group", "enc"]):
        encoded = run("encode", "--from", "debezium", "--key", "id", "--kafka",
                      cluster.bootstrap, *topic_args)
        assert encoded.returncode == 0, encoded.stderr
        assert decoded(run("decode", stdin=encoded.stdout).stdout) == expected
        assert "tombstone(s)" in encoded.stderr.decode()
    # --group recorded how far each partition was read: to its end
    for topic in (data, tx):
        with TopicReader(cluster.bootstrap, topic, group="enc", framed=False) as reader:
            assert reader.committed() == {r.partition: r.end for r in reader.plan()
                                          if r.end > 0} != {}
    # from topics to a topic: the sink takes the converted messages (Avro, --schema)
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(CdcSchema.for_fields([
        {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]},
        {"name": "v", "type": ["null", "long"]}]).avro))
    sink = new_topic(cluster, 2)
    produced = run("encode", "--from", "debezium", "--key", "id", "--kafka", cluster.bootstrap,
                   "--topic", f"{data},{tx}", "--schema", str(schema), "--to-kafka",
                   cluster.bootstrap, "--to-topic", sink)
    assert produced.returncode == 0, produced.stderr
    read = run("decode", "--kafka", cluster.bootstrap, "--topic", sink, "--schema", str(schema))
    assert read.returncode == 0, read.stderr
    assert decoded(read.stdout) == expected
    # usage and refusals: one line each
    for args, words in [
        (["--topic", data], "--topic and --group go with --kafka"),
        (["--kafka", cluster.bootstrap], "--kafka needs --topic"),
        (["--kafka", cluster.bootstrap, "--topic", data, paths[1]], "no input files as well"),
    ]:
        result = run("encode", "--from", "debezium", "--key", "id", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert words in result.stderr.decode(), (args, result.stderr)
    materialize = run("encode", "--from", "materialize", "--kafka", cluster.bootstrap,
                      "--topic", data)
    assert materialize.returncode == 2 and b"decode --kafka" in materialize.stderr
    # a bad record: strict stops with one line naming it; lenient reports it once, goes on
    out = producer(cluster)
    out.produce(data, key=b'{"id": 1}', value=b"{not json", partition=2)
    assert out.flush(30) == 0
    topic_args = ["--kafka", cluster.bootstrap, "--topic", f"{data},{tx}"]
    strict = run("encode", "--from", "debezium", "--key", "id", *topic_args)
    assert strict.returncode == 2 and strict.stdout == b""
    err = strict.stderr.decode().strip()
    assert "\n" not in err and f"topic {data} partition 2, offset " in err, err
    assert "the record value is not JSON" in err
    lenient = run("encode", "--from", "debezium", "--key", "id", "--lenient", *topic_args)
    assert lenient.returncode == 0, lenient.stderr
    assert lenient.stderr.decode().count(f"set aside: topic {data} partition 2") == 1
    assert decoded(run("decode", stdin=lenient.stdout).stdout) == expected


# ---------------------------------------------------------------------------------- YDB


def ydb_history(seed: int, transactions: int = 12) -> dict[str, Any]:
    """A history in `test_convert_history.ydb_histories`'s shape, drawn from a seed."""
    rng = random.Random(seed)
    keys = [1, 2, 3, 4, 5, BIG + 1, 2**64 - 1]
    scores = [0.5, 2.0, "nan", "inf", None]
    names = ["a", "b", None]
    txs = []
    for _ in range(transactions):
        ops = []
        for key in rng.sample(keys, rng.randint(1, 3)):
            kind = rng.choice(["update", "reset", "erase"])
            written = {} if kind == "erase" else {"name": rng.choice(names),
                                                   "score": rng.choice(scores)}
            ops.append((kind, key, written))
        txs.append((rng.randint(0, 2), ops, rng.random() < 0.6))
    txs[-1] = (*txs[-1][:2], True)  # a barrier after the last: its step is finished
    return {"scan": {k: (rng.choice(names), rng.choice(scores)) for k in keys[:4]}, "txs": txs,
            "seed": seed}


def test_ydb_partitions_with_barriers_and_a_replay_give_the_file_paths_history(
        cluster: MockCluster, tmp_path: Path) -> None:
    """Each YDB partition file becomes one Kafka partition, barriers included, and its records
    stay in their order; a re-read tail of partition 0 is absorbed (replays); a bad record
    stops a strict read at its place."""
    paths, _, last_barrier = write_ydb(ydb_history(seeded(46).randrange(1 << 30)), tmp_path)
    expected = updates_of(encode_changefeed(paths, source="ydb", keys=None,
                                            table_schema=YDB_TABLE, close=False,
                                            lenient=False))
    assert expected[1] == [last_barrier]
    topic = new_topic(cluster, 2)
    out = producer(cluster)
    for partition, path in enumerate(paths):
        lines = path.read_bytes().splitlines()
        if partition == 0:
            lines += lines[len(lines) // 2:]
        for line in lines:
            out.produce(topic, value=line, partition=partition)
    assert out.flush(30) == 0
    source = TopicFeed(cluster.bootstrap, topic, source="ydb", table_schema=YDB_TABLE)
    assert updates_of(source.messages()) == expected
    assert source.report.stats.duplicates + source.report.stats.late > 0
    # a third partition with no barrier yet justifies nothing: the frontier stays at 0
    wider = new_topic(cluster, 3)
    for partition, path in enumerate(paths):
        for line in path.read_bytes().splitlines():
            out.produce(wider, value=line, partition=partition)
    assert out.flush(30) == 0
    assert updates_of(changefeed_messages(cluster.bootstrap, wider, source="ydb",
                                          table_schema=YDB_TABLE)) == (Counter(), [0])
    closed = encode_changefeed(paths, source="ydb", keys=None, table_schema=YDB_TABLE,
                               close=True, lenient=False)
    assert updates_of(changefeed_messages(cluster.bootstrap, wider, source="ydb",
                                          table_schema=YDB_TABLE, close=True)) == \
        updates_of(closed)
    out.produce(topic, value=b'{"update": {}, "key": "not an array"}', partition=1)
    assert out.flush(30) == 0
    with pytest.raises(ChangefeedError, match=f"topic {topic} partition 1, offset "):
        list(changefeed_messages(cluster.bootstrap, topic, source="ydb",
                                 table_schema=YDB_TABLE))
