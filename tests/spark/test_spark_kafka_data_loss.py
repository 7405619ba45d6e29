"""`kafka-cdc`'s `failOnDataLoss` (`spark/kafka_source.py`, "Lost records"): records a
streaming query had not read yet are deleted (retention, DeleteRecords) or its topic is
recreated while it is stopped. By default the restart fails naming topic, partition and
offsets; with `failOnDataLoss=false` it warns and goes on from the first record still held,
reading exactly the records held that it had not read, nothing twice.

Records are lost on the test run's Apache Kafka broker (the `broker` fixture) through the
Admin API's DeleteRecords and DeleteTopics, as retention or an operator loses them. The
planner and the
executor's read are also called directly (plain Python, a real broker), for the cases a
Spark run cannot time: a batch replayed after the loss, records deleted between planning and
reading."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.errors import InputError
from changelake.kafka import TopicReader, write_topic
from changelake.kafka.broker import KafkaBroker
from changelake.lake import Lake
from changelake.lake.follow import TOPICS, follow, topic_source, topics_address
from changelake.lake.follow_lag import follow_status
from changelake.simulate import random_history, write
from changelake.spark import kafka_source
from changelake.spark.errors import translate_errors
from changelake.spark.kafka_source import (
    KafkaCdcStreamReader,
    KafkaOptions,
    KafkaRange,
    read_range,
)
from tests.support.kafka_helpers import new_topic, produce_raw, row_schema
from tests.support.seeding import seeded

CLI = [str(Path(sys.executable).parent / "changelake")]
Place = tuple[int, int]  # (partition, offset)


def held(broker: KafkaBroker, topic: str) -> dict[Place, bytes]:
    """Every record the topic holds now (each partition from its first offset held)."""
    with TopicReader(broker.bootstrap, topic, framed=False) as reader:
        return {(r.partition, r.offset): r.value for r in reader.records()}


def fill(broker: KafkaBroker, topic: str, counts: dict[int, int], tag: str) -> None:
    """`counts[p]` records on partition p, each value naming its tag, partition and number."""
    produce_raw(broker, topic, [(p, f"{tag}-{p}-{i}".encode())
                                 for p, n in counts.items() for i in range(n)])


def options(broker: KafkaBroker, topic: str, lose: bool = False) -> KafkaOptions:
    return KafkaOptions.parse({"bootstrap": broker.bootstrap, "topics": topic,
                               "output": "records",
                               "failOnDataLoss": "false" if lose else "true"})


def test_the_option_is_parsed_and_auto_offset_reset_refused() -> None:
    base = {"bootstrap": "127.0.0.1:1", "topics": "t", "output": "records"}
    assert KafkaOptions.parse(base).fail_on_data_loss
    assert KafkaOptions.parse({**base, "failOnDataLoss": "TRUE"}).fail_on_data_loss
    assert not KafkaOptions.parse({**base, "FAILONDATALOSS": "False"}).fail_on_data_loss
    with pytest.raises(ValueError, match="kafka-cdc: failOnDataLoss must be true or false, "
                                         "not 'maybe'"):
        KafkaOptions.parse({**base, "failOnDataLoss": "maybe"})
    with pytest.raises(ValueError, match=r"kafka-cdc: kafka\.auto\.offset\.reset is not an option"):
        KafkaOptions.parse({**base, "kafka.auto.offset.reset": "latest"})


def test_the_executor_read_never_resets_silently(broker: KafkaBroker,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A range planned before its records were deleted, or its topic recreated: the read
    fails naming topic, partition, the offset and the partition's offsets (strict), or warns
    and reads what is held of the range (deleted) or nothing (recreated), never the records
    librdkafka would reset to."""
    topic = new_topic(broker, partitions=1)
    fill(broker, topic, {0: 10}, "a")
    broker.delete_records(topic, 0, 4)

    def offsets(part: KafkaRange, lose: bool) -> list[int]:
        return [row[4] for row in read_range(options(broker, topic, lose), part)]

    assert offsets(KafkaRange(topic, 0, 4, 10), False) == list(range(4, 10))
    with pytest.raises(ValueError) as caught:
        offsets(KafkaRange(topic, 0, 2, 8), False)
    assert str(caught.value) == (
        f"kafka-cdc: topic {topic} partition 0: the task reading offsets [2, 8) was at offset 2, "
        "but the partition's first offset is 4 and its end 10: records were deleted "
        "(retention or DeleteRecords) before being read (the option failOnDataLoss=false, "
        "`ingest --follow --kafka --no-fail-on-data-loss`, goes on from the first offset held)")
    with caplog.at_level(logging.WARNING, logger=kafka_source.__name__):
        assert offsets(KafkaRange(topic, 0, 2, 8), True) == [4, 5, 6, 7]
    assert [r.getMessage() for r in caplog.records] == [
        f"kafka-cdc: warning: topic {topic} partition 0: the task reading offsets [2, 8) was "
        "at offset 2, but the partition's first offset is 4 and its end 10: records were deleted "
        "(retention or DeleteRecords) before being read; going on from offset 4 "
        "(failOnDataLoss=false)"]

    # planned on the old topic, beyond what the recreated one holds (librdkafka's reset to
    # the beginning would give the new topic's records 0-2 as offsets 12-14 of the old one)
    broker.delete_topic(topic)
    broker.create_topic(topic, 1)
    fill(broker, topic, {0: 3}, "b")
    with pytest.raises(ValueError, match=f"kafka-cdc: topic {topic} partition 0: the "
                                         r"task reading offsets \[12, 15\) was at offset 12, but "
                                         "the partition's first offset is 0 and its end 3: "
                                         "the topic was recreated or truncated"):
        offsets(KafkaRange(topic, 0, 12, 15), False)
    assert offsets(KafkaRange(topic, 0, 12, 15), True) == []
    assert offsets(KafkaRange(topic, 0, 0, 3), False) == [0, 1, 2]


