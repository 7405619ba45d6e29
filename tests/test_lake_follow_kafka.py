"""`ingest --follow --kafka`: Kafka topics of Materialize CDC messages followed into a lake
table by the `kafka-cdc` streaming source, each micro-batch one exactly-once commit, the
topics' offsets in the follow's checkpoint (`lake/follow.py`, `topic_source`); `status` says
how many records, and how old the oldest, no committed batch has read (`follow_lag.py`)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest

from changelake.errors import LakeError
from changelake.kafka import MockCluster, write_topic
from changelake.lake import Lake
from changelake.lake.follow import TOPICS, follow, topic_source, topics_address
from changelake.lake.follow_lag import follow_status
from changelake.lake.kafka_ingest import ingest_topics
from changelake.protocol import Progress
from changelake.simulate import justified, random_history, write
from conftest import seeded
from kafka_helpers import cluster, new_topic, row_schema

__all__ = ["cluster"]  # fixture

pytestmark = pytest.mark.spark

CLI = [str(Path(sys.executable).parent / "changelake")]


def table_updates(lake: Lake, name: str) -> Counter:
    return Counter((r["id"], r["v"], r["_time"], r["_diff"])
                   for r in lake.table(name).updates().collect())


def truth_updates(updates) -> Counter:
    return Counter((d.get("id"), d.get("v"), t, r) for d, t, r in updates)


def test_follow_topics_commits_each_batch_once_and_status_shows_the_lag(
        spark, cluster: MockCluster, tmp_path: Path) -> None:
    history = random_history(seeded(61), updates=200, times=12)
    messages = write(history, batch_size=5)
    cut = next(i + 1 for i, m in enumerate(messages)
               if isinstance(m, Progress) and i >= len(messages) // 2)
    topic = new_topic(cluster, partitions=3)
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(row_schema().avro))
    produce = lambda part: write_topic(part, bootstrap=cluster.bootstrap,  # noqa: E731
                                       topic=topic, schema=row_schema()).messages
    produce(messages[:cut])
    lake = Lake(spark, tmp_path / "lake")
    name = f"f_{uuid.uuid4().hex[:8]}"
    address = topics_address(cluster.bootstrap, [topic])

    def run(**options) -> object:
        return follow(lake, name, topic_source(cluster.bootstrap, [topic], schema=schema,
                                               **options),
                      address, kind=TOPICS, trigger_seconds=0.5, until_idle=3)

    first = run()
    assert first.committed >= 1
    updates, frontier = justified(history.truth, messages[:cut])
    assert table_updates(lake, name) == truth_updates(updates)
    assert lake.table(name).state().upper == frontier[0]
    lag = follow_status(lake.table(name).state().offsets)
    assert lag["records_behind"] == 0 and lag["seconds_behind"] == 0.0 and lag["error"] is None

    added = produce(messages[cut:] + messages[cut:cut + 5])  # the tail, some of it twice
    lag = follow_status(lake.table(name).state().offsets)
    assert lag["records_behind"] == added and lag["seconds_behind"] >= 0
    second = run(max_records_per_trigger=7)  # the same checkpoint: only the new records
    assert second.batches >= added // 7
    assert table_updates(lake, name) == truth_updates(history.truth)
    assert lake.table(name).state().upper is None  # the history closed
    assert follow_status(lake.table(name).state().offsets)["records_behind"] == 0

    # a table followed from topics is not one `ingest --kafka` resumes, nor the reverse
    with pytest.raises(LakeError, match="records offsets of a topics"):
        ingest_topics(lake, name, cluster.bootstrap, topic, schema=schema)


def test_follow_kafka_usage_errors(tmp_path: Path) -> None:
    lake = ["ingest", "--lake", str(tmp_path / "lake"), "--table", "t", "--follow"]
    for args, message in [
            (["--kafka", "127.0.0.1:1", "--topic", "x", "--schema", __file__, "dir"],
             "no INPUT as well"),
            (["--kafka", "127.0.0.1:1", "--topic", "x"], "--schema-registry URL"),
            (["--kafka", "127.0.0.1:1", "--topic", "x", "--schema", __file__, "--group", "g"],
             "do not go with --follow --kafka"),
            (["a", "b"], "one INPUT directory"),
            (["--max-records-per-trigger", "5", "dir"], "one INPUT directory")]:
        done = subprocess.run([*CLI, *lake, *args], capture_output=True, timeout=60, text=True)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    assert not (tmp_path / "lake").exists()
