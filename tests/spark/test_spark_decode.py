"""The Spark decode against the reference Reader: same history, same frontier, same errors."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.errors import ProtocolError
from changelake.protocol import Antichain, Progress, Updates, collect
from changelake.spark.decoder import decode, resolve_progress
from changelake.values import freeze
from tests.support.spark_helpers import canonical, frames, histories, mangle, rows_of, write

pytestmark = pytest.mark.spark


def R(k: int, v: int | None = None) -> object:
    return freeze({"k": k, "v": v})


# 12 mangled histories in the default run (each several Spark jobs: about 2 s); the slow tier
# asks for more (CHANGELAKE_SPARK_DECODE_EXAMPLES, set by .ci/slow).
@settings(
    max_examples=int(os.environ.get("CHANGELAKE_SPARK_DECODE_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    history=histories(),
    sizes=st.tuples(st.integers(1, 3), st.integers(1, 5)),
    seed=st.integers(0, 2**16),
    keep=st.sampled_from([1.0, 1.0, 0.9, 0.6, 0.3]),
    since=st.one_of(st.none(), st.integers(0, 7)),
)
def test_spark_decode_equals_reader_on_mangled_logs(
    spark, history, sizes, seed, keep, since
) -> None:
    changes, finishes, close = history
    # Two writers over the same history, batching updates and progress differently.
    first = write(changes, finishes, close, sizes[0])
    second = write(changes, finishes[::2], close, sizes[1])
    log = mangle(first, second, seed, keep)
    start = Antichain([since]) if since is not None else None

    expected = collect(log, start)
    updates, progress = frames(spark, log)
    got = decode(updates, progress, since=start)
    try:
        assert got.frontier == expected.frontier
        assert canonical(rows_of(got.updates)) == canonical(expected.updates)
        assert got.rejected.count() == 0
    finally:
        got.unpersist()


def test_complete_log_recovers_history_and_closes(spark) -> None:
    log = [
        Updates([(R(1), 5, 1), (R(1), 4, 1)]),
        Updates([(R(1), 5, 1), (R(2), 5, -1)]),  # a duplicate and one more at time 5
        Progress.make([3], [10], [(4, 1), (5, 2)]),
        Progress.make([0], [3]),
        Progress.make([10], []),
        Updates([(R(1), 4, 1)]),
    ]
    got = decode(*frames(spark, log))
    assert got.frontier == Antichain()
    assert canonical(rows_of(got.updates)) == canonical(
        [(R(1), 4, 1), (R(1), 5, 1), (R(2), 5, -1)]
    )


def test_missing_update_holds_frontier_at_its_time(spark) -> None:
    log = [
        Progress.make([0], [10], [(4, 1), (5, 2)]),
        Updates([(R(1), 4, 1), (R(1), 5, 1)]),  # one of time 5's two updates is missing
    ]
    got = decode(*frames(spark, log))
    assert got.frontier == Antichain([5]) == collect(log).frontier
    assert got.progress_frontier == Antichain([10])
    assert canonical(rows_of(got.updates)) == canonical([(R(1), 4, 1)])


def test_gap_in_statements_holds_frontier_at_the_gap(spark) -> None:
    log = [
        Progress.make([0], [3]),
        Progress.make([5], [9], [(6, 1)]),  # [3, 5) never covered: cannot be grafted
        Updates([(R(1), 6, 1), (R(1), 4, 1)]),
    ]
    got = decode(*frames(spark, log))
    assert got.frontier == Antichain([3]) == collect(log).frontier
    assert rows_of(got.updates) == []


def test_resume_since_skips_earlier_times(spark) -> None:
    log = [
        Progress.make([0], [4], [(1, 1), (3, 1)]),
        Progress.make([4], [8], [(5, 1)]),
        Updates([(R(1), 1, 1), (R(2), 3, 1), (R(3), 5, -1)]),
    ]
    start = Antichain([3])
    expected = canonical([(R(2), 3, 1), (R(3), 5, -1)])
    for since in (start, 3, [3]):  # plain values as well as an Antichain
        with decode(*frames(spark, log), since=since) as got:
            assert got.frontier == Antichain([8]) == collect(log, start).frontier
            assert canonical(rows_of(got.updates)) == expected
            assert got._cached is not None and got._cached.is_cached
        assert not got._cached.is_cached  # the context released the cache


def test_decode_reads_its_cache_and_leaves_the_callers_cached(spark) -> None:
    # The queries are SQL over temporary views, and dropping a view uncaches its DataFrame:
    # neither the caller's cached input nor the decode's own aggregate may be dropped so.
    log = [Updates([(R(1), 1, 1), (R(2), 1, 1)]), Progress.make([0], [5], [(1, 2)])]
    before = spark.conf.get("spark.sql.adaptive.enabled")
    for adaptive in ("true", "false"):
        spark.conf.set("spark.sql.adaptive.enabled", adaptive)
        try:
            updates, progress = frames(spark, log)
            updates = updates.persist()
            with decode(updates, progress) as got:
                assert got._cached is not None and got._cached.storageLevel.useMemory
                assert "InMemoryRelation" in (
                    got.updates._jdf.queryExecution().optimizedPlan().toString()
                ), "the result is computed again instead of read from the cache"
                assert got.rejected.count() == 0
                assert got._cached.storageLevel.useMemory
            assert updates.storageLevel.useMemory
            updates.unpersist()
        finally:
            spark.conf.set("spark.sql.adaptive.enabled", before)


def test_the_counts_are_taken_by_the_job_that_builds_the_cache(spark) -> None:
    # Under adaptive execution, the aggregate's map side is a job, and one more job builds the
    # cache and counts per time; without it, one job does all. The session is left as it was.
    from changelake.spark.decoder import decode_statements

    log = [Updates([(R(1), 1, 1), (R(2), 1, 1), (R(1), 1, 1)]), Progress.make([0], [5], [(1, 2)])]
    statements = [m for m in log if isinstance(m, Progress)]
    updates, _ = frames(spark, log)
    updates.count()  # the input's own jobs (reading it) are not the decode's
    key = "spark.sql.adaptive.enabled"
    before = (spark.conf.get(key), spark.conf.get("spark.sql.shuffle.partitions"))
    context = spark.sparkContext
    try:
        for adaptive, jobs in (("true", 2), ("false", 1)):
            spark.conf.set(key, adaptive)
            group = f"decode-jobs-{adaptive}"
            context.setJobGroup(group, group)
            try:
                got = decode_statements(updates, statements)
            finally:
                context.setLocalProperty("spark.jobGroup.id", None)
            with got:
                assert len(context.statusTracker().getJobIdsForGroup(group)) == jobs
                assert got.frontier == Antichain([5]) == collect(log).frontier
                assert canonical(rows_of(got.updates)) == canonical(collect(log).updates)
            assert (spark.conf.get(key), spark.conf.get("spark.sql.shuffle.partitions")) \
                == (adaptive, before[1])
    finally:
        spark.conf.set(key, before[0])


def test_an_input_of_known_size_is_decoded_in_one_job(spark, tmp_path) -> None:
    # Files have a size Spark estimates: the partitions are fixed from it (one a core here,
    # the input being small, within the session's), and one job aggregates, builds the cache
    # and counts per time.
    from changelake.spark.decoder import decode_statements

    log = [Updates([(R(1), 1, 1), (R(2), 1, 1), (R(1), 1, 1), (R(3), 7, -1)]),
           Progress.make([0], [5], [(1, 2)])]
    updates, _ = frames(spark, log)
    updates.write.parquet(str(tmp_path / "updates"))
    updates = spark.read.parquet(str(tmp_path / "updates"))
    statements = [m for m in log if isinstance(m, Progress)]
    context = spark.sparkContext
    configured = int(spark.conf.get("spark.sql.shuffle.partitions"))
    expected = min(configured, context.defaultParallelism)
    context.setJobGroup("decode-known-size", "decode-known-size")
    try:
        got = decode_statements(updates, statements)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    with got:
        assert len(context.statusTracker().getJobIdsForGroup("decode-known-size")) == 1
        plan = got._cached._jdf.queryExecution().executedPlan().toString()
        assert "AdaptiveSparkPlan" not in plan.split("InMemoryRelation", 1)[1], plan
        assert "hashpartitioning(_dnull#" in plan and f", {expected}), REPARTITION" in plan, plan
        assert got.frontier == Antichain([5]) == collect(log).frontier
        assert canonical(rows_of(got.updates)) == canonical(collect(log).updates)
        assert canonical(rows_of(got.pending)) == canonical([(R(3), 7, -1)])
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"


def test_the_aggregate_gets_a_partition_a_core_for_small_input_and_two_for_larger(spark):
    # A range's size is estimated without reading it (8 bytes a row): up to
    # ONE_WAVE_BYTES_PER_CORE a core gets one partition (one wave of tasks), beyond it two at
    # least, and a partition per INPUT_BYTES_PER_PARTITION beyond that, within the session's.
    from changelake.spark.decoder import (
        INPUT_BYTES_PER_PARTITION,
        ONE_WAVE_BYTES_PER_CORE,
        _partitions_for,
    )

    cores = spark.sparkContext.defaultParallelism
    configured = int(spark.conf.get("spark.sql.shuffle.partitions"))
    small = ONE_WAVE_BYTES_PER_CORE * cores // 8
    assert _partitions_for(spark.range(small)) == min(configured, cores)
    assert _partitions_for(spark.range(small + 1)) == min(configured, 2 * cores)
    many = 3 * configured * INPUT_BYTES_PER_PARTITION // 8
    assert _partitions_for(spark.range(many)) == configured
    assert _partitions_for(spark.createDataFrame([(1,)], "x long")) is None  # no estimate


def test_the_updates_are_shuffled_once_and_whole(spark) -> None:
    # One exchange by (data, time), no partial aggregate before it, and only the three columns
    # the aggregate reads go through it (not the input's location columns). (Spark 4.2 plans
    # a partial aggregate after the exchange, in the same stage as the final one; 4.3 none.)
    log = [Updates([(R(1), 1, 1), (R(2), 1, 1), (R(1), 1, 1)]), Progress.make([0], [5], [(1, 2)])]
    updates, progress = frames(spark, log)
    updates = updates.selectExpr("*", "'f.jsonl' AS _file", "7L AS _line")
    with decode(updates, progress) as got:
        got.updates.count()  # the cached plan, final: its initial plan is printed after it
        plan = got._cached._jdf.queryExecution().executedPlan().toString()
        plan = plan.split("== Initial Plan ==")[0]
        assert plan.count("Exchange hashpartitioning(") == 1, plan
        assert "partial_" not in plan.split("Exchange", 1)[1], plan
        assert "_file" not in plan.split("Exchange", 1)[1], plan
        assert canonical(rows_of(got.updates)) == canonical(collect(log).updates)


def test_split_messages_leaves_a_cached_messages_frame_cached(spark) -> None:
    from changelake.spark.decoder import split_messages

    messages = spark.createDataFrame(
        [([{"data": "a", "time": 1, "diff": 1}], None)],
        "updates array<struct<data:string,time:bigint,diff:bigint>>, "
        "progress struct<lower:array<bigint>,upper:array<bigint>,"
        "counts:array<struct<time:bigint,count:bigint>>>",
    ).persist()
    updates, progress = split_messages(messages)
    assert [tuple(r) for r in updates.collect()] == [("a", 1, 1, 0)]
    assert progress.count() == 0
    assert messages.storageLevel.useMemory
    messages.unpersist()


@pytest.mark.parametrize("log", [
    [Updates([(R(1), 1, 1)]), Updates([(R(1), 1, -1)]), Progress.make([0], [5])],
    # A statement refused while the aggregate is already registered for caching (it is
    # planned while the statements are collected): it is released too.
    [Updates([(R(1), 1, 1)]), Progress.make([5], [2])],
], ids=["conflicting-diff", "inverted-interval"])
def test_a_failing_decode_leaves_nothing_cached(spark, log) -> None:
    spark.catalog.clearCache()
    cache_manager = spark._jsparkSession.sharedState().cacheManager()
    before = len(spark.sparkContext._jsc.getPersistentRDDs())
    with pytest.raises(ProtocolError):
        decode(*frames(spark, log))
    assert len(spark.sparkContext._jsc.getPersistentRDDs()) == before
    assert cache_manager.isEmpty()


def test_a_statements_job_that_fails_fails_the_decode(spark) -> None:
    """The statements are collected in a thread of their own: its error is the decode's."""
    from pyspark.errors import PythonException
    from pyspark.sql import functions as F

    def fail(value):  # a closure (pickled whole, not by module name), without type hints
        # (PySpark reads them to choose between a plain and a pandas UDF, and warns)
        raise RuntimeError("no statements today")

    updates, progress = frames(spark, [Updates([(R(1), 1, 1)]), Progress.make([0], [5])])
    spark.catalog.clearCache()
    broken = progress.withColumn("lower", F.udf(fail, "array<bigint>")("lower"))
    with pytest.raises(PythonException, match="no statements today"):
        decode(updates, broken)
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()