def test_the_planner_checks_every_partition_against_its_watermarks(
        broker: KafkaBroker, caplog: pytest.LogCaptureFixture) -> None:
    """`latestOffset` (the offset the query was at) and `partitions` (a batch's range, also
    one Spark replays after a restart without asking `latestOffset`), in both modes."""
    topic = new_topic(broker, partitions=2)
    fill(broker, topic, {0: 10, 1: 5}, "a")
    broker.delete_records(topic, 0, 6)
    strict = KafkaCdcStreamReader(options(broker, topic))
    lenient = KafkaCdcStreamReader(options(broker, topic, lose=True))

    def at(p0: int, p1: int | None = None) -> dict:
        return {topic: {"0": p0, **({} if p1 is None else {"1": p1})}}

    deleted = (f"kafka-cdc: topic {topic} partition 0: the query was at offset 2, but the "
               "partition's first offset is 6 and its end 10: records were deleted")
    with pytest.raises(ValueError, match=deleted):
        strict.latestOffset(at(2, 5), None)
    with pytest.raises(ValueError, match=deleted):
        strict.partitions(at(2, 5), at(8, 5))  # a replay of a batch planned before
    assert strict.partitions(at(6, 5), at(10, 5)) == [KafkaRange(topic, 0, 6, 10)]
    # a topic no longer in `topics` keeps its offsets, and a batch planned with it reads it
    other = {"dropped": {"0": 7}}
    assert strict.latestOffset({**at(6, 5), **other}, None) == {**at(10, 5), **other}
    assert strict.partitions(other, {"dropped": {"0": 9}}) == [KafkaRange("dropped", 0, 7, 9)]
    with caplog.at_level(logging.WARNING, logger=kafka_source.__name__):
        end = lenient.latestOffset(at(2, 5), None)
        assert end == at(10, 5)
        assert lenient.partitions(at(2, 5), end) == [KafkaRange(topic, 0, 6, 10)]
        assert lenient.partitions(at(2, 5), at(8, 5)) == [KafkaRange(topic, 0, 6, 8)]
        assert lenient.partitions(at(2, 5), at(4, 5)) == []  # all of it deleted
    assert len(caplog.records) == 1, "one warning per loss"
    assert caplog.records[0].getMessage().startswith(
        deleted.replace("kafka-cdc: ", "kafka-cdc: warning: "))

    # recreated with fewer records: offsets beyond the new ends
    broker.delete_topic(topic)
    broker.create_topic(topic, 2)
    fill(broker, topic, {0: 3}, "b")
    with pytest.raises(ValueError, match=f"topic {topic} partition 0: the query was at offset "
                                         "10, but the partition's first offset is 0 and its "
                                         "end 3: the topic was recreated or truncated"):
        strict.latestOffset(at(10, 5), None)
    with pytest.raises(ValueError, match="partition 0: the micro-batch reads up to offset 8, "
                                         "but the partition's first offset is 0 and its end 3"):
        strict.partitions(at(1, 0), at(8, 0))
    end = lenient.latestOffset(at(10, 5), None)
    assert end == at(3, 0)  # an end below the start: reset to the first offset
    assert lenient.partitions(at(10, 5), end) == [KafkaRange(topic, 0, 0, 3)]
    assert lenient.partitions(at(10, 5), at(12, 5)) == []  # a replay: nothing of it is held
    assert lenient.partitions(at(1, 0), at(8, 0)) == [KafkaRange(topic, 0, 1, 3)]

    # recreated with fewer partitions
    broker.delete_topic(topic)
    broker.create_topic(topic, 1)
    fill(broker, topic, {0: 4}, "c")
    with pytest.raises(ValueError, match=f"topic {topic} partition 1: the query was at offset "
                                         f"5, but the topic has no partition 1 now"):
        strict.latestOffset(at(2, 5), None)
    assert lenient.latestOffset(at(2, 5), None) == at(4)
    assert lenient.partitions(at(2, 5), at(4, 7)) == [KafkaRange(topic, 0, 2, 4)]

    # a partition added since the last batch, whose first records were deleted unread
    broker.delete_topic(topic)
    broker.create_topic(topic, 2)
    fill(broker, topic, {0: 4, 1: 3}, "d")
    broker.delete_records(topic, 1, 2)
    with pytest.raises(ValueError, match=f"topic {topic} partition 1: the query was at offset "
                                         "0, but the partition's first offset is 2 and its end "
                                         "3: records were deleted"):
        strict.latestOffset(at(2), None)
    with pytest.raises(ValueError, match=f"topic {topic} partition 1: the query was at offset 0"):
        strict.partitions(at(2), at(4, 3))
    assert lenient.latestOffset(at(2), None) == at(4, 3)
    assert lenient.partitions(at(2), at(4, 3)) == [KafkaRange(topic, 0, 2, 4),
                                                   KafkaRange(topic, 1, 2, 3)]


