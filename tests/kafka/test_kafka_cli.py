"""`changelake encode --to-kafka` and `decode --kafka` through the real console script, against
the mock cluster this test process serves: the round trip, the error contract, and a sink
killed with SIGKILL mid-write and run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from changelake.kafka import MockCluster, RegistryServer
from changelake.kafka.client import CONNECT_TIMEOUT
from changelake.simulate import History, random_history
from tests.support.kafka_helpers import (
    ROW_FIELDS,
    cluster,
    new_topic,
    produce_raw,
    registry,
    row_schema,
)
from tests.support.seeding import seeded

__all__ = ["cluster", "registry"]  # fixtures

CLI = [str(Path(sys.executable).parent / "changelake")]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=300)


def write_changes(history: History, path: Path) -> Path:
    """The history as `encode`'s input: changes in time order, `{"finished": T}` marks."""
    changes = sorted(history.changes, key=lambda u: u[1])
    lines, position = [], 0
    for point in history.finish_points:
        while position < len(changes) and changes[position][1] <= point:
            data, time_, diff = changes[position]
            lines.append(orjson.dumps({"data": dict(data), "time": time_, "diff": diff}))
            position += 1
        lines.append(orjson.dumps({"finished": point}))
    for data, time_, diff in changes[position:]:
        lines.append(orjson.dumps({"data": dict(data), "time": time_, "diff": diff}))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.json"
    path.write_bytes(orjson.dumps(row_schema().avro))
    return path


def decoded(out: bytes) -> tuple[list[dict], list]:
    lines = [orjson.loads(line) for line in out.splitlines()]
    return [x for x in lines if "data" in x], lines[-1]["frontier"]


def truth_of(history: History) -> list[dict]:
    return sorted((orjson.loads(orjson.dumps({"data": dict(d), "time": t, "diff": r}))
                   for d, t, r in history.truth), key=orjson.dumps)


def test_round_trip_through_a_topic(cluster: MockCluster, registry: RegistryServer,
                                    tmp_path: Path) -> None:
    history = random_history(seeded(31), updates=400, times=20)
    topic = new_topic(cluster, partitions=3)
    schema, changes = schema_file(tmp_path), write_changes(history, tmp_path / "in.jsonl")
    kafka = ["--kafka", cluster.bootstrap, "--topic", topic, "--schema-registry", registry.url]
    sink = ["--to-kafka", cluster.bootstrap, "--to-topic", topic, "--schema-registry",
            registry.url]
    wrote = run("encode", "--schema", str(schema), "--close", "--batch-size", "8", *sink,
                str(changes))
    assert wrote.returncode == 0, wrote.stderr
    assert f"to topic {topic} (3 partition(s), schema id" in wrote.stderr.decode()
    read = run("decode", *kafka)
    assert read.returncode == 0, read.stderr
    updates, frontier = decoded(read.stdout)
    assert frontier == []
    assert sorted(updates, key=orjson.dumps) == truth_of(history)
    # the same history, line for line, as decoding the file encode writes without Kafka (the
    # frontier lines between may differ: they depend on the order the messages came in)
    local = run("encode", "--schema", str(schema), "--close", str(changes))
    (tmp_path / "log.jsonl").write_bytes(local.stdout)
    from_file = run("decode", "--schema", str(schema), str(tmp_path / "log.jsonl"))
    assert decoded(from_file.stdout)[0] == updates