def _reader_rule(log) -> str:
    with pytest.raises(ProtocolError) as caught:
        collect(log)
    return caught.value.rule


@pytest.mark.parametrize(
    ("rule", "log"),
    [
        (
            "zero-diff",
            [Updates([(R(1), 1, 0)]), Progress.make([0], [5], [(1, 1)])],
        ),
        (
            "conflicting-diff",
            [Updates([(R(1), 1, 1)]), Updates([(R(1), 1, -1)]), Progress.make([0], [5])],
        ),
        (
            "excess-updates",
            [Updates([(R(1), 1, 1), (R(2), 1, 1)]), Progress.make([0], [5], [(1, 1)])],
        ),
        (
            "excess-updates",  # a covered time that its statement says has no updates
            [Updates([(R(2), 3, 1)]), Progress.make([0], [5])],
        ),
        ("count-outside", [Progress.make([0], [5], [(7, 1)])]),
        ("inverted-interval", [Progress.make([5], [2])]),
        ("negative-count", [Progress.make([0], [5], [(1, -1)])]),
        ("duplicate-count", [Progress.make([0], [5], [(1, 1), (1, 1)])]),
    ],
)
def test_strict_mode_raises_the_readers_rule(spark, rule, log) -> None:
    assert _reader_rule(log) == rule
    with pytest.raises(ProtocolError) as caught:
        decode(*frames(spark, log))
    assert caught.value.rule == rule


