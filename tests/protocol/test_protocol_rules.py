"""The rules of `protocol.rules`: each Python function against the Reader, and each Spark
SQL twin against its Python function, on generated input (hypothesis, fixed seeds)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from changelake.errors import ProtocolError
from changelake.protocol import Antichain, Progress, Reader, Updates, rules
from changelake.values import freeze

ROW = freeze({"k": 1})
diff_lists = st.lists(st.sampled_from([-2, -1, 0, 1, 2]), min_size=1, max_size=6)


@seed(20261123)
@settings(max_examples=300, deadline=None)
@given(diffs=diff_lists, batched=st.booleans())
def test_python_rules_are_the_readers(diffs: list[int], batched: bool) -> None:
    """Deliveries of one (data, time): the Reader rejects them exactly when a rule says so,
    with a rule that holds; otherwise it hands out the settled diff."""
    summary = rules.summarize(diffs)
    broken = {"zero-diff"} if rules.is_zero_diff(summary) else set()
    if rules.is_conflicting(summary):
        broken.add("conflicting-diff")
    reader = Reader()
    messages = [Updates([(ROW, 5, d) for d in diffs])] if batched else [
        Updates([(ROW, 5, d)]) for d in diffs
    ]
    out = []
    try:
        for message in messages:
            reader.push(message)
        for updates, _ in reader.push(Progress.make([0], [], [(5, 1)])):
            out.extend(updates)
    except ProtocolError as error:
        assert error.rule in broken, (diffs, error.rule)
        return
    assert not broken, diffs
    assert out == [(ROW, 5, rules.settled_diff(summary))]


def test_time_rules_and_frontier_are_the_readers() -> None:
    expected = {3: 2, 4: 1}
    assert rules.is_unfinished(1, 2) and not rules.is_unfinished(2, 2)
    assert rules.is_excess(2, 1) and not rules.is_excess(1, 1)
    assert rules.frontier(Antichain([10]), expected, {3: 2, 4: 1}) == Antichain([10])
    assert rules.frontier(Antichain([10]), expected, {3: 1, 4: 1}) == Antichain([3])
    assert rules.frontier(Antichain(), expected, {3: 2, 4: 1, 7: 1}) == Antichain([7])
    # The Reader, fed the same: time 3 is missing one of its two updates.
    reader = Reader()
    reader.push(Updates([(freeze({"k": 1}), 3, 1), (freeze({"k": 1}), 4, 1)]))
    reader.push(Progress.make([0], [10], [(3, 2), (4, 1)]))
    assert reader.frontier == rules.frontier(Antichain([10]), expected, {3: 1, 4: 1})


@pytest.mark.spark
@seed(20261124)
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(groups=st.lists(diff_lists, min_size=1, max_size=12),
       bound=st.one_of(st.none(), st.integers(0, 6)))
def test_spark_sql_twins_are_the_python_rules(spark, groups: list[list[int]],
                                              bound: int | None) -> None:
    rows = [(g, g % 6, d) for g, diffs in enumerate(groups) for d in diffs]
    frame = spark.createDataFrame(rows, "g long, time long, diff long")
    frontier = Antichain() if bound is None else Antichain([bound])
    got = {
        r["g"]: r
        for r in spark.sql(
            f"SELECT g, lo, {rules.is_zero_diff_sql()} AS zero_diff, "
            f"{rules.is_conflicting_sql()} AS conflicting, {rules.is_settled_sql()} AS settled, "
            f"{rules.is_beyond_sql(frontier)} AS beyond "
            f"FROM (SELECT g, time, {rules.summarize_sql()} FROM {{frame}} GROUP BY g, time)",
            frame=frame,
        ).collect()
    }
    assert sorted(got) == list(range(len(groups)))
    for g, diffs in enumerate(groups):
        summary, row = rules.summarize(diffs), got[g]
        assert row["zero_diff"] == rules.is_zero_diff(summary), diffs
        assert row["conflicting"] == rules.is_conflicting(summary), diffs
        settled = rules.settled_diff(summary)
        assert row["settled"] == (settled is not None), diffs
        assert settled is None or row["lo"] == settled
        assert row["beyond"] == rules.is_beyond(frontier, g % 6)
