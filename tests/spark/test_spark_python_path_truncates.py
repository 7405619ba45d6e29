"""The old (UDF) path collects a batch's truncates to the driver, for every key's group: at most
`MAX_TRUNCATES` of them (issue 67: nothing collected in proportion to the input), more refused
in one line at the first beyond the bound."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.errors import ChangefeedError
from changelake.spark.changefeed.python_path import changefeed_changes, run_converters
from tests.spark.test_spark_changefeeds import lines_frame

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def python_workers(spark: Any) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark.sparkContext.pythonExec = sys.executable


def _event(op: str, tx: int, row: dict | None = None) -> bytes:
    event: dict[str, Any] = {"op": op, "ts_ms": 1000 + tx, "source": {
        "connector": "postgresql", "db": "postgres", "schema": "public", "table": "t",
        "txId": tx, "lsn": 100 * tx, "snapshot": False}}
    if row is not None:
        event["after"] = row
    return orjson.dumps(event)


def feed(path: Path, truncates: int) -> Path:
    """Each transaction inserts a row, then truncates the table."""
    lines = []
    for tx in range(1, truncates + 1):
        lines += [_event("c", 2 * tx, {"id": tx}), _event("t", 2 * tx + 1)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_more_truncates_than_the_bound_are_refused_in_one_line(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound made 3 (10,000 truncates would be a long test): the 4th truncate, line 8, is
    named."""
    monkeypatch.setattr(run_converters, "MAX_TRUNCATES", 3)
    path = feed(tmp_path / "t.jsonl", 5)
    with pytest.raises(ChangefeedError) as caught:
        changefeed_changes(lines_frame(spark, [path]), source="debezium", keys=["id"],
                           close=True)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{path}, line 8: more than 3 truncates"), text


def test_truncates_within_the_bound_empty_the_table(spark: Any, tmp_path: Path) -> None:
    path = feed(tmp_path / "t.jsonl", 5)
    frames = changefeed_changes(lines_frame(spark, [path]), source="debezium", keys=["id"],
                                close=True)
    total: dict[int, int] = {}
    for row in frames.changes.collect():
        key = row["data"]["id"]
        total[key] = total.get(key, 0) + row["diff"]
    assert set(total) == {1, 2, 3, 4, 5} and set(total.values()) == {0}
