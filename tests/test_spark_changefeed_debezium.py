"""The JVM changefeed path agrees with `encode_changefeed` on generated Debezium histories."""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from changelake.convert import encode_changefeed
from changelake.protocol import collect
from changelake.spark.changefeed.pipeline import convert_frames
from changelake.values import thaw
from test_convert_history import PG_TABLE, PgHistory, write_pg

pytestmark = pytest.mark.spark


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def spark_updates(changes: Any) -> Counter[Any]:
    out: Counter[Any] = Counter()
    for row in changes.collect():
        data = tuple((k, _plain(v)) for k, v in row["data"].asDict().items())
        out[(data, row["time"])] += row["diff"]
    return Counter({k: v for k, v in out.items() if v})


def python_updates(messages: Any) -> Counter[Any]:
    out: Counter[Any] = Counter()
    for data, time, diff in collect(messages).updates:
        out[(tuple((k, _plain(v)) for k, v in thaw(data).items()), time)] += diff
    return Counter({k: v for k, v in out.items() if v})


PG_CASES = [
    PgHistory({1: ("ann", 150, "n1"), 2: ("bob", -3, "n2")},
              [[("update", 1, ("cy", 7, "n1"), True), ("insert", 101, ("dee", 0, "x"))],
               [("rekey", 2, 102, ("bob", -3, "n2")), ("delete", 101)],
               [("update", 102, ("ann", 9, "n3"), False)]],
              (0.8, 0.3), metadata, False, [0, 1, 2, 3] * 16)
    for metadata in (False, True)
]


def check(spark: Any, paths: list[Path], tmp_path: Path, table: dict[str, Any] | None,
          close: bool) -> None:
    schema_file = None
    if table is not None:
        import json

        schema_file = tmp_path / "table.json"
        schema_file.write_text(json.dumps(table))
    got = convert_frames(spark, paths, "debezium", ["id"], schema_file, close=close)
    assert got.path == "jvm", got.reason
    messages = list(encode_changefeed(paths, source="debezium", keys=["id"], table_schema=table,
                                      close=close, lenient=False))
    expected = collect(messages)
    assert got.frontier == (None if close else expected.frontier.elements[0])
    assert spark_updates(got.changes) == python_updates(messages)


@pytest.mark.parametrize("history", PG_CASES)
@pytest.mark.parametrize("close", [False, True])
def test_pg_history_matches_the_encoder(spark: Any, tmp_path: Path, history: PgHistory,
                                        close: bool) -> None:
    paths, _, _ = write_pg(history, tmp_path)
    check(spark, paths, tmp_path, PG_TABLE, close)
