"""Helpers shared by the Spark tests: histories, mangled logs, and DataFrames of messages."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from changelake.protocol import Message, Progress, Updates, Writer
from changelake.values import freeze, thaw
from tests.support.seeding import seeded

# Spark's Python workers run the `materialize-cdc` data source, so they must be this interpreter
# (which has changelake installed), not whatever `python3` is on the PATH. Set before the
# session fixture first starts Spark (collection imports this module before any test runs).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

DATA_DDL = "struct<k:bigint,v:bigint>"
UPDATES_DDL = f"data {DATA_DDL}, time bigint, diff bigint"
PROGRESS_DDL = (
    "lower array<bigint>, upper array<bigint>, counts array<struct<time:bigint,count:bigint>>"
)

Change = tuple[dict[str, Any], int, int]
FIELDS = ("k", "v")  # one field order, as a schema would impose


def frames(spark: Any, messages: Sequence[Message]) -> tuple[Any, Any]:
    """The updates and progress DataFrames of a message sequence, in its order."""
    update_rows = [
        (thaw(data), time, diff)
        for m in messages
        if isinstance(m, Updates)
        for data, time, diff in m.updates
    ]
    progress_rows = [
        (
            list(m.lower.elements),
            list(m.upper.elements),
            [{"time": t, "count": c} for t, c in m.counts],
        )
        for m in messages
        if isinstance(m, Progress)
    ]
    return (
        spark.createDataFrame(update_rows, UPDATES_DDL),
        spark.createDataFrame(progress_rows, PROGRESS_DDL),
    )


def canonical(updates: Sequence[tuple[Any, int, int]]) -> list[tuple[int, str, int]]:
    """A comparable form of a history: order within a time is not part of the contract."""
    out = []
    for data, time, diff in updates:
        plain = data.asDict(recursive=True) if hasattr(data, "asDict") else thaw(data)
        out.append((time, json.dumps(plain, sort_keys=True), diff))
    return sorted(out)


def rows_of(df: Any) -> list[tuple[Any, int, int]]:
    return [(r["data"], r["time"], r["diff"]) for r in df.collect()]


@st.composite
def histories(draw: st.DrawFn, max_time: int = 6) -> tuple[list[Change], list[int], bool]:
    """Changes (not consolidated), the times to finish through, and whether to close."""
    change = st.tuples(
        st.fixed_dictionaries(
            {"k": st.integers(0, 3), "v": st.one_of(st.none(), st.integers(0, 2))}
        ),
        st.integers(0, max_time),
        st.sampled_from([-2, -1, 1, 1, 2]),
    )
    changes = draw(st.lists(change, max_size=25))
    finishes = sorted(draw(st.sets(st.integers(0, max_time), max_size=4)))
    close = draw(st.booleans())
    return changes, finishes, close


def write(changes: Sequence[Change], finishes: Sequence[int], close: bool,
          batch_size: int) -> list[Message]:
    """What a Writer emits for a history: changes pushed as their times come up."""
    writer = Writer(batch_size=batch_size)
    pending = sorted(changes, key=lambda c: c[1])
    out: list[Message] = []
    for t in finishes:
        while pending and pending[0][1] <= t:
            data, time, diff = pending.pop(0)
            writer.push(freeze(data, FIELDS), time, diff)
        out.extend(writer.finish_through(t))
    if close:
        for data, time, diff in pending:
            writer.push(freeze(data, FIELDS), time, diff)
        out.extend(writer.close())
    return out


def mangle(first: Sequence[Message], second: Sequence[Message], seed: int,
           keep: float) -> list[Message]:
    """Two writers' outputs mixed, duplicated, reordered and truncated, as a log may deliver."""
    rng = seeded(seed)
    log = [m for m in [*first, *second] for _ in range(rng.randint(1, 2))]
    rng.shuffle(log)
    return log[: round(len(log) * keep)]
