"""The Python path's Spark times (`spark.changefeed.python_path.changes_in_time`) against the Python
rules they restate, on generated feeds: `convert.base.spark_transaction_time` against
`DebeziumParser`'s transaction times, and `times.current_times` (in chunks of two lines to
many) against `WindowedConverter.time_of` (see their docstrings for the domain: one batch, no
frontier moved past the times pushed)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.convert.images import ImageConverter
from changelake.convert.progress import (
    PartitionFrontiers,
    barrier_violations,
    frontier_from,
    ydb_frontier,
)
from changelake.errors import ChangefeedError, Location
from changelake.formats.change import Change, Op, Resolved
from changelake.formats.debezium import DebeziumParser
from changelake.spark.changefeed import times
from changelake.spark.changefeed.python_path import changes_in_time

SOURCE = {"version": "1.4.0.Final", "connector": "postgresql", "name": "pg", "db": "db",
          "schema": "public", "table": "t"}

# One event of a PostgreSQL feed without `sequence` (Debezium < 1.5): a snapshot row (no
# time), a row event of one of four transactions (its time: its transaction's first lsn), or
# a logical-decoding message (ignored by conversion); or a row event with `sequence` (its
# time: its own `sequence[0]`, which the events of its transaction need not share); lsn and
# file drawn.
EVENTS = st.lists(
    st.tuples(st.sampled_from(["snapshot", "event", "event", "message", "sequenced"]),
              st.integers(1, 4), st.integers(1, 1_000), st.integers(0, 1)),
    min_size=1, max_size=30)


def _line(n: int, kind: str, tx: int, lsn: int) -> bytes:
    source = {**SOURCE, "lsn": lsn, "txId": tx, "snapshot": "true" if kind == "snapshot"
              else "false"}
    if kind == "sequenced":
        source["sequence"] = f'["{lsn // 2}","{lsn}"]'
    payload: dict[str, Any] = {"op": "r" if kind == "snapshot" else "c", "before": None,
                               "after": {"id": n}, "source": source, "ts_ms": 1}
    if kind == "message":
        payload = {"op": "m", "source": source, "ts_ms": 1,
                   "message": {"prefix": "p", "content": "x"}}
    return orjson.dumps(payload)


def _files(events: list[tuple[str, int, int, int]]) -> dict[str, list[bytes]]:
    files: dict[str, list[bytes]] = {"a.jsonl": [], "b.jsonl": []}
    for n, (kind, tx, lsn, f) in enumerate(events):
        files[sorted(files)[f]].append(_line(n, kind, tx, lsn))
    return files


def _python_times(files: dict[str, list[bytes]]) -> dict[tuple[str, int], int]:
    """What the encoder does: one parser over the files in order, each change's time
    `time_of` just before it is pushed."""
    parser = DebeziumParser()
    converter = ImageConverter()
    out = {}
    for name in sorted(files):
        for line, raw in enumerate(files[name], start=1):
            change = parser.parse_line(raw, Location(name, line))
            assert isinstance(change, Change)
            out[name, line] = converter.time_of(change)
            converter.push(change)
    assert converter.frontier == 0  # the domain: no frontier moved
    return out


def _spark_times(spark: Any, files: dict[str, list[bytes]]) -> dict[tuple[str, int], int]:
    """What `changefeed_changes` does: each line parsed on its own (a parser per partition; at
    worst one line each), then the windows."""
    rows = []
    for name in sorted(files):
        for line, raw in enumerate(files[name], start=1):
            change = DebeziumParser().parse_line(raw, Location(name, line))
            assert isinstance(change, Change)
            rows.append((name, line, change.transaction, change.time, change.op.value,
                         change.tx_timed))
    frame = spark.createDataFrame(rows, "file string, line long, tx string, time long, "
                                        "op string, tx_timed boolean")
    frame = changes_in_time(spark, frame, by_tx=any(r[5] for r in rows),
                            untimed=sum(1 for r in rows if r[3] is None))
    return {(r["file"], r["line"]): r["time"] for r in frame.collect()}


@pytest.mark.spark
@pytest.mark.parametrize(("bits", "broadcast"), [(1, 0), (16, 10**6)])
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=EVENTS)
def test_spark_times_are_the_encoders(spark: Any, monkeypatch: Any, bits: int, broadcast: int,
                                      events: list) -> None:
    """Chunks of two lines (a chunk's changes placed by the chunks before it) and of 2**16."""
    monkeypatch.setattr(times, "CHUNK_BITS", bits)
    monkeypatch.setattr(times, "BROADCAST_UNTIMED", broadcast)
    files = _files(events)
    assert _spark_times(spark, files) == _python_times(files)


def test_the_times_rule_sees_transactions_and_messages() -> None:
    """The generated feeds exercise what the rules are about: a later event of a transaction
    timed by an earlier one, and a message that does not move the current time."""
    files = {"a.jsonl": [_line(0, "event", 1, 50), _line(1, "message", 2, 90),
                         _line(2, "event", 1, 70), _line(3, "snapshot", 3, 10)],
             "b.jsonl": []}
    assert list(_python_times(files).values()) == [50, 90, 50, 50]
    # An event with `sequence` has its own time, whatever its transaction's others have.
    files["a.jsonl"].insert(1, _line(4, "sequenced", 1, 60))
    assert list(_python_times(files).values()) == [50, 30, 90, 50, 50]


# ------------------------------------------------------------------------------ barriers

# One YDB partition: barriers and records by step (positions (step, txId)), some records
# repeated (replays).
PARTITION = st.lists(st.tuples(st.sampled_from(["resolved", "record", "record"]),
                               st.integers(1, 20), st.booleans()), max_size=30)


@settings(max_examples=200, derandomize=True)
@given(items=PARTITION)
def test_barrier_violations_is_the_sequential_check(items: list) -> None:
    """What Spark runs per file, against `PartitionFrontiers.check` applied line by line as the
    encoder does (a replay, told apart by the caller, is not checked)."""
    rows = []
    for line, (kind, step, replay) in enumerate(items, start=1):
        item = Resolved((step, 0)) if kind == "resolved" else \
            Change(Op.UPSERT, None, None, {"id": 1}, position=(step, 1), time=step,
                   origin=Location("p", line))
        rows.append((line, item, replay))
    frontiers = PartitionFrontiers(1)
    expected = []
    for line, item, replay in rows:
        if isinstance(item, Resolved):
            frontiers.barrier(0, item)
            continue
        try:
            if not replay:
                frontiers.check(0, item)
        except ChangefeedError as error:
            expected.append((line, error.reason))
    assert barrier_violations(rows) == expected


def test_ydb_frontier_is_the_minimum_of_the_last_barriers() -> None:
    assert ydb_frontier([(5, 1), (3, 9)], 2) == 3
    assert ydb_frontier([(5, 1)], 2) == 0  # a partition without a barrier holds it at 0


def test_a_transaction_before_since_holds_no_frontier_back() -> None:
    """`frontier_from`'s `since`: a transaction re-sent without its first events (2 of 3) or
    without its END holds the frontier at its time, unless it is before the committed
    frontier; the transactions at and after `since` still count."""
    replayed = [(100, 2, 3), (120, 1, None), (200, 1, 1)]
    assert frontier_from(200, replayed) == 100
    assert frontier_from(200, replayed, since=150) == 201
    assert frontier_from(200, [*replayed, (160, 1, 2)], since=150) == 160
    assert frontier_from(200, [(None, 0, 4), (200, 1, 1)], since=150) == 201  # an END alone
