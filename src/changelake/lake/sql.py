"""The SQL that reads a table's state: the text of the committed view, and of `AS OF` reads.

The view is plain Spark SQL over `parquet.`dir`` sources, so `spark.table("db.name")` needs no
changelake code. The committed file sets are read as few sources as they can be (a run's
buckets as their directory, the segments of one physical schema as one glob: `group_sources`),
each projected onto the table's logical schema (absent columns as typed nulls, narrower types
cast up: see `schema.py`); the projections are unioned, and the union is merged on read:

* keyed tables: per key, the update at the latest time wins (an insertion over a retraction at
  the same time); the key exists if that update inserts. Taking the latest version of a key
  instead of summing diffs over whole rows keeps a key's history consistent across schema
  changes (a retraction written after a column was added need not match the old row exactly).
* unkeyed tables: diffs are summed per row (on the columns live at the time read) and a row
  with multiplicity n appears n times.

The view text starts with a marker naming the committed manifest version; replacing the view
(one metastore call) is the commit point. Names reach the SQL only as identifiers checked by
`identifier.py`, always in backticks (`quote`); the marker holds no name, and string literals
are escaped (`string_literal`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pyspark.sql.types import DataType, StructType

from changelake.errors import LakeError
from changelake.lake.layout import SEGMENT, SEGMENT_NAME, FileSet, TableState, updates_path
from changelake.lake.schema import live_columns, logical_schema, parse_struct
from changelake.spark.expressions import quote
from changelake.spark.map_grouping import grouping_sql, has_map, restored_sql

# Views committed before the marker lost its table name still carry `table=NAME`.
MARKER = re.compile(r"/\* changelake (?:table=\S+ )?version=(\d+) \*/")


def string_literal(text: str) -> str:
    """A Spark SQL string literal holding exactly `text` (Spark reads backslash escapes in
    literals by default, so both the backslash and the quote are escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_type(dt: DataType) -> str:
    return dt.simpleString()


def path_literal(path: Path) -> str:
    text = str(path)
    if "`" in text or any(c in text for c in "{}[]*?,\\"):
        # Hadoop would read these as glob syntax; the lake directory must not contain them.
        raise LakeError(f"lake path {text!r} contains a backtick or glob characters "
                        "({}[]*?,\\), which Spark would misread in a path")
    return text


def project_file_set(fs: FileSet, state: TableState, table_dir: Path,
                     logical: StructType, with_bucket: bool = False) -> str:
    """SELECT the logical columns (+ _time, _diff, and the bucket if asked) from one file
    set."""
    physical = {f.name: f.dataType for f in parse_struct(state.structs[fs.struct]).fields}
    items: list[str] = []
    for f in logical.fields:
        if f.name not in physical:
            items.append(f"CAST(NULL AS {sql_type(f.dataType)}) AS {quote(f.name)}")
        elif physical[f.name] != f.dataType:
            items.append(f"CAST({quote(f.name)} AS {sql_type(f.dataType)}) AS {quote(f.name)}")
        else:
            items.append(quote(f.name))
    items += ["_time", "_diff"]
    if with_bucket:
        items.append(f"{int(fs.bucket or 0)} AS _bucket")
    return f"SELECT {', '.join(items)} FROM parquet.`{source_literal(table_dir, fs.path)}`"


def source_literal(table_dir: Path, path: str) -> str:
    """The path of a source in the SQL: a file set's directory, or the glob of segments that
    `group_sources` makes (the only glob syntax allowed through)."""
    if SEGMENT_GLOB.fullmatch(path):
        return f"{path_literal(table_dir)}/{path}"
    return path_literal(table_dir / path)


def union_sql(state: TableState, table_dir: Path, files: Sequence[FileSet] | None = None,
              logical: StructType | None = None, with_bucket: bool = False) -> str:
    """All updates of the given file sets (default: all committed), on the logical schema.
    A Delta table's are its updates table's (`delta_storage.union_sql`)."""
    logical = logical if logical is not None else logical_schema(state.versions)
    if state.storage == "delta" and files is None and not with_bucket:
        return delta_union_sql(state, table_dir, logical)
    chosen = state.files if files is None else files
    if not chosen:
        items = [f"CAST(NULL AS {sql_type(f.dataType)}) AS {quote(f.name)}"
                 for f in logical.fields]
        items += ["CAST(NULL AS BIGINT) AS _time", "CAST(NULL AS BIGINT) AS _diff"]
        if with_bucket:
            items.append("CAST(NULL AS INT) AS _bucket")
        return f"SELECT {', '.join(items)} WHERE FALSE"
    if with_bucket:
        parts = [project_file_set(fs, state, table_dir, logical, True) for fs in chosen]
    else:
        parts = [project_file_set(fs, state, table_dir, logical) for fs in group_sources(
            chosen, table_dir)]
    return "\nUNION ALL ".join(parts)


def delta_literal(path: Path) -> str:
    """`delta.`path`` for SQL."""
    return f"delta.`{path_literal(path)}`"


def delta_union_sql(state: TableState, table_dir: Path, logical: StructType | None = None, *,
                    lower: int | None = None, upper: int | None = None) -> str:
    """A Delta-format table's updates (`delta_storage.py`): every update `state` covers
    (times before its frontier; from `lower` and before `upper` when given), on the logical
    schema (`logical`, default the state's), with `_time` and `_diff`."""
    logical = logical if logical is not None else logical_schema(state.versions)
    items = [f"CAST({quote(f.name)} AS {sql_type(f.dataType)}) AS {quote(f.name)}"
             for f in logical.fields]
    limits = []
    top = state.upper if upper is None else upper
    if top is not None:
        limits.append(f"_time < {int(top)}")
    if lower is not None:
        limits.append(f"_time >= {int(lower)}")
    where = f" WHERE {' AND '.join(limits)}" if limits else ""
    return (f"SELECT {', '.join(items)}, _time, _diff FROM "
            f"{delta_literal(updates_path(table_dir))}{where}")


def group_sources(files: Sequence[FileSet], table_dir: Path) -> list[FileSet]:
    """The file sets as few `parquet.`dir`` sources as they can be read as, each a `FileSet`
    whose `path` may be a directory of several or a glob.

    Spark resolves each source with a listing and a footer read, and infers its schema with
    a Spark job of its own, every time it resolves the view: at each commit (`ALTER VIEW`)
    and each read. So a table read one source per file set pays a job per segment until it
    compacts (`benchmarks/bench_segments.py`). Here:

    * a whole `base/vN` or `delta/vN` directory is one source when every bucket in it is one
      of `files` (the usual case right after it is written); a directory also holding
      superseded buckets is read bucket by bucket (`_runs`);
    * the segments of one physical schema are one source, a glob naming each of them
      (`seg/{0-5,5-9}`) (`_segments`).

    A glob skips a name that matches no directory, where a source of its own fails Spark's
    read. So every segment is checked to be there first, and a missing one is a `LakeError`
    naming it, wherever this SQL is made: at each commit (which then fails, committing
    nothing), compaction, export, and the reads whose SQL `Table` makes (`as_of`, `updates`,
    `history`). The committed view (`Table.current()`, a plain `spark.table(...)`) is read as
    it was made at the last commit. (A source that is a directory skips a missing file
    alone, as before.)
    """
    return _segments(_runs(files, table_dir), table_dir)


def _runs(files: Sequence[FileSet], table_dir: Path) -> list[FileSet]:
    by_root: dict[str, list[FileSet]] = {}
    out: list[FileSet] = []
    for fs in files:
        if fs.bucket is not None and "/_bucket=" in fs.path:
            by_root.setdefault(fs.path.rsplit("/", 1)[0], []).append(fs)
        else:
            out.append(fs)
    for root, members in by_root.items():
        on_disk = {p.name for p in (table_dir / root).iterdir() if p.is_dir()} \
            if (table_dir / root).is_dir() else set()
        named = {fs.path.rsplit("/", 1)[1] for fs in members}
        if len(members) > 1 and on_disk == named and len({fs.struct for fs in members}) == 1:
            first = members[0]
            out.append(replace(first, path=root, rows=sum(f.rows for f in members),
                               bytes=sum(f.bytes for f in members), bucket=None))
        else:
            out.extend(members)
    return out


SEGMENT_PATH = re.compile(rf"seg/{SEGMENT_NAME}")
"""A segment's path as `layout.segment_path` makes it: nothing a glob would read as syntax."""
SEGMENT_GLOB = re.compile(rf"seg/\{{{SEGMENT_NAME}(?:,{SEGMENT_NAME})+\}}")


def _segments(files: Sequence[FileSet], table_dir: Path) -> list[FileSet]:
    by_struct: dict[int, list[FileSet]] = {}
    out: list[FileSet] = []
    for fs in files:
        if fs.kind == SEGMENT and SEGMENT_PATH.fullmatch(fs.path):
            by_struct.setdefault(fs.struct, []).append(fs)
        else:
            out.append(fs)
    missing = [fs.path for group in by_struct.values() for fs in group
               if not (table_dir / fs.path).is_dir()]
    if missing:
        raise LakeError(f"table directory {table_dir}: missing {', '.join(missing)}, which "
                        "the manifest names (removed outside changelake?); the table cannot "
                        "be read whole")
    for members in by_struct.values():
        if len(members) == 1:
            out.extend(members)
            continue
        names = ",".join(fs.path.removeprefix("seg/") for fs in members)
        out.append(replace(members[0], path=f"seg/{{{names}}}",
                           rows=sum(f.rows for f in members),
                           bytes=sum(f.bytes for f in members),
                           lower=None, upper=None, min_time=None, max_time=None))
    return out


def state_sql(state: TableState, table_dir: Path, as_of: int | None = None, *,
              marker: bool = True, bound: str | None = None,
              live: Sequence[str] | None = None) -> str:
    """The table as of `as_of` (None: the committed frontier), merged on read.

    `bound` is a SQL expression for the time instead of `as_of` (an AS OF function's
    parameter, see `sql_endpoint.py`); with it, an unkeyed table's columns live at that time
    are passed as `live` (default: those live at `as_of`)."""
    logical = logical_schema(state.versions)
    names = [f.name for f in logical.fields]
    cols = ", ".join(quote(n) for n in names)
    limit = bound if bound is not None else None if as_of is None else str(int(as_of))
    where = "" if limit is None else f" WHERE _time <= {limit}"
    union = union_sql(state, table_dir, logical=logical)
    tag = f"/* changelake version={state.version} */ " if marker else ""
    if state.keyed:
        key = ", ".join(quote(k) for k in state.key)
        return (
            f"SELECT {tag}{cols} FROM (SELECT *, row_number() OVER (PARTITION BY {key} "
            f"ORDER BY _time DESC, _diff DESC) AS _rank FROM (\n{union}\n) u{where}) r "
            f"WHERE _rank = 1 AND _diff > 0"
        )
    live = set(live if live is not None else live_columns(state.versions, as_of))
    # A map column is grouped as its sorted entries (Spark's own grouping of a map loses its
    # null values: `spark.map_grouping`), and shown as the map again.
    group = [quote(n) for n in names if n in live]
    keys = [f"{grouping_sql(f.dataType, quote(f.name))} AS {quote(f.name)}"
            for f in logical.fields if f.name in live]
    shown = unkeyed_columns(logical, live)
    rows = f"(\n{union}\n) u{where}"
    if any(has_map(f.dataType) for f in logical.fields if f.name in live):
        rows = f"(SELECT {', '.join(keys)}, _diff FROM {rows}) k"
    return (
        f"SELECT {tag}{cols} FROM (SELECT {', '.join(shown)}, "
        f"explode(array_repeat(0, CAST(_n AS INT))) AS _copy FROM (SELECT {', '.join(group)}, "
        f"SUM(_diff) AS _n FROM {rows} GROUP BY {', '.join(group)}) g WHERE _n > 0) c"
    )


def unkeyed_columns(logical: StructType, live: set[str]) -> list[str]:
    """The select list of an unkeyed table's rows after grouping them: each live column made
    from its grouping form again (a map from its sorted entries: `spark.map_grouping`), each
    column not live at the time read a typed null."""
    return [f"{restored_sql(f.dataType, quote(f.name))} AS {quote(f.name)}" if f.name in live
            else f"CAST(NULL AS {sql_type(f.dataType)}) AS {quote(f.name)}"
            for f in logical.fields]


def read_marker(view_text: str) -> int | None:
    """The committed version a view's text names, or None if it is not a changelake view."""
    match = MARKER.search(view_text)
    return int(match.group(1)) if match else None