def run_stream(spark: Any, broker: KafkaBroker, topic: str, checkpoint: Path,
               **extra: str) -> dict[Place, bytes]:
    """An availableNow run of the topic's records on `checkpoint`: what it read. A failed
    query raises its error (as `translate_errors` brings it back)."""
    kafka_source.register(spark)
    read: dict[Place, bytes] = {}

    def collect(batch: Any, _batch_id: int) -> None:
        for row in batch.collect():
            place = (row["partition"], row["offset"])
            assert place not in read, f"{place} read twice"
            read[place] = bytes(row["value"])

    stream = (spark.readStream.format("kafka-cdc").option("bootstrap", broker.bootstrap)
              .option("topics", topic).option("output", "records").options(**extra).load())
    query = (stream.writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        translate_errors(query.awaitTermination, 300)
    finally:
        query.stop()
    return read


@pytest.mark.spark
def test_a_restarted_stream_fails_on_deleted_records_or_skips_them(
        spark: Any, broker: KafkaBroker, tmp_path: Path) -> None:
    """Stopped at each partition's end, then more records, of which the first three of
    partition 0 are deleted unread: the restart names them; with failOnDataLoss=false it reads
    exactly the records held that it had not read."""
    topic = new_topic(broker, partitions=2)
    checkpoint = tmp_path / "checkpoint"
    fill(broker, topic, {0: 6, 1: 4}, "a")
    first = run_stream(spark, broker, topic, checkpoint)
    assert first == held(broker, topic)

    fill(broker, topic, {0: 7, 1: 3}, "b")
    broker.delete_records(topic, 0, 9)  # 6, 7, 8: never read
    with pytest.raises(InputError) as caught:
        run_stream(spark, broker, topic, checkpoint)
    text = str(caught.value)
    assert text.startswith(f"kafka-cdc: topic {topic} partition 0: the query was at offset 6, "
                           "but the partition's first offset is 9 and its end 13: records "
                           "were deleted"), text
    assert "\n" not in text
    # failing read nothing and moved nothing: the same error again
    with pytest.raises(InputError, match="records were deleted"):
        run_stream(spark, broker, topic, checkpoint, failOnDataLoss="TRUE")

    second = run_stream(spark, broker, topic, checkpoint, failOnDataLoss="false")
    now = held(broker, topic)
    assert second == {place: value for place, value in now.items() if place not in first}
    assert sorted(second) == [(0, 9), (0, 10), (0, 11), (0, 12), (1, 4), (1, 5), (1, 6)]
    assert run_stream(spark, broker, topic, checkpoint) == {}  # and goes on from there


@pytest.mark.spark
def test_a_restarted_stream_fails_on_a_recreated_topic_or_starts_it_afresh(
        spark: Any, broker: KafkaBroker, tmp_path: Path) -> None:
    """The topic deleted and made again with fewer records than the query had read: the
    restart names the offset beyond the end; with failOnDataLoss=false it reads the new
    topic from its beginning (once), then only what follows."""
    topic = new_topic(broker, partitions=2)
    checkpoint = tmp_path / "checkpoint"
    fill(broker, topic, {0: 5, 1: 5}, "a")
    assert len(run_stream(spark, broker, topic, checkpoint)) == 10

    broker.delete_topic(topic)
    broker.create_topic(topic, 2)
    fill(broker, topic, {0: 2, 1: 7}, "b")  # partition 1 went past the old offset: unseen
    with pytest.raises(InputError, match=f"kafka-cdc: topic {topic} partition 0: the query "
                                         "was at offset 5, but the partition's first offset "
                                         "is 0 and its end 2: the topic was recreated"):
        run_stream(spark, broker, topic, checkpoint, maxRecordsPerTrigger="3")
    after = run_stream(spark, broker, topic, checkpoint, failOnDataLoss="false",
                       maxRecordsPerTrigger="3")
    assert after == {place: value for place, value in held(broker, topic).items()
                     if place[0] == 0 or place[1] >= 5}
    fill(broker, topic, {0: 2}, "c")
    assert sorted(run_stream(spark, broker, topic, checkpoint)) == [(0, 2), (0, 3)]


@pytest.mark.slow
@pytest.mark.spark
def test_follow_stops_on_deleted_records_unless_told_to_go_on(
        spark: Any, broker: KafkaBroker, tmp_path: Path) -> None:
    """`ingest --follow --kafka`'s source: records deleted unread stop the follow with the
    source's one line (an `InputError`, not a stack trace); `fail_on_data_loss=False` goes
    on and reads the rest."""
    messages = write(random_history(seeded(71), updates=30, times=5), batch_size=4)
    topic = new_topic(broker, partitions=1)
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(row_schema().avro))
    lake = Lake(spark, tmp_path / "lake")
    name = f"f_{uuid.uuid4().hex[:8]}"
    address = topics_address(broker.bootstrap, [topic])

    def run(**flags: Any) -> Any:
        return follow(lake, name, topic_source(broker.bootstrap, [topic], schema=schema,
                                               **flags),
                      address, kind=TOPICS, trigger_seconds=0.5, until_idle=1.5)

    half = len(messages) // 2
    read = write_topic(messages[:half], bootstrap=broker.bootstrap, topic=topic,
                       schema=row_schema()).messages
    assert run().committed >= 1
    write_topic(messages[half:], bootstrap=broker.bootstrap, topic=topic, schema=row_schema())
    broker.delete_records(topic, 0, read + 2)
    with pytest.raises(InputError, match=f"kafka-cdc: topic {topic} partition 0: the query was "
                                         f"at offset {read}, but the partition's first offset "
                                         f"is {read + 2}"):
        run()
    assert run(fail_on_data_loss=False).committed >= 1
    assert follow_status(lake.table(name).state().offsets)["records_behind"] == 0