def test_cli_bad_records_and_usage(cluster: MockCluster, tmp_path: Path) -> None:
    history = random_history(seeded(32), updates=60, times=5)
    topic = new_topic(cluster, partitions=2)
    schema, changes = schema_file(tmp_path), write_changes(history, tmp_path / "in.jsonl")
    kafka = ["--kafka", cluster.bootstrap, "--topic", topic]
    sink = ["--to-kafka", cluster.bootstrap, "--to-topic", topic]
    assert run("encode", "--schema", str(schema), "--close", *sink, str(changes)).returncode == 0
    produce_raw(cluster, topic, [(1, b"\x07garbage")])
    strict = run("decode", "--schema", str(schema), *kafka)
    assert strict.returncode == 2
    err = strict.stderr.decode().strip()
    assert "\n" not in err and "Traceback" not in err
    assert f"topic {topic} partition 1, offset " in err
    assert "not a Confluent-framed or single-object Avro message" in err
    lenient = run("decode", "--lenient", "--schema", str(schema), *kafka)
    assert lenient.returncode == 0, lenient.stderr
    assert decoded(lenient.stdout)[1] == []
    assert f"set aside: topic {topic} partition 1, offset" in lenient.stderr.decode()
    # usage: half-given or conflicting options, one line each
    for args, words in [
        (["decode", "--kafka", cluster.bootstrap], "--kafka needs --topic"),
        (["decode", "--topic", topic], "--topic needs --kafka"),
        (["decode", "--group", "g", str(changes)], "--group and --schema-registry go with"),
        (["decode", *kafka, "--schema", str(schema), "--group", "g"], "--state FILE"),
        (["encode", "--schema", str(schema), *sink, "--avro", str(tmp_path / "x.avro")],
         "two destinations"),
        (["encode", *sink, str(changes)], "--to-kafka needs the schema"),
        (["decode", "--kafka", cluster.bootstrap, "--topic", "absent", "--schema", str(schema)],
         "topic 'absent' does not exist"),
    ]:
        result = run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert words in result.stderr.decode(), (args, result.stderr)


def topic_size(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "size"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(partitions))
    finally:
        consumer.close()


