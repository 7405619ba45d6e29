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
from tests.support.kafka_helpers import cluster, new_topic, row_schema
from tests.support.seeding import seeded

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


def test_follow_topics_takes_a_schema_of_the_rows_alone(spark, cluster: MockCluster,
                                                        tmp_path: Path) -> None:
    """`--schema` may be the rows' Avro record alone, as `ingest --kafka` takes it: the follow
    had handed the file's text to the source, which wants the union (an internal error)."""
    rows = tmp_path / "rows.json"
    rows.write_bytes(orjson.dumps(row_schema().data_type))
    topic = new_topic(cluster, partitions=1)
    frame = topic_source(cluster.bootstrap, [topic], schema=rows)(spark)
    assert frame.isStreaming and {"updates", "progress"} <= set(frame.columns)


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


def follow_topic_args(lake_dir: Path, name: str, bootstrap: str, topic: str, schema: Path,
                      *extra: str) -> list[str]:
    from tests.lake.test_lake_follow import cli

    return cli("ingest", "--lake", str(lake_dir), "--table", name, "--schema", str(schema),
               "--follow", "--kafka", bootstrap, "--topic", topic, "--trigger-seconds", "0.5",
               "--max-records-per-trigger", "4", "--conf", "spark.sql.shuffle.partitions=2",
               "--master", "local[1]", *extra)


def kill_and_restart_topic_follow(spark, cluster: MockCluster, tmp_path: Path,
                                  seed: int) -> None:
    """Pieces of a mangled history are produced as batches commit; the follow process is
    SIGKILLed at a seeded step line, the rest produced, and a restart on the same checkpoint
    runs to idle: the table equals a one-shot ingest of the same messages (files), nothing
    lost, nothing doubled."""
    import signal
    import time

    from tests.lake.test_lake_follow import (
        CDC,
        Follower,
        consolidated,
        drop,
        one_shot,
        pieces,
        schema_file,
    )

    rng = seeded(seed)
    parts = pieces(rng, 5)
    topic = new_topic(cluster, partitions=2)
    schema, lake_dir, name = schema_file(tmp_path), tmp_path / "lake", "followed"
    reference = tmp_path / "reference"

    def produce(n: int) -> None:
        write_topic(parts[n], bootstrap=cluster.bootstrap, topic=topic, schema=CDC)
        drop(reference, n, parts[n])

    produce(0)
    args = follow_topic_args(lake_dir, name, cluster.bootstrap, topic, schema)
    first = Follower(args)
    kill_at, delay = rng.randrange(1, 3 * 3), rng.choice([0.0, 0.05, 0.3])
    produced = 1
    while len(first.steps()) < kill_at:
        first.wait_for(len(first.steps()) + 1)
        committed = sum(": committed" in s for s in first.steps())
        if committed >= produced and produced < len(parts):
            produce(produced)
            produced += 1
    time.sleep(delay)
    first.process.send_signal(signal.SIGKILL)
    first.finish()
    for n in range(produced, len(parts)):
        produce(n)
    second = Follower([*args, "--until-idle", "4"])
    assert second.finish() == 0, "\n".join(second.lines[-20:])
    assert consolidated(lake_dir, name) == one_shot(spark, tmp_path.joinpath, reference, schema), (
        f"seed {seed}: killed at step {kill_at} + {delay}s\n"
        + "\n".join(first.lines[-8:] + second.lines[-10:]))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [6])  # one seed: the directory follow has five
def test_sigkill_of_a_topic_follow_and_restart(spark, cluster: MockCluster, tmp_path: Path,
                                               seed: int) -> None:
    kill_and_restart_topic_follow(spark, cluster, tmp_path, seed)
