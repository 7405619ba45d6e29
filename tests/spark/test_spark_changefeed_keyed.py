"""The Java keyed conversion (`spark/jvm/KeyedConversion.java`) gives exactly the rules' result.

`keyed.java_convert` is the keyed conversion on Spark. On generated events, shuffled by key,
its updates (compared by `repr`, so a -0.0 is not a 0.0) and its checks (the least problem,
and whether two writes of a key tie at one position) must be those of `_rules`, a plain
Python statement of `keyed.py`'s rules over the same events (the updates of a key with a
tie are left out: the batch then goes to the Python path, `TIED`). The conversion from
lines is compared with `encode_changefeed` by the Debezium and YDB tests.

The events are generated so that every rule has work: several events of a key at one
position (replays, ties of different rows), positions below the key's greatest (stale),
deletes that restart a key's values, UNCHANGED values filled from the segment's real values,
the table's row, or the first write's before image; keys of two columns, one a double with
-0.0 and 0.0, data with NaN and -0.0; positions of longs (Debezium) and of Uint64 decimals
(YDB).
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest

from changelake.spark.changefeed.keyed import (
    ColumnSpec,
    by_key,
    java_convert,
    java_ready,
)
from changelake.spark.changefeed.types import Decoder
from changelake.spark.settings import NOT_ADAPTIVE, settings
from tests.support.seeding import seeded

COLUMNS = [ColumnSpec(n, t, t, Decoder(), Decoder()) for n, t in
           (("id", "bigint"), ("tag", "double"), ("name", "string"), ("x", "double"),
            ("flag", "boolean"))]
NAMES = [c.name for c in COLUMNS]


def _value(rng: random.Random, name: str) -> Any:
    if name == "name":
        return rng.choice([None, "a", "b", "é", "a" * 40])
    if name == "x":
        return rng.choice([None, 0.0, -0.0, 1.5, float("nan"), -2.0])
    return rng.choice([None, True, False])


def _events(rng: random.Random, keys: int, decimal_pos: bool) -> list[tuple[Any, ...]]:
    """Rows of `_schema`: each key's events at random times and positions (few of each, so
    that they meet), writes and deletes, some values UNCHANGED."""
    out = []
    for k in range(keys):
        id_, tag = k // 3, [0.0, -0.0, 7.5][k % 3]
        for _ in range(rng.randint(1, 9)):
            delete = rng.random() < 0.25
            pos = [rng.randint(0, 3) for _ in range(rng.choice([1, 2]))]
            if decimal_pos:  # Uint64s of 1, 8 and 9 bytes (`Positions.compareSigned`)
                pos = [Decimal([0, 2**62, 2**63, 2**64 - 1][p]) for p in pos]
            a = None if delete else (id_, tag, *[_value(rng, n) for n in NAMES[2:]])
            ua = (False, False, *[rng.random() < 0.3 for _ in NAMES[2:]])
            b = rng.choice([None, (id_, tag, *[_value(rng, n) for n in NAMES[2:]])])
            ub = (False, False, *[rng.random() < 0.2 for _ in NAMES[2:]])
            problem = rng.choice([None] * 30 + ["bad: cannot tell the key",
                                                "unsupported: a null key"])
            key = _decimal_key(id_) if decimal_pos else id_
            out.append((key, tag, rng.randint(0, 4), pos, 0 if delete else 1, delete, a, ua,
                        b, ub, problem))
    return out


def _decimal_key(id_: int) -> Decimal:
    """A decimal(20,0) key (YDB's Uint64, a Debezium decimal) for `id_`, from -2^63 to
    2^64-1: ids `6n + 1` and `6n + 5` are -1-n and 2^63-1-n, one long apart only by sign
    (`keyed._as_longs`)."""
    n = id_ // 6
    return Decimal([-(2**63) + n, -1 - n, n, 2**63 + n, 2**64 - 1 - n, 2**63 - 1 - n][id_ % 6])


def _schema(decimal_pos: bool) -> str:
    row = "struct<id: bigint, tag: double, name: string, x: double, flag: boolean>"
    flags = "struct<id: boolean, tag: boolean, name: boolean, x: boolean, flag: boolean>"
    element = "decimal(20,0)" if decimal_pos else "bigint"
    return (f"k0 {element}, k1 double, time bigint, pos array<{element}>, rank int, "
            f"is_delete boolean, a {row}, ua {flags}, b {row}, ub {flags}, problem string")


def _plain(value: Any) -> Any:
    """A value as Spark groups it: -0.0 as 0.0, rows as tuples."""
    if isinstance(value, float) and value == 0.0:
        return 0.0
    if isinstance(value, tuple | list):
        return tuple(_plain(v) for v in value)
    return value


def _rules(rows: list[tuple[Any, ...]], state: list[tuple[Any, ...]] | None
           ) -> tuple[list[str], tuple[str | None, bool | None], set[Any]]:
    """(updates as sorted reprs, checks, tied keys) of `_events`' rows by the module
    docstring of `keyed.py`: per key, the events in (time, position, rank) order; one applied
    where its (position, rank) is above every earlier event's; a tie where a write meets, at
    the greatest earlier (position, rank), a write of another row; a written column's value
    the after image's, an UNCHANGED one the segment's last real value, else the table's row
    (before any delete), else the segment's first write's before image, else null. The
    updates are consolidated by row and time, as Spark's are."""
    from collections import Counter, defaultdict

    table = {_plain(r[:2]): tuple(r) for r in state or []}
    by_key: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
    for r in rows:
        by_key[_plain((r[0], r[1]))].append(r)
    updates: Counter[tuple[str, int, Any]] = Counter()
    tied: set[Any] = set()  # the keys with a tie
    tied_rows: set[Any] = set()  # their rows' key columns (a decimal key's `id` is `id_`)
    least = min((r[10] for r in rows if r[10] is not None), default=None)
    for key, events in by_key.items():
        # Among events at one (time, position, rank), any order gives the same: the content
        # breaks the tie here so that the order is fixed.
        events.sort(key=lambda r: (r[2], list(r[3]), r[4], repr(_plain((r[6], r[7])))))
        seen: tuple[Any, ...] | None = None  # (position, rank, content) greatest so far
        previous = st = table.get(key)
        segment_first: tuple[Any, Any] | None = None  # (b, ub) of the segment's first write
        reals: dict[int, Any] = {}
        deleted = False
        last_deleted = True  # a key's first write starts its segment
        for (_, _, time, pos, rank, is_delete, a, ua, b, ub, _) in events:
            content = repr(_plain((a, ua)))
            here = (list(pos), rank)
            if rank == 1 and seen is not None and seen[1] == 1 and seen[0] == list(pos) \
                    and seen[2] != content:
                tied.add(key)
                tied_rows.add(_plain(a[:2]))
            applied = seen is None or here > (seen[0], seen[1])
            if seen is None or (here, content) > ((seen[0], seen[1]), seen[2]):
                seen = (list(pos), rank, content)
            if not applied:
                continue
            if is_delete:
                new = None
                deleted, reals, last_deleted = True, {}, True
            else:
                if last_deleted:
                    segment_first = (b, ub)
                last_deleted = False
                values = []
                for i, _name in enumerate(NAMES):
                    if not ua[i]:
                        reals[i] = a[i]
                    if i in reals:
                        values.append(reals[i])
                    elif not deleted and st is not None:
                        values.append(st[i])
                    elif segment_first is not None and segment_first[0] is not None \
                            and not segment_first[1][i]:
                        values.append(segment_first[0][i])
                    else:
                        values.append(None)
                new = tuple(values)
            if previous is not None:
                updates[(repr(_plain(previous)), time, key)] -= 1
            if new is not None:
                updates[(repr(_plain(new)), time, key)] += 1
            previous = new
    found = sorted(repr((data, time, diff)) for (data, time, key), diff in updates.items()
                   if diff != 0 and key not in tied)
    return found, (least, True if tied else None), tied_rows


def _both(spark: Any, rows: list[tuple[Any, ...]], decimal_pos: bool,
          state: list[tuple[Any, ...]] | None
          ) -> tuple[tuple[list[str], Any], tuple[list[str], Any]]:
    """(updates as sorted reprs, checks) by `_rules` and by Java, on the same events."""
    from pyspark.sql import functions as F

    keys = ["id", "tag"]
    events = spark.createDataFrame(rows, _schema(decimal_pos)) \
        .withColumn("content", F.xxhash64("a", "ua"))
    table = None if state is None else spark.createDataFrame(
        state, "id bigint, tag double, name string, x double, flag boolean")
    expected, checks, tied = _rules(rows, state)
    ready = java_ready(events, 2)  # the keys and positions as longs, before the shuffle
    assert ("k0_long" in ready.columns) == decimal_pos
    with settings(spark, NOT_ADAPTIVE):
        java = java_convert(by_key(ready, 2, 5), COLUMNS, keys, table)
    converted = java.collect()
    report = [r for r in converted if r["diff"] == 0]
    assert all(r["data"] is None and r["time"] is None for r in report)

    def reprs(found: list[Any]) -> list[str]:
        return sorted(repr((repr(tuple(r["data"])), r["time"], r["diff"])) for r in found
                      if _plain(tuple(r["data"])[:2]) not in tied)

    least = min((r["problem"] for r in report if r["problem"] is not None), default=None)
    java_tied = True if any(r["tied"] for r in report) else None
    return ((expected, checks),
            (reprs([r for r in converted if r["diff"] != 0]), (least, java_tied)))


@pytest.mark.parametrize("decimal_pos", [False, True], ids=["debezium-pos", "ydb-pos"])
def test_java_conversion_follows_the_rules(spark: Any, decimal_pos: bool) -> None:
    rng = seeded(20261127 + decimal_pos)
    rows = _events(rng, 300, decimal_pos)
    (expected, their_checks), (java, our_checks) = _both(spark, rows, decimal_pos, None)
    assert java == expected
    assert our_checks == their_checks
    assert their_checks[0] is not None and their_checks[1]  # the checks had work
    assert len(expected) > 200  # the updates of keys without a tie
    assert any("nan" in u for u in expected)
    # -0.0 was written (`_value`), and Java made it 0.0 (as Spark's aggregate does)
    assert any("0.0" in u for u in java) and not any("-0.0" in u for u in java)


def test_java_conversion_with_the_table_rows(spark: Any) -> None:
    rng = seeded(20261128)
    rows = [r for r in _events(rng, 240, False) if r[10] is None]  # no problem, some ties
    state = [(k // 3, [0.0, -0.0, 7.5][k % 3], *[_value(rng, n) for n in NAMES[2:]])
             for k in range(0, 240, 2)]
    (expected, their_checks), (java, our_checks) = _both(spark, rows, False, state)
    assert java == expected
    assert our_checks == their_checks and their_checks[0] is None


def test_no_java_conversion_for_positions_it_does_not_compare(spark: Any) -> None:
    from changelake.spark.changefeed.dispatch import Unsupported

    events = spark.createDataFrame([], _schema(False).replace("array<bigint>", "array<string>"))
    with pytest.raises(Unsupported, match="positions of type array<string>"):
        java_convert(events, COLUMNS, ["id", "tag"], None)


def test_uint64s_flipped_on_the_driver_and_in_spark_agree(spark: Any) -> None:
    """A Uint64 flipped on the driver (`flipped`: a barrier's, `barriers.marked_below`), by
    `java_ready`'s expression, and a non-negative long by `flipped_long` (a line's place,
    `ydb.untimed_positions`) are one long, in the Uint64s' order; `uint64_positions` gives the
    Uint64s back. A value outside a Uint64 is refused on the driver."""
    from pyspark.sql import functions as F

    from changelake.spark.changefeed.keyed import flipped, flipped_long, uint64_positions

    values = [0, 1, 2**62, 2**63 - 1, 2**63, 2**63 + 5, 2**64 - 1]
    frame = spark.createDataFrame([([Decimal(v), Decimal(v)], v if v < 2**63 else None)
                                   for v in values], "pos array<decimal(20,0)>, v bigint")
    ready = java_ready(frame.withColumn("k0", F.lit(1)), 1)
    assert ready.schema["pos"].dataType.simpleString() == "array<bigint>"
    got = ready.select("pos", flipped_long(F.col("v")).alias("f")).collect()
    longs = [r["pos"][0] for r in got]
    assert longs == [flipped(v) for v in values] == sorted(longs)
    assert [r["f"] for r in got if r["f"] is not None] == longs[:4]
    back = uint64_positions(ready).select("pos").collect()
    assert [r["pos"] for r in back] == [[Decimal(v), Decimal(v)] for v in values]
    for outside in (-1, 2**64):
        with pytest.raises(ValueError, match="not a Uint64"):
            flipped(outside)