def test_violation_arriving_after_its_time_finished_is_still_caught(spark) -> None:
    # The Reader discards updates at finished times unseen, so it misses this; a DataFrame is
    # a set, so decoding here does not (documented in changelake.spark.decoder).
    log = [Progress.make([0], [5]), Updates([(R(2), 3, 1)])]
    assert collect(log).frontier == Antichain([5])
    with pytest.raises(ProtocolError) as caught:
        decode(*frames(spark, log))
    assert caught.value.rule == "excess-updates"


def test_excess_at_uncovered_time_is_not_yet_an_error(spark) -> None:
    # Like the Reader: counts beyond the progress frontier may still be announced later.
    log = [Progress.make([0], [2]), Updates([(R(1), 3, 1), (R(2), 3, 1)])]
    got = decode(*frames(spark, log))
    assert got.frontier == Antichain([2]) == collect(log).frontier


def test_lenient_sets_offending_rows_aside_and_holds_frontier(spark) -> None:
    log = [
        Progress.make([0], [10], [(1, 1), (2, 1), (3, 1), (4, 1)]),
        Progress.make([10], [5]),  # inverted: set aside
        Updates([(R(1), 1, 1), (R(9), 1, 0)]),  # a good update and a zero diff
        Updates([(R(2), 2, 1), (R(3), 3, 1), (R(4), 3, 1), (R(5), 4, 1)]),
        Updates([(R(2), 2, -1)]),  # conflicts with (R(2), 2, 1)
    ]
    got = decode(*frames(spark, log), strict=False)
    try:
        # Time 1 is complete; time 2 cannot finish (its only update is in conflict).
        assert got.frontier == Antichain([2])
        assert canonical(rows_of(got.updates)) == canonical([(R(1), 1, 1)])
        rejected = {
            (r["rule"], r["time"], r["diff"], r["data"]["k"] if r["data"] else None)
            for r in got.rejected.collect()
        }
        assert rejected == {
            ("inverted-interval", None, None, None),
            ("zero-diff", 1, 0, 9),
            ("conflicting-diff", 2, 1, 2),
            ("conflicting-diff", 2, -1, 2),
            ("excess-updates", 3, 1, 3),
            ("excess-updates", 3, 1, 4),
        }
    finally:
        got.unpersist()


