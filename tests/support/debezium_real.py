"""Real Debezium (changelake's runner, `changelake.capture.debezium`) against the embedded
PostgreSQL, for the tests: a scripted workload whose every statement the samples in
`tests/data/debezium-real/` recorded, and helpers to read a topic whole and to know that
Debezium has sent everything up to a point.

    # records the samples again (a broker of its own)
    python tests/support/debezium_real.py

The samples are what Debezium 3.6.1 wrote to Kafka, one JSON line per record
(`{"key": ..., "value": ...}`, Kafka's dump form, which `--from debezium` reads), per topic:
a snapshot, then transactions touching a keyed table of many types (numeric, jsonb,
timestamptz, date, double NaN and infinities, bytea, a TOASTed text an update leaves
unchanged), a table with no primary key (`REPLICA IDENTITY FULL`), a key moved, deletes
(each followed by its tombstone), and a transaction over both tables; and the transaction
topic's BEGIN/END records with their per-table counts.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg2

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "debezium-real"
PREFIX = "real"
TABLES = ("public.items", "public.tags")

SETUP = [
    "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), doc jsonb, "
    "at timestamptz, day date, score float8, data bytea, big text)",
    "ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL",
    "CREATE TABLE tags (tag text NOT NULL, n int)",
    "ALTER TABLE tags REPLICA IDENTITY FULL",
    "INSERT INTO items VALUES (1, 'one', 1.50, '{\"a\": 1}', '2024-05-01 12:00:00.123456+02', "
    "'2024-05-01', 0.5, '\\x0001ff', repeat('x', 5000)), "
    "(2, 'two', NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "INSERT INTO tags VALUES ('a', 1), ('b', 2), ('b', 2)",
]

#: The streamed transactions, each a list of statements committed together.
WORKLOAD = [
    ["INSERT INTO items VALUES (3, 'three', -0.01, '[1, \"x\"]', '1999-12-31 23:59:59+00', "
     "'1999-12-31', 'NaN', '', repeat('y', 4000))"],
    ["UPDATE items SET name = 'one!', score = 'Infinity' WHERE id = 1"],  # big unchanged
    ["UPDATE items SET score = '-Infinity', price = 99999999.99 WHERE id = 3",
     "DELETE FROM items WHERE id = 2"],
    ["UPDATE items SET id = 10 WHERE id = 3"],  # a new key, big unchanged
    ["INSERT INTO tags VALUES ('c', 3)", "UPDATE tags SET n = 20 WHERE tag = 'b'",
     "DELETE FROM tags WHERE tag = 'a'"],
    ["UPDATE items SET big = repeat('z', 3000) WHERE id = 1", "INSERT INTO tags VALUES ('d', 4)",
     "INSERT INTO items VALUES (4, 'four', 4, 'null', NULL, '2000-02-29', 1e-300, '\\xde', "
     "'short')"],
    ["DELETE FROM tags WHERE tag = 'b'", "DELETE FROM items WHERE id = 10"],
]


def execute(dsn: str, *statements: str) -> None:
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as c:
        for statement in statements:
            c.execute(statement)
    conn.close()


def topic_records(bootstrap: str, topic: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every record of `topic` (all partitions, in partition then offset order) as dump
    lines: `{"key": <JSON or null>, "value": <JSON or null>}` (a tombstone's value null)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "debezium-real",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=timeout).topics[topic]
                            .partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions if ends[p] > 0])
        got: dict[int, list] = {p: [] for p in partitions}
        deadline = time.monotonic() + timeout
        while any(len(got[p]) < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: read {[len(v) for v in got.values()]} of {ends}")
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            got[message.partition()].append({
                "key": orjson.loads(message.key()) if message.key() else None,
                "value": orjson.loads(message.value()) if message.value() else None})
    finally:
        consumer.close()
    return [r for p in partitions for r in got[p]]


def wait_for_records(bootstrap: str, topic: str, count: int, timeout: float = 120.0) -> None:
    """Until `topic` holds at least `count` records."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "debezium-real"})
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                meta = consumer.list_topics(topic, timeout=5).topics[topic]
                total = sum(consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                           timeout=5)[1]
                            for p in meta.partitions) if meta.error is None else 0
            except KafkaException:
                total = 0
            if total >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: {total} records of {count} after {timeout} s")
            time.sleep(0.2)
    finally:
        consumer.close()


def record(bootstrap: str, out: Path = SAMPLES) -> None:
    """Run the scripted workload through real Debezium and write each topic's records."""
    from changelake.capture.debezium import DebeziumConfig, DebeziumRunner
    from changelake.capture.postgres.server import EmbeddedPostgres

    pg_root = Path(tempfile.mkdtemp(prefix="changelake-debezium-real-pg-"))
    state = Path(tempfile.mkdtemp(prefix="changelake-debezium-real-"))
    server = EmbeddedPostgres(pg_root).start()
    try:
        execute(server.dsn, *SETUP)
        config = DebeziumConfig(dsn=server.dsn, bootstrap=bootstrap, state=state / "state",
                                topic_prefix=PREFIX, tables=TABLES, slot="real",
                                publication="real")
        with DebeziumRunner(config):
            for statements in WORKLOAD:
                execute(server.dsn, *statements)
            # BEGIN and END of the snapshot-less stream: two records a transaction.
            wait_for_records(bootstrap, f"{PREFIX}.transaction", 2 * len(WORKLOAD))
        out.mkdir(parents=True, exist_ok=True)
        for topic in (*(f"{PREFIX}.{t}" for t in TABLES), f"{PREFIX}.transaction"):
            lines = [orjson.dumps(r) for r in topic_records(bootstrap, topic)]
            (out / f"{topic}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    finally:
        server.stop()
        shutil.rmtree(pg_root, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        record(sys.argv[1])
    else:
        from changelake.kafka.broker import KafkaBroker

        with KafkaBroker() as broker:
            record(broker.bootstrap)