def test_the_cli_flag_goes_with_follow_kafka_only(tmp_path: Path) -> None:
    lake = ["ingest", "--lake", str(tmp_path / "lake"), "--table", "t", "--no-fail-on-data-loss"]
    for args in (["--kafka", "127.0.0.1:1", "--topic", "x", "--schema", __file__],
                 ["--follow", "dir"], ["file.jsonl"]):
        done = subprocess.run([*CLI, *lake, *args], capture_output=True, timeout=60, text=True)
        assert done.returncode == 2, (args, done.stderr)
        assert "--no-fail-on-data-loss goes with --follow --kafka" in done.stderr, done.stderr
    assert not (tmp_path / "lake").exists()
    done = subprocess.run([*CLI, "ingest", "--help"], capture_output=True, timeout=60,
                          text=True)
    assert "--no-fail-on-data-loss" in done.stdout


@pytest.mark.slow
@pytest.mark.spark
def test_the_cli_follow_warns_on_its_stderr_once_per_loss_and_commits_what_is_held(
        broker: KafkaBroker, tmp_path: Path) -> None:
    """`ingest --follow --kafka --no-fail-on-data-loss`: records deleted unread are one
    `warning:` line on the command's own stderr (the planner that finds them runs in a process
    Spark starts, whose log is not the terminal), once though several micro-batches follow,
    and the follow commits every record still held."""
    from changelake.lake import arrow
    from changelake.lake.identifier import TableIdentifier
    from tests.lake.test_lake_follow import env
    from tests.lake.test_lake_follow_kafka import follow_topic_args

    messages = write(random_history(seeded(73), updates=80, times=8), batch_size=4)
    topic = new_topic(broker, partitions=1)
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(row_schema().avro))
    lake_dir, name = tmp_path / "lake", f"f_{uuid.uuid4().hex[:8]}"

    def run(*flags: str) -> subprocess.CompletedProcess:
        args = follow_topic_args(lake_dir, name, broker.bootstrap, topic, schema,
                                 "--until-idle", "2", *flags)
        done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env())
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    half = len(messages) // 2
    read = write_topic(messages[:half], bootstrap=broker.bootstrap, topic=topic,
                       schema=row_schema()).messages
    assert "warning" not in run().stderr
    end = read + write_topic(messages[half:], bootstrap=broker.bootstrap, topic=topic,
                             schema=row_schema()).messages
    broker.delete_records(topic, 0, read + 2)
    assert end - (read + 2) > 4  # more than one micro-batch's worth (4 records) still held
    done = run("--no-fail-on-data-loss")
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        f"changelake: warning: topic {topic} partition 0: the query was at offset {read}, but "
        f"the partition's first offset is {read + 2} and its end {end}: records were deleted "
        f"(retention or DeleteRecords) before being read; going on from offset {read + 2}"], \
        done.stderr[-3000:]
    assert sum(": committed version" in line for line in done.stderr.splitlines()) >= 2, \
        "several micro-batches after the loss (--max-records-per-trigger 4)"
    state = arrow.committed_state(lake_dir, TableIdentifier.parse(name))  # as committed
    assert follow_status(state.offsets)["records_behind"] == 0