def kill_mid_write(command: list[str], changes: Path, bootstrap: str, topic: str,
                   partitions: int) -> None:
    """Start the sink on the first half of the changes, through a pipe held open, and SIGKILL
    it once its first messages are in the topic. The sink has not seen the end of its input,
    so the kill lands mid-stream however fast the sink writes: the stream cannot be closed."""
    lines = changes.read_bytes().splitlines(keepends=True)
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        assert process.stdin is not None
        process.stdin.write(b"".join(lines[: len(lines) // 2]))
        process.stdin.flush()
        deadline = time.monotonic() + 120
        while topic_size(bootstrap, topic, partitions) == 0:
            assert process.poll() is None, process.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the sink wrote nothing"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, process.stderr.read()  # type: ignore[union-attr]


def big_history() -> History:
    """Enough finished times that half the input makes many messages."""
    return random_history(seeded(33), updates=40_000, times=2_000, keys=400)


@pytest.mark.parametrize("transactional", [
    False, pytest.param(True, marks=pytest.mark.slow)])
def test_sink_killed_mid_write_and_run_again(request: pytest.FixtureRequest, tmp_path: Path,
                                             transactional: bool) -> None:
    """Killed, the sink leaves a prefix a reader decodes; run again, the whole history. The
    transactional sink runs against the real broker: its killed producer's transaction stays
    open, and a read-committed read ends at it (the mock has no isolation to show that),
    until the re-run's producer fences it."""
    cluster = request.getfixturevalue("broker" if transactional else "cluster")
    history = big_history()
    schema, changes = schema_file(tmp_path), write_changes(history, tmp_path / "big.jsonl")
    topic = new_topic(cluster, partitions=3)
    command = [*CLI, "encode", "--schema", str(schema), "--close", "--batch-size", "16",
               "--to-kafka", cluster.bootstrap, "--to-topic", topic]
    if transactional:
        command += ["--transactional-id", f"{topic}-sink"]
    kill_mid_write(command, changes, cluster.bootstrap, topic, 3)
    partial = run("decode", "--schema", str(schema), "--kafka", cluster.bootstrap,
                  "--topic", topic)
    assert partial.returncode == 0, partial.stderr
    some, frontier = decoded(partial.stdout)
    assert frontier != [], "the stream was closed before the kill"
    assert sorted(some, key=orjson.dumps) == \
        [u for u in truth_of(history) if u["time"] < frontier[0]]
    again = subprocess.run([*command, str(changes)], capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr
    final = run("decode", "--schema", str(schema), "--kafka", cluster.bootstrap,
                "--topic", topic)
    assert final.returncode == 0, final.stderr
    updates, frontier = decoded(final.stdout)
    assert frontier == []
    assert sorted(updates, key=orjson.dumps) == truth_of(history)


assert ROW_FIELDS  # the schema file's rows are simulate's


def closed_port() -> str:
    """A local address nothing listens at: a port bound, then let go."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_a_bootstrap_no_broker_answers_at_fails_in_one_line(tmp_path: Path) -> None:
    """Every command's first request to a cluster whose every bootstrap server refuses the
    connection fails saying so, exit 2 (after `client.CONNECT_TIMEOUT`, not librdkafka's 30 s
    request timeout: the four run at once, as a slow answer is no error here)."""
    bootstrap = closed_port()
    schema, changes = schema_file(tmp_path), tmp_path / "in.jsonl"
    changes.write_text('{"finished": 1}\n')
    commands = {
        "decode": ["decode", "--kafka", bootstrap, "--topic", "t", "--schema", str(schema)],
        "encode": ["encode", "--schema", str(schema), "--to-kafka", bootstrap, "--to-topic", "t",
                   str(changes)],
        "encode --from debezium": ["encode", "--from", "debezium", "--kafka", bootstrap,
                                   "--topic", "t", "--avro", str(tmp_path / "out.avro"),
                                   "--schema", str(schema)],
        **ingest_commands(tmp_path, bootstrap, "t", schema),
    }
    assert_each_refused(commands, f"changelake: error: cannot reach Kafka at {bootstrap}: no "
                        f"broker answered within {CONNECT_TIMEOUT:g} s (every bootstrap server "
                        "refused the connection, or its name did not resolve)")
    assert_no_lake(tmp_path)


def assert_each_refused(commands: dict[str, list[str]], line: str) -> None:
    """The commands, run at once, each exit 2 with `line` alone on stderr."""
    running = {name: subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
               for name, args in commands.items()}
    for name, process in running.items():
        _, err = process.communicate(timeout=240)
        assert process.returncode == 2, (name, err)
        assert err.strip() == line, (name, err)


def ingest_commands(tmp_path: Path, bootstrap: str, topics: str, schema: Path
                    ) -> dict[str, list[str]]:
    """`ingest --kafka` in each of its forms, each into a lake of its own under `tmp_path`."""
    def into(name: str, *args: str) -> list[str]:
        return ["ingest", "--lake", str(tmp_path / f"lake-{name}"), "--table", "t", "--kafka",
                bootstrap, "--topic", topics, "--master", "local[1]", *args]

    return {
        "ingest": into("cdc", "--schema", str(schema)),
        "ingest --from debezium": into("debezium", "--from", "debezium", "--key", "id"),
        "ingest --follow": into("follow", "--follow", "--schema", str(schema),
                                "--until-idle", "1"),
        "ingest --follow --from debezium": into("follow-debezium", "--follow", "--from",
                                                "debezium", "--key", "id", "--until-idle", "1"),
    }


def assert_no_lake(tmp_path: Path) -> None:
    """The evidence that an ingest refused before Spark started: Spark's session makes the
    lake's directory (and its metastore under it) first thing, and none was made."""
    made = sorted(p.name for p in tmp_path.glob("lake-*"))
    assert made == [], f"the lake was made (Spark started) before the refusal: {made}"


def test_ingest_refuses_a_topic_that_does_not_exist_before_spark_starts(
        cluster: MockCluster, tmp_path: Path) -> None:
    """`ingest --kafka` (each form) checks on the driver that every topic named exists before
    it starts Spark and the lake's metastore: a topic missing beside one that exists is named,
    one line, exit 2, and no lake is made."""
    schema, present = schema_file(tmp_path), new_topic(cluster)
    missing = f"{present}-missing"
    commands = ingest_commands(tmp_path, cluster.bootstrap, f"{present},{missing}", schema)
    assert_each_refused(commands, f"changelake: error: topic {missing!r} does not exist on "
                                  f"{cluster.bootstrap}")
    assert_no_lake(tmp_path)
