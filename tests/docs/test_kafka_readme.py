"""The Kafka guide's Python example (docs/guides/kafka.md, the block marked
`<!-- run: kafka-python -->`; once the README's) runs as written, in a fresh process (its mock
cluster and registry are its own), and prints what `decode --kafka` prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "kafka.md"


def kafka_example() -> str:
    (block,) = re.findall(r"<!-- run: kafka-python -->\n```python\n(.*?)```", PAGE.read_text(),
                          re.S)
    return block


def test_the_kafka_example_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", kafka_example()], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [orjson.loads(line) for line in done.stdout.split()]
    assert [x for x in lines if "data" in x] == [
        {"data": {"id": 5, "price": 12}, "time": 4, "diff": 1},
        {"data": {"id": 5, "price": 10}, "time": 5, "diff": 1},
        {"data": {"id": 5, "price": 12}, "time": 5, "diff": -1},
    ]
    assert lines[-1] == {"frontier": []}


def test_the_broker_example_runs_as_written(tmp_path: Path) -> None:
    """The guide's `KafkaBroker` example (`<!-- run: broker-python -->`) starts a broker with a
    SASL listener, makes a compacted topic, kills the broker and starts it again, as written;
    what it prints is the two addresses it serves on."""
    (block,) = re.findall(r"<!-- run: broker-python -->\n```python\n(.*?)```",
                          PAGE.read_text(), re.S)
    done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.fullmatch(r"127\.0\.0\.1:\d+ 127\.0\.0\.1:\d+\n", done.stdout), done.stdout
