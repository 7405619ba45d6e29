"""The commands that read a lake: `snapshot` (a table's rows, AS OF a time), `changes` (its
change feed), `status` (tables and source databases) and `export` (to Delta or Iceberg);
`snapshot` and `status` read without a JVM where they can (the Arrow path)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from changelake.cli.group import main, user_errors
from changelake.cli.lake_access import existing_lake, open_lake, remote_engine, table_and_key
from changelake.cli.options import (
    checked_time,
    engine_option,
    kafka_security_options,
    lake_options,
)


@main.command()
@lake_options
@click.option("--table", required=True)
@click.option("--as-of", type=click.IntRange(min=0), default=None,
              help="The table as it was at this time (from its `since` to its frontier).")
@click.option("--history", is_flag=True,
              help="SCD type 2: every version of every key, with valid_from / valid_to.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "table"]), default=None,
              help="Default: table on a terminal, jsonl otherwise.")
@engine_option
@user_errors
def snapshot(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict,
             table: str, as_of: int | None, history: bool, fmt: str | None,
             engine: str) -> None:
    """Print the rows of a lake table now, AS OF a time, or its SCD type 2 history.

    \b
    Example:
      changelake snapshot --lake lake --table shop.orders --as-of 1250 --format csv
    Docs: docs/getting-started.md (the tour), docs/concepts.md (AS OF)."""
    if history and as_of is not None:
        raise click.UsageError("--history and --as-of are exclusive")
    from changelake.lake import report

    fmt = fmt or ("table" if sys.stdout.isatty() else "jsonl")
    ident, _ = table_and_key(table)
    as_of = checked_time(as_of, "--as-of")
    existing_lake(lake_dir)
    engine = remote_engine(lake_dir, engine)
    if engine != "spark":
        read = _arrow_snapshot(lake_dir, ident, as_of, history, engine)
        if read is not None:
            columns, rows = read
            report.write_snapshot(rows, columns, fmt, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            return
    from changelake.lake import api

    lake = open_lake(lake_dir, metastore_uri, master, spark_conf, existing=True)
    try:
        columns = api.snapshot_columns(lake, ident, history=history)
        report.write_snapshot(api.snapshot(lake, ident, as_of=as_of, history=history),
                              columns, fmt, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    finally:
        lake.spark.stop()


def _arrow_snapshot(lake_dir: Path, ident: Any, as_of: int | None, history: bool,
                    engine: str) -> tuple[list[str], Any] | None:
    """`snapshot` on the Arrow path (see lake/arrow.py): (columns, rows), or None when `auto`
    leaves the read to Spark. Everything is read and merged before anything is printed, so
    a fall-back to Spark has printed nothing."""
    from changelake.lake import arrow

    try:
        state = arrow.committed_state(lake_dir, ident)
        if engine == "auto" and not arrow.within_limits(state, lake_dir):
            return None
        if as_of is not None and state.origin is not None:  # only then: `sources` imports
            # pyspark's modules (no JVM)
            from changelake.lake.sources import check_as_of

            check_as_of(state, as_of, lambda: arrow.lake_states(lake_dir))
        if history:
            result = arrow.Merged.once(arrow.read_history(lake_dir, ident, state=state))
        else:
            result = arrow.merged(lake_dir, ident, as_of, state=state)
    except arrow.ArrowUnavailable:
        if engine == "arrow":
            raise
        return None
    return result.rows.column_names, arrow.plain_rows(result)


@main.command()
@lake_options
@click.option("--table", required=True)
@click.option("--since", type=click.IntRange(min=0), required=True,
              help="The first time of the stream (not before the table's `since`).")
@click.option("--until", type=click.IntRange(min=0), default=None,
              help="The stream ends before this time (default: the table's frontier; a "
                   "closed table's stream closes).")
@click.option("--snapshot", is_flag=True,
              help="Start with the table's state at --since as updates at that time "
                   "(progress from 0), then the changes after it.")
@click.option("--avro", type=click.Path(dir_okay=False, path_type=Path),
              help="Write an Avro object container file here instead of JSON lines.")
@click.option("--history", is_flag=True,
              help="Print the history decoded, as `decode` prints it, instead of messages.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--schema-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the stream's Materialize CDC schema here (JSON lines carry "
                   "none: `decode --schema FILE` reads them with it).")
@user_errors
def changes(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict,
            table: str, since: int, until: int | None, snapshot: bool, avro: Path | None,
            history: bool, batch_size: int, schema_out: Path | None) -> None:
    """Print a lake table's changes in [--since, --until) as Materialize CDC messages (JSON
    lines like `encode`'s, or --avro FILE) with exact progress statements: a change feed.

    \b
    Example:
      changelake changes --lake lake --table shop.orders --since 1800 \\
        --schema-out changes.schema.json > changes.jsonl
    Guide: docs/guides/materialize.md (A table's change feed)."""
    if history and avro is not None:
        raise click.UsageError("--history prints decoded lines; it does not go with --avro")
    from changelake.lake.changes import write_changes

    ident, _ = table_and_key(table)
    since = checked_time(since, "--since")
    until = checked_time(until, "--until")
    existing_lake(lake_dir)
    lake = open_lake(lake_dir, metastore_uri, master, spark_conf, existing=True)
    try:
        result = write_changes(lake.table(ident), sys.stdout.buffer, since=since,
                               until=until, snapshot=snapshot, avro=avro, history=history,
                               batch_size=batch_size, schema_out=schema_out)
    finally:
        lake.spark.stop()
    click.echo(result.line(), err=True)


@main.command()
@lake_options
@click.option("--table", required=True)
@click.option("--to", "to", required=True, nargs=2, metavar="KIND TARGET",
              type=(click.Choice(["delta", "iceberg"]), str),
              help="The table to keep: `delta PATH` (a Delta table directory) or `iceberg URI` "
                   "(a pyiceberg SQL catalog: sqlite:////abs/catalog.db, or any SQLAlchemy "
                   "URL with --warehouse).")
@click.option("--catalog", default=None, metavar="NAME",
              help="iceberg: the catalog's name (default changelake).")
@click.option("--identifier", default=None, metavar="NAMESPACE.NAME",
              help="iceberg: the Iceberg table (default: the lake table's DATABASE.NAME).")
@click.option("--warehouse", default=None, metavar="DIR",
              help="iceberg: where data files go (default: beside a sqlite catalog's file, "
                   "CATALOG-warehouse).")
@user_errors
def export(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict,
           table: str, to: tuple[str, str], catalog: str | None, identifier: str | None,
           warehouse: str | None) -> None:
    """Export a lake table to a Delta or an Iceberg table: the whole table on the first run,
    then only the changes since the last run, exactly once (the frontier is in the target's
    commits).

    \b
    Example:
      changelake export --lake lake --table shop.orders --to delta orders_delta
    Guide: docs/guides/export.md."""
    from changelake.lake.export import export_table

    kind, target = to
    options = {k: v for k, v in (("catalog", catalog), ("identifier", identifier),
                                 ("warehouse", warehouse)) if v is not None}
    if kind == "delta" and options:
        raise click.UsageError(f"--{', --'.join(options)}: for --to iceberg only")
    if kind == "iceberg":  # a catalog that cannot be opened is refused before Spark starts
        from changelake.lake.export.iceberg import check_catalog

        check_catalog(target, warehouse)
    ident, _ = table_and_key(table)
    existing_lake(lake_dir)
    lake = open_lake(lake_dir, metastore_uri, master, spark_conf, existing=True)
    try:
        result = export_table(lake, ident, kind, target, **options)
    finally:
        lake.spark.stop()
    click.echo(result.line(), err=True)


@main.command()
@lake_options
@click.option("--format", "fmt", type=click.Choice(["table", "jsonl"]), default=None,
              help="Default: table on a terminal, jsonl otherwise.")
@click.option("--live", is_flag=True,
              help="Also ask the servers the lake's metadata names (source databases, Kafka "
                   "clusters) for their lag, with your credentials (.pgpass, PGPASSWORD, ...).")
@engine_option
@kafka_security_options
@user_errors
def status(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict,
           fmt: str | None, live: bool, engine: str) -> None:
    """Per table: frontier, since, rows, segments, files, bytes, last commit. Per source
    database of captured tables: its tables, their consistent frontier (time and LSN), and,
    with --live, its slot's lag ("unreachable" with the reason if it cannot be asked); per
    table ingested from Kafka, its offsets and, with --live, their lag. Without --live no
    server the lake names is contacted: "not asked (--live)" where the lag would be.

    jsonl: a line per table (with "name"), then a line per source database (with "database").

    \b
    Example:
      changelake status --lake lake --format jsonl
    Guide: docs/guides/operating.md (Status)."""
    import orjson

    from changelake.lake import report

    fmt = fmt or ("table" if sys.stdout.isatty() else "jsonl")
    existing_lake(lake_dir)
    engine = remote_engine(lake_dir, engine)
    result = _arrow_status(lake_dir, engine, live) if engine != "spark" else None
    if result is None:
        from changelake.lake import api

        lake = open_lake(lake_dir, metastore_uri, master, spark_conf, existing=True)
        try:
            result = api.lake_status(lake, live=live)
        finally:
            lake.spark.stop()
    if fmt == "jsonl":
        for item in [*result.tables, *result.sources]:
            sys.stdout.buffer.write(orjson.dumps(item.to_json()) + b"\n")
    else:
        console = report.table_console()
        console.print(report.status_table(result.tables))
        offsets = report.offsets_table(result.tables)
        if offsets is not None:
            console.print(offsets)
        followed = report.follow_table(result.tables)
        if followed is not None:
            console.print(followed)
        if result.sources:
            console.print(report.sources_table(result.sources))


def _kafka_lag(state: Any, live: bool) -> list[dict] | None:
    """A table's Kafka lag for `status`, asked of its cluster when `live` (None: not ingested
    from Kafka)."""
    if state.offsets is None or state.offsets.kind != "kafka":
        return None
    from changelake.kafka.lag import offsets_status

    return offsets_status(state.offsets, frontier=state.upper, live=live)


def _arrow_status(lake_dir: Path, engine: str, live: bool) -> Any:
    """`status` on the Arrow path: a `LakeStatus`, or None when `auto`
    leaves it to Spark (a table whose committed version only the metastore knows, or a large
    one: all tables are read by one engine). Source databases of captured tables are asked
    as on Spark (`sources.statuses`: pyspark's modules are imported for them, no JVM)."""
    from changelake.lake import arrow

    try:
        states = arrow.lake_states(lake_dir)
        if engine == "auto" and not all(arrow.within_limits(s, lake_dir) for s in states):
            return None
        tables = [arrow.table_status(lake_dir, s, offsets=_kafka_lag(s, live), live=live)
                  for s in states]
    except arrow.ArrowUnavailable:
        if engine == "arrow":
            raise
        return None
    sources: list = []
    if any(s.origin is not None for s in states):
        from changelake.lake.sources import statuses

        sources = statuses(states, live=live)
    return arrow.LakeStatus(tables, sources)
