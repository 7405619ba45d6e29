"""What an export reads out of a lake table: its rows at a frontier, and what changed between
two frontiers, as Spark frames, all from one committed state read once (`pin`).

The meaning of "the table at frontier F" is `snapshot`'s: the committed view (every update at a
time before F, merged on read by `sql.state_sql`), so an exported target equals `snapshot` of
the table at the frontier the export recorded.

"The changes from frontier L to F" are expressed for a merge into a target that holds the table
at L (one row per key, or each distinct row as many times as its multiplicity):

* keyed (`keyed_changes`): per key touched at a time in `[L, F)`, its latest update there,
  ranked as the view ranks (latest time first, an insertion over a retraction): `_diff = 1`,
  the key's row at F (insert or replace); `_diff = -1`, the key is gone at F (delete). Keys
  not touched are as they were at L, so this is the view's answer for every key.
* unkeyed (`unkeyed_changes`): per distinct row (on the columns the view groups by) whose
  multiplicity changed in `[L, F)` by d: if d > 0, d copies to insert (`_diff = 1`); if d < 0,
  one delete marker (`_diff = 0`: remove every copy) and the row's whole multiplicity at F as
  copies to insert. A retraction thus removes exactly as many copies as it says, with no need
  to tell copies apart. The multiplicity at F is summed by Spark over the table's files, for
  the retracted rows only (a semi-join with them), so only the changed rows come out.

The changes are exact only where compaction has not folded them: times after the table's
`since`, or at `since` when nothing was compacted (`changes.plan_changes` has the same rule).
`exact_from` says whether they are; an exporter starts over from the full state when not.

Only the file sets that can hold times at or after L are read for the changes (each file set's
manifest entry knows its time range), so the Spark side of an incremental export reads the new
segments, not the table. A column dropped from the lake between L and F is refused by
`dropped_columns`: the view shows a dropped column as null in every row of an unkeyed table,
which no incremental change can express.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from changelake.errors import LakeError
from changelake.lake.layout import SEGMENT, FileSet, TableState, read_manifest
from changelake.lake.schema import live_columns, logical_schema
from changelake.lake.sql import quote, state_sql, union_sql, unkeyed_columns
from changelake.lake.table import Table
from changelake.spark.map_grouping import groupable


@dataclass(frozen=True, slots=True)
class Pinned:
    """One committed state of a lake table: every frame of one export is read from it, so the
    rows and the frontier recorded with them belong together even while ingests commit."""

    table: Table
    state: TableState

    @property
    def name(self) -> str:
        return self.table.name

    @property
    def directory(self) -> Path:
        return self.table.directory

    @property
    def frontier(self) -> int | None:
        """The frontier the rows are at (None: closed, every time is final)."""
        return self.state.upper

    @property
    def logical(self) -> StructType:
        return logical_schema(self.state.versions)

    @property
    def identity(self) -> str:
        """The table's identity, stable for its life: its name and when it was created (the
        creation manifest's time, in ms), so another lake's table of the same name, or the
        table created again, is not mistaken for it."""
        try:
            created = read_manifest(self.directory, 0).committed_at
        except LakeError:
            return self.name
        return f"{self.name}@{int(created * 1000)}"


def pin(table: Table) -> Pinned:
    return Pinned(table, table.state())


def frontier_json(frontier: int | None) -> str:
    """A lake frontier as Antichain JSON text: `[7]`, or `[]` once closed."""
    return json.dumps([] if frontier is None else [frontier])


def full_state(pinned: Pinned) -> DataFrame:
    """The table at the pinned frontier: the committed view's own SQL (as `snapshot` reads)."""
    return pinned.table.spark.sql(state_sql(pinned.state, pinned.directory, marker=False))


def exact_from(pinned: Pinned, lower: int) -> bool:
    """Whether the updates at times >= `lower` are the table's changes as committed (not
    history folded into `since` by compaction)."""
    since = pinned.state.since
    return lower > since or (lower == since and not pinned.state.folded and
                             all(fs.kind == SEGMENT for fs in pinned.state.files))