def test_resolve_progress_reports_coverage_and_expected_counts() -> None:
    resolved = resolve_progress(
        [Progress.make([4], [9], [(6, 2)]), Progress.make([0], [4], [(1, 3)])]
    )
    assert resolved.progress_frontier == Antichain([9])
    assert resolved.expected == {1: 3, 6: 2}


def test_error_names_the_input_location_when_the_input_carries_it(spark) -> None:
    from pyspark.sql import functions as F

    log = [Updates([(R(1), 1, 1), (R(1), 1, 2)]), Progress.make([0], [5], [(1, 1)])]
    updates, progress = frames(spark, log)
    updates = updates.withColumn("_file", F.lit("feed.jsonl")).withColumn(
        "_line", F.when(F.col("diff") == 2, 7).otherwise(3)
    )
    with pytest.raises(ProtocolError) as caught:
        decode(updates, progress)
    assert caught.value.rule == "conflicting-diff"
    assert caught.value.location is not None
    assert (caught.value.location.file, caught.value.location.line) == ("feed.jsonl", 7)


def test_rejected_has_its_schema_when_empty_and_when_not(spark) -> None:
    from changelake.spark.decoder import rejected_schema

    log = [Updates([(R(1), 1, 1)]), Progress.make([0], [5], [(1, 1)])]
    updates, progress = frames(spark, log)
    expected = rejected_schema(updates.schema["data"].dataType)
    with decode(updates, progress) as strict:
        assert strict.rejected.schema == expected
        assert strict.rejected.count() == 0
    bad = [*log, Progress.make([9], [2])]  # inverted: set aside in lenient mode
    with decode(*frames(spark, bad), strict=False) as lenient:
        assert lenient.rejected.schema == expected
        assert [r["rule"] for r in lenient.rejected.collect()] == ["inverted-interval"]


