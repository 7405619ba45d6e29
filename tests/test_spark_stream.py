"""Streaming decode: exactly once across replays, and across kill -9 of a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from changelake.formats.materialize import CdcSchema, read_all, write_json_lines, write_ocf
from changelake.local import update_line
from changelake.protocol import Antichain, Message, Updates, collect
from changelake.spark.decode_files import read_messages_frame
from changelake.spark.stream import DecodeBatches, latest_state, read_history
from conftest import seeded
from spark_helpers import write

pytestmark = pytest.mark.spark

SCHEMA = CdcSchema.for_fields(
    [{"name": "k", "type": "long"}, {"name": "v", "type": ["null", "long"]}]
)


def _messages(seed: int, n: int) -> list[Message]:
    rng = seeded(seed)
    changes = [
        ({"k": rng.randrange(20), "v": rng.choice([None, 1, 2])}, rng.randrange(12),
         rng.choice([-1, 1, 2]))
        for _ in range(n)
    ]
    messages = [*write(changes, [2, 5, 8], True, 5), *write(changes, [4, 9], True, 3)]
    messages = [m for m in messages for _ in range(rng.randint(1, 2))]
    rng.shuffle(messages)
    return messages


def _write_files(directory: Path, messages: list[Message], first: int) -> list[Path]:
    """One file per few messages, appearing atomically (hidden name, then rename)."""
    directory.mkdir(exist_ok=True)
    out = []
    for i in range(0, len(messages), 4):
        name = f"{first + i:05d}." + ("avro" if i % 8 else "jsonl")
        hidden = directory / f".{name}"
        with hidden.open("wb") as fo:
            if name.endswith("avro"):
                write_ocf(fo, messages[i : i + 4], SCHEMA)
            else:
                write_json_lines(fo, messages[i : i + 4], SCHEMA)
        hidden.rename(directory / name)
        out.append(directory / name)
    return out


def _lines(spark, output: Path) -> list[bytes]:
    history = read_history(spark, output)
    if history is None:
        return []
    return sorted(
        b'{"data":%s,"time":%d,"diff":%d}' % (r["data"].encode(), r["time"], r["diff"])
        for r in history.collect()
    )


def _expected(directory: Path) -> tuple[list[bytes], Antichain]:
    local = collect(read_all([directory], schema=SCHEMA))
    return sorted(update_line(u) for u in local.updates), local.frontier


def test_batches_replayed_after_a_crash_are_neither_lost_nor_repeated(spark, tmp_path) -> None:
    messages = _messages(1, 80)
    thirds = [messages[i::3] for i in range(3)]
    inputs = tmp_path / "in"
    files = [_write_files(inputs, part, 1000 * i) for i, part in enumerate(thirds)]
    output, state = tmp_path / "out", tmp_path / "state"
    sink = DecodeBatches(output, state)

    def batch(n: int):
        return read_messages_frame(spark, [str(f) for f in files[n]], schema=SCHEMA)

    sink(batch(0), 0)
    sink(batch(1), 1)
    # A crash after batch 1's output but before its state was committed: Spark replays 1.
    import shutil

    shutil.rmtree(state / "000000000001")
    sink(batch(1), 1)
    sink(batch(1), 1)  # a replay of a committed batch does nothing
    sink(batch(2), 2)

    expected, frontier = _expected(inputs)
    assert _lines(spark, output) == expected
    found = latest_state(state)
    assert found is not None and found[0].frontier == frontier == Antichain()
    assert found[0].statements == () and not found[0].has_pending  # closed: nothing kept


def test_state_keeps_only_unfinished_updates_and_statements(spark, tmp_path) -> None:
    messages = _messages(2, 60)
    inputs = tmp_path / "in"
    # Every update, but no progress statement about times 9 and later: those times stay
    # unfinished, their updates pending; every statement kept is finished.
    early = [m for m in messages if isinstance(m, Updates) or not _mentions_late_times(m)]
    files = _write_files(inputs, early, 0)
    sink = DecodeBatches(tmp_path / "out", tmp_path / "state")
    sink(read_messages_frame(spark, [str(f) for f in files], schema=SCHEMA), 0)
    found = latest_state(tmp_path / "state")
    assert found is not None
    state, path = found
    local = collect(read_all([inputs], schema=SCHEMA))
    assert state.frontier == local.frontier
    assert state.frontier == Antichain([9])
    assert state.statements == ()  # all finished: none kept
    # Exactly the updates beyond the frontier are kept, as pending.
    late = {t for m in early if isinstance(m, Updates) for _, t, _ in m.updates
            if local.frontier.beyond(t)}
    assert late and state.has_pending
    pending = spark.read.parquet(str(path / "pending")).collect()
    assert {r["time"] for r in pending} == late


def _mentions_late_times(message: Message) -> bool:
    from changelake.protocol import Updates

    if isinstance(message, Updates):
        return any(t >= 9 for _, t, _ in message.updates)
    return not message.upper or message.upper.elements[0] > 9


@pytest.mark.slow
def test_kill_9_and_restart_loses_and_repeats_nothing(spark, tmp_path) -> None:
    messages = _messages(3, 400)
    parts = [messages[i::4] for i in range(4)]
    inputs, output, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(SCHEMA.avro))
    command = [sys.executable, "-m", "changelake.spark.stream", "--input", str(inputs),
               "--output", str(output), "--checkpoint", str(checkpoint),
               "--schema", str(schema), "--master", "local[2]", "--interval", "1 second",
               "--max-files-per-trigger", "3"]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    _write_files(inputs, parts[0], 0)
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        state_dir = checkpoint / "decoder"
        _poll(lambda: latest_state(state_dir) is not None, "a first committed batch")
        _write_files(inputs, parts[1], 10_000)
        committed = latest_state(state_dir)
        assert committed is not None
        _poll(lambda: (latest_state(state_dir) or committed)[0].batch > committed[0].batch,
              "another batch")
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the driver and its Python workers, at once
        process.wait(timeout=60)
    _write_files(inputs, parts[2], 20_000)
    _write_files(inputs, parts[3], 30_000)
    finish = subprocess.run([*command, "--available-now"], env=env, capture_output=True,
                            timeout=600)
    assert finish.returncode == 0, finish.stderr.decode()[-3000:]

    expected, frontier = _expected(inputs)
    got = _lines(spark, output)
    assert got, finish.stderr.decode()[-5000:]
    assert len(got) == len(set(got))  # nothing repeated
    assert got == expected  # nothing lost
    found = latest_state(checkpoint / "decoder")
    assert found is not None and found[0].frontier == frontier


def _poll(predicate, what: str, bound: float = 180.0) -> None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
