"""`Table`: a lake table's operations: commit (exactly once), read now or AS OF, compact, status.

The core write is `Table.commit(updates, lower, upper)`: the updates of the frontier interval
`[lower, upper)`, as the table's columns plus `_time` and `_diff`. The table records the
frontier it has committed (F), and

* F == lower: everything is new;
* lower < F < upper: the input overlaps what is committed, and only updates at times >= F are
  written: replaying or re-batching a feed never doubles a row;
* F >= upper: nothing in the input is new, and nothing happens;
* F < lower: there would be a gap in the history, which is an error.

Updates at zero diff are dropped (they say nothing); an update at a time >= upper is an error,
raised before the commit point, so the table stays at its last commit.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from changelake.errors import LakeError
from changelake.lake.commit import (
    DEFAULT_RETAIN,
    collect_garbage,
    load_state,
    publish,
    qualified,
    writer_lock,
)
from changelake.lake.layout import (
    SEGMENT,
    FileSet,
    TableState,
    parquet_stats,
    segment_path,
)
from changelake.lake.schema import evolve, logical_schema, struct_json
from changelake.lake.sql import state_sql
from changelake.protocol import Antichain

ProgressFn = Callable[[str, int, int], None]
"""progress(step description, steps done, steps total): the jobs layer draws bars with it."""


def frontier_int(frontier: Antichain, what: str) -> int | None:
    """A lake frontier as an integer (None: closed). Lake tables have integer times."""
    if frontier.is_closed:
        return None
    if len(frontier) != 1 or type(frontier.elements[0]) is not int:
        raise LakeError(f"{what} frontier {frontier.to_json()} is not an integer time; "
                        "lake tables use integer times")
    return frontier.elements[0]


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What a commit did: `written` updates from `lower` to `upper` (None: closed), or
    nothing if the table already had all of it."""

    table: str
    version: int
    lower: int | None
    upper: int | None
    written: int
    skipped: bool
    schema_changed: bool = False


def clear_dir(path: Path) -> None:
    """Remove an uncommitted leftover before writing to the same name."""
    if path.exists():
        shutil.rmtree(path)


class Table:
    """A handle on one lake table. Cheap: state is read from the metastore when needed."""

    def __init__(self, spark: SparkSession, name: str, directory: Path) -> None:
        self.spark = spark
        self.name = name
        self.directory = directory

    def __repr__(self) -> str:
        return f"Table({self.name!r}, {str(self.directory)!r})"

    # ------------------------------------------------------------------------------ state

    def state(self) -> TableState:
        """The committed manifest (read fresh from the metastore)."""
        state = load_state(self.spark, self.name, self.directory)
        if state is None:
            raise LakeError(f"table {self.name} does not exist")
        return state

    @property
    def frontier(self) -> Antichain:
        return self.state().frontier_antichain()

    @property
    def since(self) -> int:
        return self.state().since

    @property
    def schema(self) -> StructType:
        return logical_schema(self.state().versions)

    # ------------------------------------------------------------------------------ reads

    def current(self) -> DataFrame:
        """The current state through the metastore view, exactly as plain Spark SQL reads it."""
        return self.spark.table(qualified(self.name))

    def as_of(self, time: int) -> DataFrame:
        """The state at `time` (all updates at times <= `time`), for since <= time < frontier."""
        state = self.state()
        upper = state.upper
        if time < state.since:
            raise LakeError(f"table {self.name}: AS OF {time} is before the table's since "
                            f"({state.since}); that history was compacted away")
        if upper is not None and time >= upper:
            raise LakeError(f"table {self.name}: AS OF {time} is not final yet: the table is "
                            f"committed through time {upper - 1}")
        return self.spark.sql(state_sql(state, self.directory, as_of=time, marker=False))

    def updates(self) -> DataFrame:
        """Every retained update (base and deltas at their compacted times, then segments),
        on the logical schema with `_time` and `_diff`."""
        from changelake.lake.sql import union_sql

        return self.spark.sql(union_sql(self.state(), self.directory))

    # ----------------------------------------------------------------------------- writes

    def commit(self, updates: DataFrame, lower: Antichain, upper: Antichain, *,
               retain: int = DEFAULT_RETAIN) -> CommitResult:
        """Commit the updates of `[lower, upper)` exactly once (see the module docstring)."""
        for column in ("_time", "_diff"):
            if column not in updates.columns:
                raise LakeError(f"table {self.name}: updates have no {column} column "
                                f"(columns: {updates.columns})")
        lo = frontier_int(lower, "lower")
        up = frontier_int(upper, "upper")
        if lo is None:
            raise LakeError(f"table {self.name}: lower frontier of a commit cannot be closed")
        if up is not None and up < lo:
            raise LakeError(f"table {self.name}: upper {up} is before lower {lo}")
        with writer_lock(self.directory):
            state = self.state()
            committed = state.upper
            if committed is None or (up is not None and committed >= up):
                return CommitResult(self.name, state.version, committed, up, 0, True)
            if committed < lo:
                raise LakeError(
                    f"table {self.name}: the input starts at time {lo} but the table is "
                    f"committed only through time {committed - 1}; updates at times "
                    f"[{committed}, {lo}) are missing, nothing was written"
                )
            data = [f for f in updates.schema.fields if f.name not in ("_time", "_diff")]
            evolution = evolve(state.versions, StructType(data), committed, key=state.key,
                               table=self.name)
            rows = updates.where((F.col("_time") >= committed) & (F.col("_diff") != 0))
            rows = rows.select(
                *[F.col(f"`{f.name}`").cast(f.dataType).alias(f.name)
                  for f in evolution.write_struct.fields],
                F.col("_time").cast("long").alias("_time"),
                F.col("_diff").cast("long").alias("_diff"),
            )
            rel = segment_path(committed, up)
            target = self.directory / rel
            clear_dir(target)
            rows.write.parquet(str(target))
            count, size, t_min, t_max = parquet_stats(target)
            if up is not None and t_max is not None and t_max >= up:
                shutil.rmtree(target, ignore_errors=True)
                raise LakeError(
                    f"table {self.name}: an update at time {t_max} is not inside the "
                    f"committed interval [{lo}, {up}); nothing was written"
                )
            new, struct = state.struct_id(struct_json(evolution.write_struct))
            files = new.files
            if count:
                files = (*files, FileSet(rel, SEGMENT, struct, count, size, lower=committed,
                                         upper=up, min_time=t_min, max_time=t_max))
            else:
                shutil.rmtree(target, ignore_errors=True)
            new = new.next("commit", frontier=() if up is None else (up,),
                           versions=evolution.versions, files=files)
            new = _with_detail(new, lower=committed, upper=up, rows=count)
            publish(self.spark, self.directory, new, expected=state.version)
            if new.scd2:
                from changelake.lake.scd2 import publish_history

                publish_history(self, new)
            collect_garbage(self.directory, new, retain)
            return CommitResult(self.name, new.version, committed, up, count, False,
                                evolution.changed)

    def compact(self, since: int | None = None, **options: object) -> object:
        """Advance `since` and fold changes into the buckets; see `compact.py`."""
        from changelake.lake.compact import compact

        return compact(self, since, **options)  # type: ignore[arg-type]


def _with_detail(state: TableState, **detail: object) -> TableState:
    from dataclasses import replace

    return replace(state, detail=dict(detail))