def test_same_result_without_adaptive_execution(spark) -> None:
    # Without adaptive execution the counts are taken through an exchange, not in one task.
    log = [
        Progress.make([0], [10], [(4, 1), (5, 2)]),
        Updates([(R(1), 4, 1), (R(1), 5, 1), (R(2), 5, -1), (R(1), 5, 1)]),
    ]
    key = "spark.sql.adaptive.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        with decode(*frames(spark, log)) as got:
            assert got.frontier == Antichain([10]) == collect(log).frontier
            assert canonical(rows_of(got.updates)) == canonical(collect(log).updates)
    finally:
        spark.conf.set(key, before)


_KEY_SCHEMAS = {
    # data may be null, and so may its fields: its fields are grouped one by one, with a
    # flag for a null `data` (a null struct and a struct of nulls are two rows)
    "nullable": "data struct<k: bigint, v: double, m: map<string, bigint>>",
    # data cannot be null: its fields alone
    "not null": "data struct<k: bigint NOT NULL, v: double, m: map<string, bigint>> NOT NULL",
    # a field that cannot be null in a struct that can: grouped whole (the struct made again
    # from its fields would let the field be null; so would a map in it, grouped whole)
    "whole": "data struct<k: bigint NOT NULL, v: double>",
}


@pytest.mark.parametrize("shape", sorted(_KEY_SCHEMAS))
def test_the_result_has_the_inputs_data_type_and_its_groups(spark, shape) -> None:
    # However `data` is grouped (its fields as keys of their own, or whole), the result has
    # the input's type exactly, and the groups are Spark's grouping of the whole struct:
    # NaN one value, -0.0 the same as 0.0, a map's null value kept, a null `data` apart
    # from a struct of nulls. The expected result is the one grouped whole (a field with
    # metadata is grouped whole: `decoder._data_keys`).
    from pyspark.sql.types import StructField, StructType

    from changelake.spark.decoder import _data_keys

    schema = spark.createDataFrame([], f"{_KEY_SCHEMAS[shape]}, time bigint, diff bigint").schema
    nan, m = float("nan"), {"y": None}
    rows = [({"k": 1, "v": nan, "m": m}, 1, 1), ({"k": 1, "v": nan, "m": m}, 1, 1),
            ({"k": 1, "v": 0.0, "m": None}, 1, 1), ({"k": 1, "v": -0.0, "m": None}, 1, 1),
            ({"k": 2, "v": None, "m": {"a": 1, "b": None}}, 2, -1),
            ({"k": 2, "v": None, "m": {"b": None, "a": 1}}, 2, -1)]
    if schema["data"].dataType["k"].nullable:
        rows += [({"k": None, "v": None, "m": None}, 2, 1)] * 2
    if schema["data"].nullable:
        rows += [(None, 2, 1)] * 2
    updates = spark.createDataFrame(rows, schema)
    kind = schema["data"].dataType
    marked = StructType([StructField(f.name, f.dataType, f.nullable, {"c": 1} if i == 0 else {})
                         for i, f in enumerate(kind.fields)])
    whole = spark.createDataFrame(
        rows, StructType([StructField("data", marked, schema["data"].nullable),
                          *schema.fields[1:]]))
    assert _data_keys(whole.schema["data"]).data is None
    assert (_data_keys(schema["data"]).data is None) == (shape == "whole")
    progress = frames(spark, [Progress.make([0], [])])[1]  # every time covered, none counted
    with decode(updates, progress, strict=False) as got, \
            decode(whole, progress, strict=False) as expected:
        assert got.updates.schema["data"] == schema["data"]
        assert got.frontier == expected.frontier
        assert sorted(map(repr, got.rejected.drop("reason").collect())) == \
            sorted(map(repr, expected.rejected.drop("reason").collect()))
        excess = got.rejected.where("rule = 'excess-updates'")
        assert excess.count() == 3 + kind["k"].nullable + schema["data"].nullable
