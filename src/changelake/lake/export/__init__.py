"""`changelake export`: a lake table kept as a table of another format, for the engines that
read those (DuckDB, Trino, Snowflake, pandas, BI tools), incrementally and exactly once.

    export_table(lake, table, kind, target) -> ExportResult  (the CLI's one entry)
    export_to_delta(lake, table, path)      -> ExportResult  (`delta.py`, delta-rs)
    export_to_iceberg(lake, table, uri)     -> ExportResult  (`iceberg.py`, pyiceberg's SQL
                                                              catalog)

Modules: `changes` reads the table out of the lake (its rows at a frontier, the changes between
two frontiers, from one pinned state), `arrow` moves them out of Spark as Arrow without
collecting rows, `result` is what a run reports; one module per target format writes them.
`KINDS` is the one place that maps `--to KIND TARGET` to a writer.
"""

from __future__ import annotations

from pathlib import Path

from changelake.errors import LakeError
from changelake.lake.catalog import Lake
from changelake.lake.export.delta import export_to_delta
from changelake.lake.export.iceberg import export_to_iceberg
from changelake.lake.export.result import ExportResult
from changelake.lake.identifier import TableIdentifier

KINDS = ("delta", "iceberg")
"""The target formats `--to KIND TARGET` names."""


def export_table(lake: Lake, table: str | TableIdentifier, kind: str, target: str | Path,
                 **options: object) -> ExportResult:
    """Export `table` to the `kind` table at `target` (see the writer of each kind)."""
    if kind == "delta":
        if options:
            raise LakeError(f"export to delta takes no options (got {sorted(options)})")
        return export_to_delta(lake, table, target)
    if kind == "iceberg":
        unknown = sorted(set(options) - {"catalog", "identifier", "warehouse"})
        if unknown:
            raise LakeError(f"export to iceberg takes catalog, identifier and warehouse "
                            f"(got {unknown})")
        return export_to_iceberg(lake, table, str(target), **options)  # type: ignore[arg-type]
    raise LakeError(f"unknown export target kind {kind!r}: one of {', '.join(KINDS)}")


__all__ = ["KINDS", "ExportResult", "export_table", "export_to_delta",
           "export_to_iceberg"]