def window_files(pinned: Pinned, lower: int) -> tuple[FileSet, ...]:
    """The file sets that may hold updates at times >= `lower`."""
    return tuple(fs for fs in pinned.state.files if fs.max_time is None or fs.max_time >= lower)


def dropped_columns(pinned: Pinned, lower: int) -> list[str]:
    """Columns live at frontier `lower` but not at the pinned frontier (dropped meanwhile)."""
    versions = pinned.state.versions
    now = set(live_columns(versions))
    return [c for c in live_columns(versions, lower - 1) if c not in now]


def _window(pinned: Pinned, lower: int) -> DataFrame:
    spark = pinned.table.spark
    # A Delta table's updates are one table, read from `lower` on (Delta skips the files
    # whose statistics say they hold none).
    files = None if pinned.state.storage == "delta" else window_files(pinned, lower)
    updates = spark.sql(union_sql(pinned.state, pinned.directory, files=files,
                                  logical=pinned.logical))
    return updates.where(F.col("_time") >= lower)


def keyed_changes(pinned: Pinned, lower: int) -> DataFrame:
    """Per key touched in `[lower, frontier)`: its row and `_diff` 1 (present) or -1 (gone)."""
    from pyspark.sql import Window

    names = pinned.logical.fieldNames()
    key = [F.col(quote(k)) for k in pinned.state.key]
    rank = Window.partitionBy(*key).orderBy(F.col("_time").desc(), F.col("_diff").desc())
    latest = (_window(pinned, lower).withColumn("_rank", F.row_number().over(rank))
              .where(F.col("_rank") == 1))
    return latest.select(*[F.col(quote(n)) for n in names],
                         F.when(F.col("_diff") > 0, F.lit(1)).otherwise(F.lit(-1))
                         .cast("long").alias("_diff"))


def unkeyed_changes(pinned: Pinned, lower: int) -> DataFrame:
    """Delete markers (`_diff` 0) and copies to insert (`_diff` 1): see the module docstring."""
    spark = pinned.table.spark
    logical = pinned.logical
    live = set(live_columns(pinned.state.versions))
    group = [f.name for f in logical.fields if f.name in live]
    cols = [F.col(quote(n)) for n in group]
    # Rows are grouped and matched with each map as its sorted entries (`spark.map_grouping`:
    # Spark's own grouping of a map loses its null values, and it compares no maps), made
    # maps again at the end.

    def grouped(frame: DataFrame) -> DataFrame:
        return groupable(frame.selectExpr(*[quote(n) for n in group], "_time", "_diff"))

    changed = (grouped(_window(pinned, lower)).groupBy(*cols).agg(F.sum("_diff").alias("_d"))
               .where(F.col("_d") != 0))
    retracted = changed.where(F.col("_d") < 0).select(*cols)
    has_retractions = bool(retracted.take(1))  # a job over the window's files only
    added = changed.where(F.col("_d") > 0).select(
        *cols, F.explode(F.array_repeat(F.lit(1), F.col("_d").cast("int"))).alias("_x"))
    parts = [added.select(*cols, F.lit(1).cast("long").alias("_diff"))]
    if has_retractions:
        everything = grouped(spark.sql(union_sql(pinned.state, pinned.directory,
                                                 logical=logical)))
        u, r = everything.alias("u"), F.broadcast(retracted).alias("r")
        on = [F.col(f"u.{quote(n)}").eqNullSafe(F.col(f"r.{quote(n)}")) for n in group]
        counts = (u.join(r, on, "left_semi").groupBy(*[F.col(f"u.{quote(n)}") for n in group])
                  .agg(F.sum("_diff").alias("_n")).where(F.col("_n") > 0))
        copies = counts.select(*cols, F.explode(F.array_repeat(F.lit(1), F.col("_n")
                                                               .cast("int"))).alias("_x"))
        parts.append(retracted.select(*cols, F.lit(0).cast("long").alias("_diff")))
        parts.append(copies.select(*cols, F.lit(1).cast("long").alias("_diff")))
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part)
    return frame.selectExpr(*unkeyed_columns(logical, live), "_diff")
