"""`export_to_delta`: a lake table kept as a Delta table (delta-rs, no JVM side), incrementally
and exactly once.

The first run writes the table as of its committed frontier F (what `snapshot` prints). Every
later run applies only what changed between the frontier the Delta table holds (L) and the
table's frontier now (F), as one Delta commit:

* keyed tables: a `MERGE` on the key: a key present at F is inserted or replaced, a key gone
  at F is deleted (see `changes.keyed_changes`);
* unkeyed tables (multisets): a `MERGE` whose source has, per distinct row whose multiplicity
  changed, either the copies to add, or a delete marker (removing every copy) and the copies
  that remain at F (see `changes.unkeyed_changes`); a row twice in the table is two Delta rows.

Exactly once: every commit carries a Delta transaction identifier (`txn`: the app id
`changelake:` + the lake table's identity, its version the lake frontier, `CLOSED` for a closed
one) in the same atomic log entry as the data, and the commit's metadata names the frontier
(`changelake.frontier`, Antichain JSON), the frontier before it, the lake table and its
manifest version, so each Delta version maps to a changelake time. A run reads L back from the
`txn`, so a run killed at any point either committed (the next run starts from F) or left
nothing visible (the next run starts from L again; files written without a commit are never
read, as in any Delta writer). A run with the target already at F commits nothing. If the
changes since L were folded by compaction (L at or before the table's `since`), the run
rewrites the table whole (`mode="overwrite"`), in one commit too.

Schema: the Delta columns are the table's logical columns at Arrow types fixed by their Spark
types (`arrow.arrow_schema`: integers, float, double, string, boolean, binary, decimal, date,
timestamps, arrays, maps, structs). A column the lake added since L is added to the Delta
table in the same commit (schema merge). A column dropped in the lake, a widened type (Delta
tables do not widen types here) or a Delta column unknown to the lake table is refused, naming
the table and column, before anything is written.

One export to a target at a time from one lake: a run holds an exclusive lock named after the
target under `LAKE/_export/` (released by the kernel if the run dies); a writer elsewhere that
commits meanwhile makes the Delta commit fail, which is reported, with nothing changed.

A target that is not this table's export is refused with nothing changed: a Delta table with
no `txn` of this lake table (another table's export, or not changelake's), or a directory
that holds other files.

What goes through the driver: for the full export, nothing of the rows in Spark's form; Spark
writes the state as Parquet into a staging directory under the lake (`LAKE/_export/`), and the
driver streams it from there into delta-rs as Arrow record batches, one batch at a time
(`arrow.staged_batches`); delta-rs writes the Delta files from the driver process (a keyed
table in key order, in files of `TARGET_FILE_SIZE`, so that a merge prunes files by their key
ranges). For an
incremental run, the changes (one row per touched key, or the changed rows' copies) are
computed by Spark over the new segments only, and come to the driver as Arrow
(`DataFrame.toArrow`), sized by the changes, not the table; delta-rs then merges them into the
Delta table, reading and rewriting the Delta files whose key range holds a changed key (Delta
is copy-on-write: changes spread uniformly over the keys touch every file, changes to recent
keys a few). For an unkeyed table with retractions, Spark also sums the
retracted rows' multiplicity over all of the table's files (only those rows come out).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from changelake.errors import LakeError, SchemaError
from changelake.lake.catalog import Lake
from changelake.lake.export.arrow import (
    arrow_schema,
    export_lock,
    frame_to_arrow,
    staged_batches,
    staging_dir,
)
from changelake.lake.export.changes import (
    Pinned,
    dropped_columns,
    exact_from,
    frontier_json,
    full_state,
    keyed_changes,
    pin,
    unkeyed_changes,
)
from changelake.lake.export.result import ExportResult
from changelake.lake.files import RemotePath, delta_uri, lake_root, storage_options
from changelake.lake.identifier import TableIdentifier

APP_PREFIX = "changelake:"
CLOSED = 2**63 - 1
"""The `txn` version recording a closed frontier (every time final): Delta versions are longs."""

KIND = "delta"

_PART_FILE = re.compile(r"part-\d+-[0-9a-f-]+-c\d+(\.\w+)*\.parquet")


TARGET_FILE_SIZE = 16 * 1024 * 1024
"""Bytes per Delta data file of a full export. A merge rewrites every file holding a changed
key, so files smaller than Delta's usual 100 MiB keep an incremental run's rewrite bounded."""


def export_to_delta(lake: Lake, table: str | TableIdentifier, path: str | Path, *,
                    target_file_size: int = TARGET_FILE_SIZE) -> ExportResult:
    """Bring the Delta table at `path` to `table`'s committed frontier (see the module
    docstring): the whole table on the first run, the changes since the last run after."""
    target = lake_root(path)  # a local directory resolved, or a store's URI
    with export_lock(lake.root, target):
        return _export(lake, table, target, target_file_size)


def _options(target: Path | RemotePath) -> dict[str, str] | None:
    """delta-rs's storage options for `target`: on S3 the lake's endpoint and key pair
    (`files.storage_options`), and commits by conditional PUT (`If-None-Match`), so that a
    second writer's commit of the same version fails instead of overwriting the first's."""
    options = storage_options(target)
    if options is not None:
        options["conditional_put"] = "etag"
    return options


def _open(target: Path | RemotePath) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(delta_uri(target), storage_options=_options(target))


def _export(lake: Lake, table: str | TableIdentifier, target: Path | RemotePath,
            file_size: int) -> ExportResult:
    from deltalake import DeltaTable

    pinned = pin(lake.table(table))
    schema = arrow_schema(pinned.logical, pinned.name)
    app_id = APP_PREFIX + pinned.identity
    after = frontier_json(pinned.frontier)
    if not DeltaTable.is_deltatable(delta_uri(target), storage_options=_options(target)):
        _check_fresh(target, pinned)
        return _write_full(lake, pinned, target, schema, app_id, None, None, [], file_size)
    delta = _open(target)
    last = delta.transaction_version(app_id)
    if last is None:
        raise LakeError(_foreign(delta, target, pinned))
    lower = None if last == CLOSED else int(last)
    before = frontier_json(lower)
    upper = pinned.frontier
    if lower == upper:
        return ExportResult(pinned.name, KIND, str(target), _json(before), _json(after),
                            "none", version=delta.version())
    if lower is None or (upper is not None and lower > upper):
        raise LakeError(f"export target {target} holds lake table {pinned.name} at frontier "
                        f"{before}, beyond the table's frontier {after}: the target is not "
                        "this lake's export of it; nothing was changed")
    added = _check_schema(delta, schema, pinned, lower, target)
    if not exact_from(pinned, lower):
        return _write_full(lake, pinned, target, schema, app_id, lower, delta, added,
                           file_size)
    return _merge(lake, pinned, target, schema, app_id, lower, delta, added)


def _json(text: str) -> list:
    import json

    return json.loads(text)


def _commit_properties(lake: Lake, pinned: Pinned, app_id: str, before: int | None,
                       mode: str) -> Any:
    from deltalake import CommitProperties, Transaction

    upper = pinned.frontier
    metadata = {
        "changelake.table": pinned.name,
        "changelake.table_id": pinned.identity,
        "changelake.lake": str(lake.root),
        "changelake.table_version": str(pinned.state.version),
        "changelake.frontier": frontier_json(upper),
        "changelake.previous_frontier": "null" if before is None else frontier_json(before),
        "changelake.export": mode,
    }
    version = CLOSED if upper is None else upper
    return CommitProperties(custom_metadata=metadata,
                            app_transactions=[Transaction(app_id=app_id, version=version)])


def _check_fresh(target: Path | RemotePath, pinned: Pinned) -> None:
    """A new export's target: absent, empty, or holding only what a first export killed before
    its commit leaves (Delta data files and an uncommitted `_delta_log`)."""
    if not target.exists():
        return
    if not target.is_dir():
        raise LakeError(f"export target {target} is a file, not a directory for the Delta "
                        f"table of {pinned.name}; nothing was changed")
    strays = sorted(p.name for p in target.iterdir()
                    if p.name != "_delta_log" and not _PART_FILE.fullmatch(p.name))
    if strays:
        raise LakeError(f"export target {target} is not a Delta table and holds other files "
                        f"({', '.join(strays[:3])}{', ...' if len(strays) > 3 else ''}): "
                        f"refusing to write the Delta table of {pinned.name} there; nothing "
                        "was changed")


def _foreign(delta: Any, target: Path | RemotePath, pinned: Pinned) -> str:
    """The error for a Delta table that holds no export of this lake table."""
    meta = delta.metadata()
    description = meta.description or ""
    if description.startswith("changelake export of lake table "):
        owner = description.removeprefix("changelake export of lake table ")
        return (f"export target {target} holds the Delta export of lake table {owner}, not of "
                f"{pinned.identity} (lake table {pinned.name}); nothing was changed: export "
                "to another path")
    return (f"export target {target} holds a Delta table that is not an export of lake table "
            f"{pinned.name} (no changelake transaction for it in its log); nothing was changed: "
            "export to another path")


def _check_schema(delta: Any, schema: pa.Schema, pinned: Pinned, lower: int, target: Path
                  ) -> list[str]:
    """The lake columns the Delta table lacks (to add); a SchemaError for any other
    difference (see the module docstring)."""
    from deltalake import Schema

    name = pinned.name
    dropped = dropped_columns(pinned, lower)
    if dropped:
        raise SchemaError(f"table {name}: column {dropped[0]!r} was dropped from the lake table "
                          f"after frontier {frontier_json(lower)}, which export to Delta "
                          f"({target}) does not carry over; nothing was changed")
    ours = {f.name: f for f in Schema.from_arrow(schema).fields}
    theirs = {f.name: f for f in delta.schema().fields}
    spark_types = {f.name: f.dataType.simpleString() for f in pinned.logical.fields}
    for column, field in theirs.items():
        if column not in ours:
            raise SchemaError(f"table {name}: the Delta table {target} has column {column!r}, "
                              "which the lake table does not; nothing was changed")
        if str(ours[column].type) != str(field.type):
            raise SchemaError(
                f"table {name}: column {column!r} is {spark_types[column]} in the lake but "
                f"{_delta_type(field.type)} in the Delta table {target} (a type changed, "
                "e.g. widened); export to Delta does not change a column's type, nothing "
                "was changed")
    return [c for c in ours if c not in theirs]


def _delta_type(kind: Any) -> str:
    text = str(kind)
    match = re.fullmatch(r'PrimitiveType\("(.*)"\)', text)
    return match.group(1) if match else text


def _write_full(lake: Lake, pinned: Pinned, target: Path | RemotePath, schema: pa.Schema,
                app_id: str, lower: int | None, delta: Any, added: list[str], file_size: int
                ) -> ExportResult:
    """Write the whole table at the pinned frontier: a new Delta table, or (`delta`) over the
    existing one, in one commit. A keyed table is written in key order (Spark sorts it), so
    each Delta file holds a range of keys and a later merge, which prunes files by their key
    statistics, reads and rewrites only the files whose range holds a changed key."""
    from deltalake import write_deltalake

    mode = "full"
    props = _commit_properties(lake, pinned, app_id, lower, mode)
    previous = 0 if delta is None else int(delta.count())
    with staging_dir(lake.root) as stage:
        rows = full_state(pinned)
        if pinned.state.keyed:
            rows = rows.orderBy(*[f"`{k}`" for k in pinned.state.key])
        reader = staged_batches(rows, schema, stage)
        if delta is None:
            if isinstance(target, Path):  # a store has no directories to make
                target.mkdir(parents=True, exist_ok=True)
            write_deltalake(delta_uri(target), reader, mode="error", name=pinned.name,
                            storage_options=_options(target),
                            description=f"changelake export of lake table {pinned.identity}",
                            target_file_size=file_size, commit_properties=props)
        else:
            write_deltalake(delta, reader, mode="overwrite", target_file_size=file_size,
                            schema_mode="merge" if added else None, commit_properties=props)
    written = _open(target)
    metrics = written.history(1)[0].get("operationMetrics", {})
    before = None if delta is None else _json(frontier_json(lower))
    return ExportResult(pinned.name, KIND, str(target), before,
                        _json(frontier_json(pinned.frontier)), mode,
                        inserted=int(metrics.get("num_added_rows", 0)), deleted=previous,
                        version=written.version())


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _merge(lake: Lake, pinned: Pinned, target: Path | RemotePath, schema: pa.Schema, app_id: str,
           lower: int, delta: Any, added: list[str]) -> ExportResult:
    """Apply the changes in `[lower, frontier)` as one Delta commit."""
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError

    mode = "incremental"
    props = _commit_properties(lake, pinned, app_id, lower, mode)
    keyed = pinned.state.keyed
    frame = keyed_changes(pinned, lower) if keyed else unkeyed_changes(pinned, lower)
    source = frame_to_arrow(frame, schema.append(pa.field("_diff", pa.int64())))
    metrics: dict[str, Any] = {}
    try:
        if source.num_rows == 0:  # the frontier moved, nothing changed: record it
            empty = pa.RecordBatchReader.from_batches(schema, iter(()))
            write_deltalake(delta, empty, mode="append",
                            schema_mode="merge" if added else None, commit_properties=props)
        elif keyed:
            on = " AND ".join(f"(t.{_quoted(k)} IS NOT DISTINCT FROM s.{_quoted(k)})"
                              for k in pinned.state.key)
            metrics = (delta.merge(source, on, source_alias="s", target_alias="t",
                                   merge_schema=bool(added), streamed_exec=False,
                                   commit_properties=props)
                       .when_matched_update_all(predicate='s."_diff" > 0', except_cols=["_diff"])
                       .when_matched_delete(predicate='s."_diff" < 0')
                       .when_not_matched_insert_all(predicate='s."_diff" > 0',
                                                    except_cols=["_diff"])
                       .execute())
        else:
            from changelake.lake.schema import live_columns

            live = set(live_columns(pinned.state.versions))
            same = [f"(t.{_quoted(c)} IS NOT DISTINCT FROM s.{_quoted(c)})"
                    for c in schema.names if c in live and c not in added]
            on = " AND ".join(['(s."_diff" = 0)', *same])
            metrics = (delta.merge(source, on, source_alias="s", target_alias="t",
                                   merge_schema=bool(added), streamed_exec=False,
                                   commit_properties=props)
                       .when_matched_delete()
                       .when_not_matched_insert_all(predicate='s."_diff" = 1',
                                                    except_cols=["_diff"])
                       .execute())
    except CommitFailedError as error:
        raise LakeError(f"export of {pinned.name} to {target}: the Delta commit failed "
                        f"({' '.join(str(error).split())[:200]}); another writer committed "
                        "meanwhile: run the export again") from None
    written = _open(target)
    return ExportResult(pinned.name, KIND, str(target), _json(frontier_json(lower)),
                        _json(frontier_json(pinned.frontier)), mode,
                        inserted=int(metrics.get("num_target_rows_inserted", 0)),
                        updated=int(metrics.get("num_target_rows_updated", 0)),
                        deleted=int(metrics.get("num_target_rows_deleted", 0)),
                        version=written.version())
