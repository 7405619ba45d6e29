"""What the changefeed tests on Spark share: the generated PostgreSQL histories they all run,
and the two sides they compare (the updates a Spark path produced, and the updates the
pure-Python encoder's messages carry), as counters of plain values."""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from changelake.protocol import collect
from changelake.values import thaw
from tests.convert.test_convert_history import PgHistory


def plain(value: Any) -> Any:
    """One spelling for values the two sides type differently (Uint64 as a decimal, NaN)."""
    if isinstance(value, Decimal):
        return int(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def spark_updates(changes: Any) -> Counter[Any]:
    """The `(data, time)` multiplicities of a DataFrame of `(data, time, diff)`."""
    out: Counter[Any] = Counter()
    for row in changes.collect():
        data = tuple((k, plain(v)) for k, v in row["data"].asDict().items())
        out[(data, row["time"])] += row["diff"]
    return Counter({k: v for k, v in out.items() if v})


def python_updates(messages: Any) -> Counter[Any]:
    """The `(data, time)` multiplicities that the encoder's messages recover to."""
    out: Counter[Any] = Counter()
    for data, time, diff in collect(messages).updates:
        out[(tuple((k, plain(v)) for k, v in thaw(data).items()), time)] += diff
    return Counter({k: v for k, v in out.items() if v})


PG_CASES = [
    PgHistory({1: ("ann", 150, "n1"), 2: ("bob", -3, "n2")},
              [[("update", 1, ("cy", 7, "n1"), True), ("insert", 101, ("dee", 0, "x"))],
               [("rekey", 2, 102, ("bob", -3, "n2")), ("delete", 101)],
               [("update", 102, ("ann", 9, "n3"), False)]],
              (0.8, 0.3), metadata, False, [0, 1, 2, 3] * 16)
    for metadata in (False, True)
]


def write_float_keys(path: Path) -> Path:
    """A keyed feed whose key values are equal in Python but spelled apart: `1` then `1.0`,
    `0.0` then `-0.0`; the update and the delete must find the rows they change."""
    def line(op: str, lsn: int, before: Any, after: Any) -> bytes:
        return orjson.dumps({"op": op, "before": before, "after": after, "source": {
            "connector": "postgresql", "lsn": lsn, "txId": lsn, "snapshot": "false"}})

    path.write_bytes(b"\n".join([
        line("c", 100, None, {"id": 1, "name": "a"}),
        line("u", 110, None, {"id": 1.0, "name": "b"}),
        line("c", 120, None, {"id": 0.0, "name": "z"}),
        line("d", 130, {"id": -0.0}, None),
        line("c", 140, None, {"id": 2.5, "name": "c"})]) + b"\n")
    return path


#: The rows `write_float_keys`'s feed leaves.
FLOAT_KEYS_FINAL = Counter({(("id", 1.0), ("name", "b")): 1, (("id", 2.5), ("name", "c")): 1})


def final_rows(updates: Counter[Any]) -> Counter[Any]:
    """The rows a history of `(data, time)` multiplicities ends with."""
    out: Counter[Any] = Counter()
    for (data, _), diff in updates.items():
        out[data] += diff
    return +out
