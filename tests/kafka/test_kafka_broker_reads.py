"""Reads of topics that only a real broker can hold (the run's Apache Kafka broker, the
`broker` fixture): an aborted transaction among committed ones and one left open (the mock
cluster has no read-committed isolation), a compacted topic with tombstones (the mock has no
log cleaner), and a broker restart in the middle of an ingest."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from changelake.errors import ChangelakeError
from changelake.kafka import TopicFeed, TopicReader, read_topic, write_topic
from changelake.kafka.broker import KafkaBroker
from changelake.protocol import Progress, collect
from changelake.simulate import random_history, write
from tests.support.kafka_helpers import as_set, new_topic, raw_records, row_schema
from tests.support.seeding import seeded

GARBAGE = b"not a Confluent frame"  # a strict read fails at it: read, it is seen


def transactional(broker: KafkaBroker, name: str) -> Producer:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": name,
                         "log_level": 0})
    producer.init_transactions(30)
    return producer


def test_read_committed_skips_an_aborted_transaction_and_stops_at_an_open_one(
        broker: KafkaBroker) -> None:
    """Committed, aborted (records that are not frames: a strict read of them fails), committed,
    then a transaction left open by another producer: the read gives exactly the committed
    messages, and ends at once at the open transaction (the last stable offset), not after
    its idle timeout."""
    history = random_history(seeded(61), updates=120, times=8)
    messages = write(history, batch_size=5)
    topic = new_topic(broker, partitions=1)
    cut = len(messages) // 2
    first = write_topic(messages[:cut], bootstrap=broker.bootstrap, topic=topic,
                        schema=row_schema(), transactional_id=f"{topic}-a").messages
    aborting = transactional(broker, f"{topic}-b")
    aborting.begin_transaction()
    for _ in range(5):
        aborting.produce(topic, value=GARBAGE, partition=0)
    aborting.flush(30)
    aborting.abort_transaction(30)
    write_topic(messages[cut:], bootstrap=broker.bootstrap, topic=topic, schema=row_schema(),
                transactional_id=f"{topic}-a")
    hanging = transactional(broker, f"{topic}-c")
    hanging.begin_transaction()
    hanging.produce(topic, value=GARBAGE, partition=0)
    hanging.flush(30)
    try:
        everything = raw_records(broker, topic, 1, isolation="read_uncommitted")
        assert len(everything) == len(messages) + 6  # every record is there
        open_at = max(offset for _, offset, _, value in everything if value == GARBAGE)
        started = time.monotonic()
        with TopicReader(broker.bootstrap, topic, schema=row_schema(), idle_timeout=20) as reader:
            read = list(reader.messages())
            (part,) = reader.ranges
        assert time.monotonic() - started < 10
        assert len(read) == len(messages) and first == cut
        assert part.end == open_at  # the last stable offset: the open transaction's first
        result = collect(read)
        assert as_set(result.updates) == as_set(history.truth)
        assert result.frontier.to_json() == []
    finally:
        hanging.abort_transaction(30)
    assert read_topic(broker.bootstrap, topic, schema=row_schema()) == read  # aborted: unread


def test_a_sink_topic_compacted_keeps_every_statement(broker: KafkaBroker) -> None:
    """The sink keys each message by its value's hash (`kafka.sink`), so a re-run's duplicates
    share their originals' keys and compaction may drop them, never a statement: a compacted
    topic written three times over still reads to the whole history."""
    history = random_history(seeded(62), updates=300, times=12)
    messages = write(history, batch_size=4)
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 2, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "100"})
    for _ in range(3):  # a run and two re-runs, each in segments of their own
        write_topic(messages, bootstrap=broker.bootstrap, topic=topic, schema=row_schema())
        time.sleep(0.3)
    # a last record on each partition rolls the segments before it, which the cleaner takes
    write_topic([m for m in messages if isinstance(m, Progress)][:8],
                bootstrap=broker.bootstrap, topic=topic, schema=row_schema())
    records = wait_for_compaction(broker, topic, 2, below=2 * len(messages))
    assert len({(key, value) for _, _, key, value in records}) <= len(messages)
    result = collect(read_topic(broker.bootstrap, topic, schema=row_schema()))
    assert as_set(result.updates) == as_set(history.truth)
    assert result.frontier.to_json() == [] and not result.rejected


def wait_for_compaction(broker: KafkaBroker, topic: str, partitions: int, below: int,
                        timeout: float = 60.0) -> list:
    """The topic's records once the log cleaner left fewer than `below`."""
    deadline = time.monotonic() + timeout
    while True:
        records = raw_records(broker, topic, partitions)
        if len(records) < below:
            return records
        assert time.monotonic() < deadline, f"no compaction within {timeout:g} s"
        time.sleep(0.5)


