"""The Spark encode against the reference Writer, and through the Spark decode back."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from changelake.errors import ProtocolError
from changelake.protocol import Antichain, Progress, Updates, Writer, consolidate
from changelake.spark.decoder import decode, split_messages
from changelake.spark.encoder import encode, to_messages
from changelake.values import freeze
from tests.support.spark_helpers import FIELDS, UPDATES_DDL, canonical, rows_of

pytestmark = pytest.mark.spark

change = st.tuples(
    st.fixed_dictionaries({"k": st.integers(0, 3), "v": st.one_of(st.none(), st.integers(0, 2))}),
    st.integers(2, 9),
    st.sampled_from([-2, -1, 1, 1, 2]),
)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    changes=st.lists(change, max_size=30),
    finished=st.one_of(st.none(), st.integers(2, 9)),
    batch_size=st.integers(1, 4),
)
def test_encode_emits_what_the_writer_emits(spark, changes, finished, batch_size) -> None:
    since = 2
    writer = Writer(batch_size=batch_size, since=Antichain([since]))
    for data, time, diff in changes:
        writer.push(freeze(data, FIELDS), time, diff)
    expected = writer.close() if finished is None else writer.finish_through(finished)

    df = spark.createDataFrame([(d, t, r) for d, t, r in changes], UPDATES_DDL)
    messages = list(to_messages(encode(df, finished, since=since, batch_size=batch_size)
                                .collect(), FIELDS))

    def updates_of(ms):
        return canonical([u for m in ms if isinstance(m, Updates) for u in m.updates])

    assert updates_of(messages) == updates_of(expected)
    assert all(0 < len(m.updates) <= batch_size for m in messages if isinstance(m, Updates))
    assert [m for m in messages if isinstance(m, Progress)] == [
        m for m in expected if isinstance(m, Progress)
    ]


def test_encode_then_decode_recovers_the_consolidated_history(spark) -> None:
    changes = [
        ({"k": 1, "v": 1}, 0, 1), ({"k": 1, "v": 1}, 0, 1), ({"k": 2, "v": None}, 0, 1),
        ({"k": 2, "v": None}, 1, -1), ({"k": 2, "v": 5}, 1, 1),
        ({"k": 3, "v": 0}, 2, 1), ({"k": 3, "v": 0}, 2, -1),  # cancels: no update at all
        ({"k": 1, "v": 1}, 7, -2),  # after the finished interval: not encoded yet
    ]
    df = spark.createDataFrame(changes, UPDATES_DDL)
    first = encode(df, 3, batch_size=2)
    second = encode(df.where("time >= 4"), None, since=4, batch_size=2)
    got = decode(*split_messages(first.unionByName(second)))
    try:
        assert got.frontier == Antichain()
        history = consolidate((freeze(d, FIELDS), t, r) for d, t, r in changes)
        assert canonical(rows_of(got.updates)) == canonical(history)
    finally:
        got.unpersist()
    # The first interval alone justifies exactly [0, 4).
    partial = decode(*split_messages(first))
    assert partial.frontier == Antichain([4])
    partial.unpersist()


def test_late_change_fails_the_job(spark) -> None:
    df = spark.createDataFrame([({"k": 1, "v": 1}, 1, 1)], UPDATES_DDL)
    with pytest.raises((PySparkException, Py4JJavaError), match="late-change"):
        encode(df, 5, since=3).collect()


def test_finishing_before_since_is_an_error(spark) -> None:
    df = spark.createDataFrame([], UPDATES_DDL)
    with pytest.raises(ProtocolError) as caught:
        encode(df, 1, since=5)
    assert caught.value.rule == "frontier-regressed"
    assert encode(df, 4, since=5).count() == 0  # nothing new to finish, like the Writer


def test_empty_interval_still_gets_its_statement(spark) -> None:
    df = spark.createDataFrame([], UPDATES_DDL)
    (row,) = encode(df, 9).collect()
    assert list(to_messages([row])) == [Progress.make([0], [10])]
