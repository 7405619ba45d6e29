"""Data-parallel CDCv2 decoding: the Reader's result, computed over DataFrames.

Why one module of over 500 lines: the Reader's result over DataFrames is one argument (progress
resolved on the driver by a real Reader, updates aggregated once on the executors, the two
joined), and the errors it names must be the Reader's; split, the argument would be read in
pieces.

The pure-Python `Reader` consumes messages one at a time. Here the whole (mangled) log is
already at hand as two DataFrames, so the same result is reached in a different order, without
restating a single protocol rule:

* Progress statements are few and small. They are collected to the driver and pushed into a
  real `protocol.Reader` (see `resolve_progress`), which validates them (`inverted-interval`,
  `count-outside`, `negative-count`, `duplicate-count`), grafts them, and yields the progress
  frontier and the count it expects at every covered time.
* Updates are many and never leave the executors. One shuffle aggregation by `(data, time)`
  deduplicates them and, in the same pass, notices zero diffs (`zero-diff`) and two different
  diffs for one `(data, time)` (`conflicting-diff`). These rules are column expressions, each
  written next to the pure-Python rule it mirrors in `protocol/rules.py` (tested pairwise).
  The rows are shuffled whole, with no partial aggregate before the shuffle: that only pays
  where copies of an update fall in one map task, and a log's copies mostly come later (a
  re-send after a restart, in another file), while a hash map of every distinct update a task
  reads is built for nothing. With each update's two copies anywhere, decode + count came
  nearer `dropDuplicates().count()`; with every update four times in one file it was the
  slower way until the partitions were fixed (`_partitions_for`), and is now as fast as
  before (benchmarks/README.md, "Spark decode", and "Figures moved out of docstrings").
* Per covered time, the number of distinct updates (a handful of rows, one per time) is
  compared on the driver with the expected count by the rules' Python functions: fewer means
  the time is unfinished and holds the frontier back, more is `excess-updates`. The frontier is
  the Reader's: the meet of the progress frontier and the unfinished covered times.

The aggregate is cached (by default) while the per-time counts are taken, so the result is
read from it without a second shuffle; adaptive execution may coalesce its partitions (see
`CACHED_PLAN_COALESCING`), and its columns are not compressed (`CACHE_COMPRESSION`). The counts
are taken by the job that builds the cache (`_plan_over_cache`).
`Decoded.unpersist()` releases it; nothing else is cached. Spark jobs, then: one collects the
statements (none with `decode_statements`, which takes them as they are), in a thread of its
own while the driver plans the aggregate, which depends on `since` alone (`_Collecting`), and
one aggregates,
builds the cache and takes the counts, its partitions fixed from the input's estimated size
(`_partitions_for`); where Spark has no estimate, adaptive execution decides them and runs
the aggregate's map side as a job of its own first. Actions on the result read the cache.

Each query is stated as Spark SQL text (`spark.sql`, `where`, `selectExpr`, and a `groupBy` of
expression texts for the per-time counts), the rules' `*_sql` twins spliced in, rather than
built from `Column` objects: every Column operation is a round trip from the Python driver to
the JVM, and a decode's fixed cost was mostly those. The counts, planned while the aggregate
is registered for caching, are no `spark.sql` query: dropping its temporary view would compare
the view's plan with every cached plan.

For a log that is consistent (every message true of one history) the result is exactly what
`protocol.collect` returns for the same messages in any order: the updates before the frontier
(and at or after `since`), and the frontier. The tests check this differentially.

Where the two differ, it is because a DataFrame is a set and a Reader sees a sequence:

* The Reader discards updates at times it has already finished without looking at them, so a
  conflicting or excess update that arrives *after* its time finished goes unnoticed there; here
  every update is seen, so such a log is rejected. Decoding here is never less strict.
* Lenient mode sets aside offending *rows*, not whole messages (a DataFrame has no message
  boundaries): rows with a zero diff; both diffs of a conflicting `(data, time)` (which one is
  right cannot be known, so neither is used and that time cannot finish); and every update at a
  time with more distinct updates than its count (which of them are extra cannot be known, so
  the frontier stops at that time). Rejected statements are exactly the Reader's rejections.
  The Reader instead keeps whichever diff or update came first, which depends on arrival order.

Only integer times exist on the wire (`time: long`), so frontiers here have at most one element.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from changelake.errors import InputError, Location, ProtocolError
from changelake.protocol import Antichain, Progress, Reader, Rejected, rules
from changelake.protocol.antichain import as_frontier
from changelake.spark.map_grouping import grouping_sql, restored_sql
from changelake.spark.settings import NOT_ADAPTIVE, UNKNOWN_SIZE, settings

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructField, StructType

PROGRESS_COLUMNS = ("lower", "upper", "counts")
LOCATION_COLUMNS = ("_file", "_line", "_offset", "_index")
"""Optional columns (as `materialize-cdc` provides them) used only to say where an error is."""


# --------------------------------------------------------------------------- driver side


@dataclass(frozen=True, slots=True)
class ProgressResolution:
    """What the progress statements alone establish (see `resolve_progress`)."""

    progress_frontier: Antichain
    """The statements grafted on cover exactly the times not beyond this."""
    expected: dict[int, int]
    """The number of distinct updates each covered time (at or after `since`) must have; a
    covered time not listed has none."""
    rejected: list[Rejected] = field(default_factory=list)
    """Statements set aside in lenient mode, with their errors (strict mode raises instead)."""


def resolve_progress(
    statements: Iterable[Progress], since: Antichain | None = None, *, strict: bool = True
) -> ProgressResolution:
    """Graft the statements with the reference `Reader`, fed no updates.

    With no updates pushed, the Reader's outstanding count at a covered time is exactly the
    count the statements expect there, and its progress frontier is what the statements cover:
    its saved state (a public, versioned format) says both. So validation and grafting, the
    subtle part of the protocol, are the Reader's own code and are never restated here.
    """
    reader = Reader(since, strict=strict)
    for statement in statements:
        reader.push(statement)
    state = reader.save()
    expected: dict[int, int] = {}
    for time, count in state["counts"]:
        if type(time) is not int:
            raise TypeError(f"only integer times are supported on Spark, got {time!r}")
        expected[time] = count
    return ProgressResolution(
        Antichain.from_json(state["progress"]), expected, list(reader.rejected)
    )


def _single(frontier: Antichain) -> int | None:
    """The one integer element of a frontier over integer times; None when closed."""
    if frontier.is_closed:
        return None
    (element,) = frontier.elements
    if type(element) is not int:
        raise TypeError(f"only integer times are supported on Spark, got {element!r}")
    return element


# ----------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class Decoded:
    """The result of `decode`. `updates`, `pending` and `rejected` are lazy DataFrames, and
    `pending` and `rejected` are made when first asked for: most callers read `updates`
    alone, and each frame is a plan Spark analyzes on the driver, a few hundredths of a
    second a decode.

    They are read from one cached aggregate of the input: release it with `unpersist()`, or
    use the result as a context manager (`with decode(...) as decoded:`). Nothing else is
    cached, and a `decode` that raises leaves nothing cached.
    """

    updates: DataFrame
    """Distinct `(data, time, diff)` at times in `[since, frontier)`."""
    frontier: Antichain
    """Every update at a time not beyond this is in `updates`."""
    progress_frontier: Antichain
    """What the progress statements cover (the frontier may be held back by missing updates)."""
    missing: dict[int, int]
    """Covered times still waiting for updates: how many distinct updates each lacks."""
    _pending: Callable[[], DataFrame]
    _rejected: Callable[[], DataFrame]
    _cached: DataFrame | None = None

    @functools.cached_property
    def pending(self) -> DataFrame:
        """The distinct updates at or beyond the frontier: all a resuming decoder needs to
        keep."""
        return self._pending()

    @functools.cached_property
    def rejected(self) -> DataFrame:
        """Lenient mode: offending input with `rule` and `reason`; empty in strict mode."""
        return self._rejected()

    def unpersist(self) -> None:
        """Drop the cached aggregate that `updates`, `pending` and `rejected` are read from
        (they stay usable, recomputed from the input). Idempotent."""
        if self._cached is not None:
            self._cached.unpersist()

    def __enter__(self) -> Decoded:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unpersist()


def rejected_schema(data_type: DataType) -> StructType:
    """Schema of `Decoded.rejected`: an update row or a statement row, with the rule broken."""
    from pyspark.sql.types import (
        ArrayType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    counts = ArrayType(
        StructType([StructField("time", LongType()), StructField("count", LongType())])
    )
    return StructType(
        [
            StructField("rule", StringType(), False),
            StructField("reason", StringType(), True),
            StructField("data", data_type, True),
            StructField("time", LongType(), True),
            StructField("diff", LongType(), True),
            StructField("lower", ArrayType(LongType()), True),
            StructField("upper", ArrayType(LongType()), True),
            StructField("counts", counts, True),
        ]
    )


MAX_STATEMENT_BYTES = 256 * 2**20
"""The most the progress statements that `collect_statements` keeps on the driver may take,
as `statement_bytes` counts them (CPython's sizes rounded up): about two million counts.
`decode` keeps none of them (`iter_statements` feeds them to the protocol's reader one by
one, which keeps a count a covered time); the streaming decoders keep a micro-batch's, and
a batch over this is refused in one line (a smaller batch is the way)."""


def statement_bytes(statement: Progress) -> int:
    """What a `Progress` takes on the driver, rounded up: the object and its two antichains
    (about 400 bytes), 40 a frontier element, 130 a (time, count) pair."""
    return 400 + 40 * (len(statement.lower.elements) + len(statement.upper.elements)) \
        + 130 * len(statement.counts)


def iter_statements(progress: DataFrame) -> Iterator[Progress]:
    """The progress statements of a DataFrame, in its order, as protocol values, one
    partition at a time on the driver (`toLocalIterator`), none kept here."""
    fields = [c for c in (*PROGRESS_COLUMNS, *LOCATION_COLUMNS) if c in progress.columns]
    # As they are when they are just those columns: a select is a plan analyzed once more.
    rows = progress if progress.columns == fields else progress.selectExpr(*fields)
    for row in _local_rows(rows):
        values = row.asDict()
        origin = None
        if "_file" in values:
            origin = Location(values["_file"], values.get("_line"), values.get("_offset"))
        yield Progress.make(
            values["lower"] or (),
            values["upper"] or (),
            ((c["time"], c["count"]) for c in values["counts"] or ()),
            origin,
        )


def _local_rows(frame: DataFrame) -> Iterator[Any]:
    """`frame.toLocalIterator()`, its job's failure raised as `collect` raises it (PySpark
    converts a `collect`'s Java exception, a PythonException say, but not the one a local
    iterator's socket server rethrows, two causes deep)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import UnknownException, convert_exception

    rows = frame.toLocalIterator()
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Py4JJavaError as error:
            cause = error.java_exception
            while cause is not None:
                converted = convert_exception(cause)
                if not isinstance(converted, UnknownException):
                    raise converted from None
                cause = cause.getCause()
            raise
        yield row


def collect_statements(progress: DataFrame, kept: Sequence[Progress] = ()) -> list[Progress]:
    """The progress statements of a DataFrame, in its order, as protocol values, within
    `MAX_STATEMENT_BYTES` on the driver with those `kept` from earlier batches (the streaming
    decoders keep the statements beyond their frontier: a frontier that never advances would
    keep them all): one beyond it is an `InputError` at its location, raised before the rest
    are read."""
    out: list[Progress] = []
    held = sum(map(statement_bytes, kept))
    for statement in iter_statements(progress):
        held += statement_bytes(statement)
        if held > MAX_STATEMENT_BYTES:
            raise InputError(
                f"the progress statements of one batch take more than "
                f"{MAX_STATEMENT_BYTES >> 20} MiB on the driver ({len(out) + 1} statements, "
                f"{held} bytes by this one): refused (rule: a batch's progress statements are "
                "held within a bound; make the batch smaller, say maxFilesPerTrigger)",
                statement.origin)
        out.append(statement)
    return out


CACHED_PLAN_COALESCING = "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning"
"""Spark caches a plan with adaptive execution off unless this is true, so a cached aggregate
keeps every one of `spark.sql.shuffle.partitions` (200 by default) partitions: most of them
tiny, each a task in every job that reads it. `decode` sets it while it caches."""

CACHE_COMPRESSION = "spark.sql.inMemoryColumnarStorage.compressed"
"""Spark compresses a cached plan's columns unless this is false. `decode` caches its aggregate
uncompressed: it is read twice or so and then dropped, and choosing and applying an encoding
per column and batch cost more than the memory saved (measured at 1M input rows: the
uncompressed cache built faster, and took more memory: benchmarks/README.md, "Spark decode")."""

_CACHE_SETTINGS = {CACHED_PLAN_COALESCING: "true", CACHE_COMPRESSION: "false"}


_COUNT_SETTINGS = {**NOT_ADAPTIVE, "spark.sql.shuffle.partitions": "1"}


def _plan_over_cache(counts: DataFrame) -> None:
    """Plan the per-time counts over the cached aggregate without adaptive execution and with
    one shuffle partition (`_COUNT_SETTINGS`, restored as soon as the plan is made: an action
    runs the plan its DataFrame already has). Then one job builds the cache and counts its
    rows in the same tasks, the few partial counts meeting in one task. Under adaptive
    execution a job of its own would build the cache first and another read the counts from
    it: this is one job fewer (a few hundredths of a second at 1M and 4M input rows:
    benchmarks/README.md). The cached plan was planned when it was cached, with the session's
    settings: the aggregate's shuffle keeps its partitions, coalesced by adaptive execution if
    that is on."""
    with settings(counts.sparkSession, _COUNT_SETTINGS):
        counts._jdf.queryExecution().executedPlan()


def _persist_for_decode(df: DataFrame, *, adaptive: bool) -> DataFrame:
    """`df.persist()`, with adaptive execution free to coalesce the cached plan's shuffle
    partitions, and its columns not compressed (`_CACHE_SETTINGS`); without `adaptive`, the
    plan is cached without adaptive execution (its partitions are fixed: the caller's, or
    `_partitions_for`'s), so one job runs it whole instead of a job a stage. The session
    settings are restored at once: only the plan cached here is affected (they are read when
    the plan is cached, not when it is computed)."""
    from pyspark import StorageLevel

    values = _CACHE_SETTINGS if adaptive else {**_CACHE_SETTINGS, **NOT_ADAPTIVE}
    with settings(df.sparkSession, values):
        return df.persist(StorageLevel.MEMORY_AND_DISK)


INPUT_BYTES_PER_PARTITION = 32 * 2**20
"""How much input (as Spark's plan estimates it: for files, their size) one partition of the
aggregate gets, at least one or two per core (`ONE_WAVE_BYTES_PER_CORE`) and at most
`spark.sql.shuffle.partitions` (`_partitions_for`). About 64 MiB of shuffle, adaptive
execution's target, for the Parquet of benchmarks/README.md."""


ONE_WAVE_BYTES_PER_CORE = 16 * 2**20
"""Input up to this much per core (as `INPUT_BYTES_PER_PARTITION` counts it) gets one
partition of the aggregate per core, larger input at least two per core (`_partitions_for`).
Two a core balance the cores when tasks are long (at 4M input rows, two partitions were
slower than four); for a small input a second wave of tasks costs more than it balances, in
the aggregate's reduce side and in every read of the cache (at 1M, one partition a core was
faster: benchmarks/README.md, "Spark decode", 2026-12-01)."""


def _partitions_for(relevant: DataFrame) -> int | None:
    """How many partitions the aggregate gets: from the input's estimated size, or None where
    Spark has no estimate (a DataFrame made from Python rows, most data sources), and
    adaptive execution then coalesces the session's partitions as the shuffle turns out.

    Fixed partitions let one job run the aggregate, build the cache and take the counts
    (`_persist_for_decode`); under adaptive execution each stage is a job of its own and the
    map side writes every one of `spark.sql.shuffle.partitions` (200 by default). Decode +
    count against dropDuplicates().count() of Parquet input was faster with fixed partitions
    than under adaptive execution at 1M and 4M input rows (benchmarks/README.md, "Spark
    decode")."""
    size = relevant._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()
    if size >= UNKNOWN_SIZE:
        return None
    spark = relevant.sparkSession
    configured = int(spark.conf.get("spark.sql.shuffle.partitions") or 200)
    cores = spark.sparkContext.defaultParallelism
    least = cores if size <= ONE_WAVE_BYTES_PER_CORE * cores else 2 * cores
    return min(configured, max(least, -(-int(size) // INPUT_BYTES_PER_PARTITION)))


def decode(
    updates: DataFrame,
    progress: DataFrame,
    *,
    since: Antichain | int | Iterable[int] | None = None,
    strict: bool = True,
    cache: bool = True,
) -> Decoded:
    """Recover the history in `updates`/`progress` up to the frontier the log justifies.

    `since` is a frontier: an `Antichain`, a time (`4`) or a list of times (`[4]`); default
    `[0]`. Runs two Spark actions eagerly (streaming the statements into the protocol's
    reader, none kept on the driver, and one aggregation of the updates that yields the
    per-time counts) and returns lazy DataFrames; lenient mode
    skips the second when no statement covers anything (then no time can finish or be in
    excess).
    With `cache` (the default) the aggregate is persisted while the counts are computed, so
    `updates` and `pending` read it instead of aggregating the input again: call
    `Decoded.unpersist()` (or use `with`) when done. Without `cache`, nothing is cached and
    every action on the result aggregates the input again.
    Strict mode raises the first `ProtocolError` found; lenient mode reports in `rejected`.
    """
    start = as_frontier(since) if since is not None else Antichain([0])
    _single(start)  # integer times only
    # The statements' job runs while this thread plans the aggregate (see `_decode`).
    collecting = _Collecting(progress, start, strict=strict)
    try:
        return _decode(updates, collecting.result, start, strict=strict, cache=cache)
    finally:
        collecting.join()


def decode_statements(
    updates: DataFrame,
    statements: Iterable[Progress],
    *,
    since: Antichain | int | Iterable[int] | None = None,
    strict: bool = True,
    cache: bool = True,
    partitions: int | None = None,
) -> Decoded:
    """`decode` with the progress statements already on the driver: the streaming decode
    keeps them there between batches, so no Spark job puts them into a DataFrame and
    collects them back. Runs the one aggregation job (see `decode`).

    `partitions` fixes the aggregation's partition count instead of the one taken from the
    input's estimated size (`_partitions_for`): for a micro-batch, say, whose rows Spark
    cannot estimate, where each of 200 shuffle partitions is a file written per task and
    costs more than the rows do.
    """
    start = as_frontier(since) if since is not None else Antichain([0])
    _single(start)  # integer times only
    given = list(statements)
    return _decode(updates, lambda: resolve_progress(given, start, strict=strict), start,
                   strict=strict, cache=cache, partitions=partitions)


class _Collecting:
    """`resolve_progress` over `iter_statements(progress)` in a thread of its own, started
    at once: the statements stream from the executors into the protocol's reader, which
    keeps what they cover and a count a covered time, not the statements.

    The statements' job is small and mostly fixed cost (planning the read, scheduling one
    job); the aggregate's driver-side planning, which needs only `since`, is about as long,
    and the two overlap. `InheritableThread` gives the job the caller's job group and
    description, and pins one JVM thread to it.
    """

    def __init__(self, progress: DataFrame, start: Antichain, *, strict: bool) -> None:
        from pyspark import InheritableThread

        self._resolution: ProgressResolution | None = None
        self._error: BaseException | None = None
        self._thread = InheritableThread(target=self._run, args=(progress, start, strict),
                                         daemon=True)
        self._thread.start()

    def _run(self, progress: DataFrame, start: Antichain, strict: bool) -> None:
        try:
            self._resolution = resolve_progress(iter_statements(progress), start,
                                                strict=strict)
        except BaseException as error:  # re-raised in the caller's thread by `result`
            self._error = error

    def result(self) -> ProgressResolution:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._resolution is not None
        return self._resolution

    def join(self) -> None:
        self._thread.join()


def _decode(
    updates: DataFrame,
    resolve: Callable[[], ProgressResolution],
    start: Antichain,
    *,
    strict: bool,
    cache: bool,
    partitions: int | None = None,
) -> Decoded:
    """`decode_statements`, asking for the statements' resolution (`resolve`) only once the
    aggregate, which depends on `start` alone, is planned (and registered for caching)."""
    spark = updates.sparkSession
    in_range = rules.is_beyond_sql(start)
    valid = rules.is_settled_sql()
    # Updates at finished times only matter if they break a rule no matter when they come.
    relevant = updates.where(f"{in_range} OR diff = 0")  # a view of it is safe: see _sql
    if partitions is None:
        partitions = _partitions_for(relevant)
    # Shuffled whole, with no partial aggregate before the shuffle (see the module docstring);
    # the GROUP BY keeps this partitioning: no second exchange. Maps in `data` are grouped
    # as their sorted entries: Spark's own grouping of a map turns its null values into 0s.
    count = "" if partitions is None else f"{int(partitions)}, "
    keys = _data_keys(updates.schema["data"])
    names = ", ".join(keys.names)
    rows = (f"(SELECT /*+ REPARTITION({count}{names}, time) */ {', '.join(keys.grouped)}, "
            "time, diff FROM {relevant})")
    aggregate = _sql(
        f"SELECT {', '.join(keys.restored)}, time, {rules.summarize_sql()} FROM {rows} "
        f"GROUP BY {names}, time",
        relevant=relevant,
    )
    if cache:  # released below if nothing reads it, or on any error
        aggregate = _persist_for_decode(aggregate, adaptive=partitions is None)
    # The aggregate's rows with `data` made again (the aggregate itself where it is `data`).
    grouped = aggregate if keys.data is None else aggregate.selectExpr(
        f"{keys.data} AS data", "time", "lo", "hi", "zero")
    try:
        resolution = resolve()
    except BaseException:
        if cache:
            aggregate.unpersist()
        raise
    covered_until = _single(resolution.progress_frontier)  # None: everything covered
    covers_anything = resolution.progress_frontier != start

    distinct: dict[int, int] = {}
    zeros = conflicts = 0
    if cache and not (strict or covers_anything):
        aggregate.unpersist()  # never built: no count is taken from it
        cache = False
    if strict or covers_anything:  # else nothing can finish, and errors are only set aside
        covered = in_range if covered_until is None else f"{in_range} AND time < {covered_until}"
        # One row per covered time, plus one row (time null) for everything else. A
        # `groupBy` of expression texts, not `_sql`: no temporary view, whose drop compares
        # the view's plan with every cached one (the aggregate's among them).
        counts = _grouped_by_texts(
            grouped, f"CASE WHEN {covered} THEN time END AS t",
            f"count_if({valid}) AS valid", f"count_if({rules.is_conflicting_sql()}) AS conflicts",
            f"count_if({rules.is_zero_diff_sql()}) AS zeros",
        )
        try:
            if cache:
                _plan_over_cache(counts)
            stats = counts.collect()
        except BaseException:
            if cache:
                aggregate.unpersist()  # the caller never sees it: do not leak the cache
            raise
        zeros = sum(r["zeros"] for r in stats)
        conflicts = sum(r["conflicts"] for r in stats)
        distinct = {r["t"]: r["valid"] for r in stats if r["t"] is not None}
    excess = sorted(
        t for t, n in distinct.items() if rules.is_excess(n, resolution.expected.get(t, 0))
    )
    if strict and (zeros or conflicts or excess):
        try:
            _raise_first(updates, grouped, zeros, conflicts, excess, resolution.expected,
                         distinct)
        finally:
            if cache:
                aggregate.unpersist()  # the caller never sees it: do not leak the cache

    frontier = rules.frontier(resolution.progress_frontier, resolution.expected, distinct)
    until = _single(frontier)
    window = in_range if until is None else f"{in_range} AND time < {until}"
    result = grouped.where(f"{valid} AND {window}").selectExpr(*_SETTLED)
    beyond = f"{valid} AND {rules.is_beyond_sql(frontier)}"
    missing = {t: c - distinct.get(t, 0) for t, c in resolution.expected.items()
               if rules.is_unfinished(distinct.get(t, 0), c)}

    checked = strict or covers_anything
    with_updates = not strict and (not checked or bool(zeros or conflicts or excess))
    return Decoded(
        result,
        frontier,
        resolution.progress_frontier,
        missing,
        lambda: grouped.where(beyond).selectExpr(*_SETTLED),
        lambda: _rejected(spark, grouped, resolution.rejected, excess,
                          with_updates=with_updates),
        aggregate if cache and aggregate.is_cached else None,
    )


@dataclass(frozen=True)
class _DataKeys:
    """How the aggregate groups the updates' `data`: the select-list texts that make its
    grouping keys from an input row (`grouped`), the keys' names, the aggregate's select-list
    texts for them (`restored`: maps made again, `map_grouping`), and the text that makes
    `data` again from the aggregate's row (None: the aggregate holds `data` itself)."""

    grouped: tuple[str, ...]
    names: tuple[str, ...]
    restored: tuple[str, ...]
    data: str | None


def _data_keys(field: StructField) -> _DataKeys:
    """A struct's fields are grouping keys of their own, and a flag for a null struct where
    `data` may be null: an aggregate keyed by plain columns (longs, strings), not by one
    struct, is cheaper to build and to cache (Spark's hash map and its columnar cache take a
    struct value as one opaque blob: benchmarks/README.md, "Spark decode", the many-file
    shape). The fields grouped one by one are grouped as the struct is (null fields, NaN
    and -0.0 normalized alike). Anything else, and a struct whose type the struct made again
    would not keep exactly (a field's metadata; a field that cannot be null in a struct that
    can: `struct(...)` gives its fields the nullability of their values), is grouped whole."""
    from pyspark.sql.types import StructType

    from changelake.spark.expressions import quote

    kind = field.dataType
    whole = not isinstance(kind, StructType) or not kind.fields or any(
        f.metadata or (field.nullable and not f.nullable) for f in kind.fields)
    if whole:
        return _DataKeys((f"{grouping_sql(kind, 'data')} AS data",), ("data",),
                         (f"{restored_sql(kind, 'data')} AS data",), None)
    assert isinstance(kind, StructType)
    names = [f"_d{i}" for i in range(len(kind.fields))]
    grouped = [f"{grouping_sql(f.dataType, 'data.' + quote(f.name))} AS {n}"
               for f, n in zip(kind.fields, names, strict=True)]
    restored = [f"{restored_sql(f.dataType, n)} AS {n}"
                for f, n in zip(kind.fields, names, strict=True)]
    data = "struct(" + ", ".join(f"{n} AS {quote(f.name)}"
                                 for f, n in zip(kind.fields, names, strict=True)) + ")"
    if field.nullable:
        grouped.insert(0, "data IS NULL AS _dnull")
        restored.insert(0, "_dnull")
        names.insert(0, "_dnull")
        data = f"CASE WHEN _dnull THEN NULL ELSE {data} END"
    return _DataKeys(tuple(grouped), tuple(names), tuple(restored), data)


def _grouped_by_texts(frame: DataFrame, key: str, *aggregates: str) -> DataFrame:
    """`SELECT key, aggregates... FROM frame GROUP BY key`, each a Spark SQL text with its
    alias (`"count(x) AS n"`): one `Column` per text, parsed in the JVM."""
    from pyspark.sql import functions as F

    return frame.groupBy(F.expr(key)).agg(*(F.expr(text) for text in aggregates))


def _sql(query: str, **frames: DataFrame) -> DataFrame:
    """`spark.sql(query, **frames)`: each `{name}` in `query` reads `frames[name]`.

    `spark.sql` makes each frame a temporary view and drops it afterwards, and dropping a view
    uncaches a cached DataFrame that is exactly its plan. So a frame passed here is always a
    plan derived from anything that is or may be cached (a filter, a coalesce), never the
    cached DataFrame itself: not the caller's input, not the decode's aggregate.
    """
    return next(iter(frames.values())).sparkSession.sql(query, **frames)


_SETTLED = ("data", "time", "lo AS diff")
"""The select list that makes an aggregate row with a settled diff an update again."""


_STATEMENT_NULLS = (
    "CAST(NULL AS ARRAY<BIGINT>) AS lower", "CAST(NULL AS ARRAY<BIGINT>) AS upper",
    "CAST(NULL AS ARRAY<STRUCT<`time`: BIGINT, `count`: BIGINT>>) AS counts",
)
"""The statement columns of `rejected_schema`, null: the tail of an update row there."""

_REJECTED_NONE = (
    "'' AS rule", "CAST(NULL AS STRING) AS reason", "CASE WHEN false THEN data END AS data",
    "CAST(NULL AS BIGINT) AS time", "CAST(NULL AS BIGINT) AS diff", *_STATEMENT_NULLS,
)
"""The select list of no rejected row, typed as `rejected_schema` (over the aggregate)."""


def _rejected(
    spark: SparkSession,
    grouped: DataFrame,
    statements: Sequence[Rejected],
    excess: Sequence[int],
    *,
    with_updates: bool,
) -> DataFrame:
    """Lenient mode's set-aside input as one DataFrame (see the module docstring), of
    `rejected_schema`. One SQL query over the aggregate: its first part selects no row
    (`WHERE false` reads nothing) and gives every column its type and nullability. With
    nothing set aside (strict mode, always) that part alone, as a `selectExpr` of the same
    list: no temporary view, which cost a decode driver time (benchmarks/README.md, "Figures
    moved out of docstrings")."""
    none = grouped.where("false")
    if not statements and not with_updates:
        return none.selectExpr(*_REJECTED_NONE)
    parts = [f"SELECT {', '.join(_REJECTED_NONE)} FROM {{none}}"]
    frames: dict[str, DataFrame] = {"none": none}
    if statements:
        rows: list[dict[str, Any]] = []
        for item in statements:
            p = item.message
            assert isinstance(p, Progress)
            rows.append(
                {
                    "rule": item.error.rule,
                    "reason": str(item.error),
                    "lower": list(p.lower.elements),
                    "upper": list(p.upper.elements),
                    "counts": [{"time": t, "count": c} for t, c in p.counts],
                }
            )
        data_type = grouped.schema["data"].dataType
        frames["statements"] = spark.createDataFrame(rows, rejected_schema(data_type))
        parts.append("SELECT * FROM {statements}")
    if with_updates:

        def shaped(rule: str, reason: str, diff: str, where: str) -> None:
            frames[rule.replace("-", "_")] = grouped.where(where)
            parts.append(f"SELECT '{rule}', '{reason}', data, time, {diff}, "
                         f"{', '.join(_STATEMENT_NULLS)} "
                         f"FROM {{{rule.replace('-', '_')}}}")

        shaped("zero-diff", "update has diff 0", "CAST(0 AS BIGINT)", rules.is_zero_diff_sql())
        shaped("conflicting-diff", "one (data, time) has different diffs",
               "explode(array(lo, hi))", rules.is_conflicting_sql())
        if excess:
            shaped(
                "excess-updates",
                "time has more distinct updates than its progress statement counted",
                "lo", f"{rules.is_settled_sql()} AND time IN ({', '.join(map(str, excess))})",
            )
    return _sql(" UNION ALL ".join(parts), **frames)


def _raise_first(
    updates: DataFrame,
    grouped: DataFrame,
    zeros: int,
    conflicts: int,
    excess: Sequence[int],
    expected: dict[int, int],
    distinct: dict[int, int],
) -> None:
    """Raise the error for one offending update, located in the input if it says where."""
    from pyspark.sql import functions as F

    if zeros:
        (example,) = grouped.where(rules.is_zero_diff_sql()).orderBy("time").limit(1).collect()
        raise ProtocolError(
            "zero-diff",
            f"update of {_show(example['data'])} at time {example['time']} has diff 0 "
            f"({zeros} such (data, time) in all)",
            _locate(updates, example["data"], example["time"], F.col("diff") == 0),
        )
    if conflicts:
        (example,) = (
            grouped.where(rules.is_conflicting_sql()).orderBy("time").limit(1).collect()
        )
        raise ProtocolError(
            "conflicting-diff",
            f"{_show(example['data'])} at time {example['time']} has diffs {example['lo']} "
            f"and {example['hi']} ({conflicts} such (data, time) in all)",
            _locate(updates, example["data"], example["time"], F.col("diff") == example["hi"]),
        )
    t = excess[0]
    raise ProtocolError(
        "excess-updates",
        f"time {t} has {distinct[t] - expected.get(t, 0)} more distinct updates than the "
        f"{expected.get(t, 0)} its progress statements counted",
        _locate(updates, None, t, F.lit(True)),
    )


def _show(data: Any) -> str:
    if isinstance(data, str):  # data carried as JSON text
        return data
    return repr(data.asDict(recursive=True)) if hasattr(data, "asDict") else repr(data)


def _locate(updates: DataFrame, data: Any, time: int, condition: Column) -> Location | None:
    """Where one offending update sits in the input, if the input carries its location.

    Only on the error path: this scans the input once more.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    present = [c for c in LOCATION_COLUMNS if c in updates.columns]
    if not present:
        return None
    match = updates.where((F.col("time") == time) & condition)
    if data is not None:
        key_type = StructType(
            [
                StructField("_data", updates.schema["data"].dataType),
                StructField("_time", LongType()),
            ]
        )
        key = updates.sparkSession.createDataFrame([(data, time)], key_type)
        match = match.join(
            F.broadcast(key),
            F.col("data").eqNullSafe(F.col("_data")) & (F.col("time") == F.col("_time")),
        )
    rows = match.select(*present).orderBy(*present).limit(1).collect()  # the first in order
    if not rows:
        return None
    found = rows[0].asDict()
    return Location(found.get("_file"), found.get("_line"), found.get("_offset"),
                    found.get("_index"))


def locate_key(updates: DataFrame, key: dict[str, Any], time: int, sign: int
               ) -> Location | None:
    """Where an update of the input at `time`, with a diff of `sign`, whose row has the
    values `key` gives its fields, sits (the first in the input's order), if the input says
    (`lake.key_rule.Locate`). A field whose value is not a plain scalar is not matched on."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    if not isinstance(updates.schema["data"].dataType, StructType):
        return None  # rows carried as JSON text
    condition = F.signum("diff") == sign
    for name, value in key.items():
        if not isinstance(value, (dict, list, tuple)):  # Rows are tuples
            condition = condition & F.col("data").getField(name).eqNullSafe(F.lit(value))
    return _locate(updates, None, time, condition)


def split_messages(messages: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The updates and progress DataFrames that `decode` takes, from a messages DataFrame
    (one of `updates` or `progress` per row, as `encode` and the Avro union have it).
    Location columns present in `messages` are carried along."""
    extra = "".join(
        f", {c}" for c in LOCATION_COLUMNS if c in messages.columns and c != "_index"
    )
    # Views of filtered plans, never of `messages` itself (it may be cached): see `_sql`.
    updates = _sql(
        f"SELECT u.data AS data, u.time AS time, u.diff AS diff{extra}, _index FROM {{messages}} "
        "LATERAL VIEW posexplode(updates) exploded AS _index, u",
        messages=messages.where("updates IS NOT NULL"),
    )
    progress = _sql(
        "SELECT progress.lower AS lower, progress.upper AS upper, progress.counts AS counts"
        f"{extra} FROM {{messages}}",
        messages=messages.where("progress IS NOT NULL"),
    )
    return updates, progress