def test_a_compacted_debezium_topic_with_tombstones_reads_to_the_tables_end(
        broker: KafkaBroker, tmp_path: Path) -> None:
    """A Debezium topic keyed by row (each delete followed by its tombstone), compacted: each
    key keeps its last event, a deleted key its tombstone (then nothing). Read from the start,
    it converts to the table as it is at the end, nothing of what was deleted."""
    from tests.kafka.test_kafka_changefeed import file_path, pg_feed, updates_of, write_files

    feed = pg_feed(seeded(63).randrange(1 << 30), transactions=16, metadata=False)
    topic = f"dbz-compacted-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 1, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "60000"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    half = len(feed.events) // 2
    for part in (feed.events[:half], feed.events[half:]):
        for key, value in part:
            producer.produce(topic, key=orjson.dumps(key), value=value, partition=0)
        assert producer.flush(30) == 0
        time.sleep(0.3)
    last = {orjson.dumps(k): (k, v) for k, v in feed.events}  # each key's last event
    live = [k for k, v in feed.events if last[orjson.dumps(k)][1] is not None]
    again = last[orjson.dumps(live[-1])]
    producer.produce(topic, key=orjson.dumps(again[0]), value=again[1], partition=0)
    assert producer.flush(30) == 0  # a connector's re-send: rolls the segment before it
    # compacted whole: each key's last record before the active segment, then the re-send
    records = wait_for_compaction(broker, topic, 1, below=len(last) + 2)
    assert len(records) == len(last) + 1
    tombstones = sum(value is None for _, _, _, value in records)
    assert tombstones > 0  # deleted keys: their tombstones, kept for delete.retention.ms

    expected, _ = file_path(write_files(feed, tmp_path, metadata=False), close=True)
    source = TopicFeed(broker.bootstrap, [topic], source="debezium", keys=["id"], close=True)
    got, _ = updates_of(source.messages())
    assert final_rows(got) == final_rows(expected)
    assert source.report.stats.duplicates == 1  # the re-send
    assert source.report.skipped["tombstone"] == tombstones


def final_rows(updates: Counter) -> Counter:
    """The rows at the end: each row's diffs summed over every time."""
    out: Counter = Counter()
    for (data, _time), diff in updates.items():
        out[data] += diff
    return Counter({k: v for k, v in out.items() if v})


@pytest.mark.spark
def test_a_broker_restart_during_an_ingest_loses_and_doubles_nothing(
        spark, broker: KafkaBroker, tmp_path: Path) -> None:
    """`ingest --kafka` reading while the broker is killed and started again, and a producer
    writing across the restart: the ingest either commits or fails in one line, committing
    nothing; then ingests until nothing is new give the table the whole history, each update
    once."""
    from changelake.lake import Lake
    from changelake.lake.kafka_ingest import ingest_topics

    history = random_history(seeded(64), updates=400, times=16)
    messages = write(history, batch_size=4)
    topic = new_topic(broker, partitions=3)
    cut = len(messages) // 2
    write_topic(messages[:cut], bootstrap=broker.bootstrap, topic=topic, schema=row_schema())
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(row_schema().avro))
    lake = Lake(spark, tmp_path / "lake")
    name = f"r_{uuid.uuid4().hex[:8]}"
    outcome: dict[str, object] = {}

    def ingest() -> None:
        try:
            outcome["report"] = ingest_topics(lake, name, broker.bootstrap, topic,
                                              schema=schema)
        except ChangelakeError as error:
            outcome["error"] = error

    def slowly():
        for message in messages[cut:]:
            time.sleep(0.1)
            yield message

    def produce() -> None:
        outcome["produced"] = write_topic(slowly(), bootstrap=broker.bootstrap, topic=topic,
                                          schema=row_schema()).messages

    threads = [threading.Thread(target=ingest), threading.Thread(target=produce)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    broker.kill()
    broker.start()
    for thread in threads:
        thread.join(300)
    assert outcome.get("produced") == len(messages) - cut
    if "error" in outcome:  # failed while the broker was away: one line, nothing committed
        print(f"the ingest during the restart failed: {outcome['error']}")
        assert "\n" not in str(outcome["error"])
    for _ in range(3):
        if ingest_topics(lake, name, broker.bootstrap, topic, schema=schema).records == 0:
            break
    rows = Counter((r["id"], r["v"], r["_time"], r["_diff"])
                   for r in lake.table(name).updates().collect())
    assert rows == Counter((d.get("id"), d.get("v"), t, r) for d, t, r in history.truth)
