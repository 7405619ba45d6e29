"""`changelake capture`: a database's changes captured into lake tables or Materialize CDC
logs (`capture postgres`: a PostgreSQL publication through a pgoutput slot)."""

from __future__ import annotations

from pathlib import Path

import click

from changelake.cli.group import main, user_errors
from changelake.cli.lake_access import open_lake
from changelake.cli.options import LakeLocation, spark_options, table_format_option


@main.group()
def capture() -> None:
    """Capture a database's changes into lake tables or Materialize CDC logs (exactly once, one
    time domain).

    \b
    Example:
      changelake capture postgres --dsn 'host=db dbname=shop user=capture' \\
        --publication shop_pub --slot changelake_shop --create-slot --lake lake
    Guide: docs/guides/postgres.md."""


@capture.command("postgres")
@spark_options
@click.option("--metastore-uri", default=None, metavar="thrift://HOST:PORT",
              help="With --lake: a Hive metastore service (default: the lake's embedded "
                   "Derby).")
@click.option("--lake", "lake_dir", default=None, type=LakeLocation(),
              help="Commit into lake tables in this lake directory or URI (Spark).")
@click.option("--out", "out_dir", default=None,
              type=click.Path(file_okay=False, path_type=Path),
              help="Write Materialize CDC logs here, one directory per table (no Spark).")
@click.option("--dsn", required=True, envvar="CHANGELAKE_DSN", show_envvar=True,
              help="libpq connection string of the database (its password from PGPASSWORD, "
                   "~/.pgpass, PGPASSFILE or PGSERVICE, not the command line).")
@click.option("--publication", required=True, help="The publication naming the tables.")
@click.option("--slot", required=True, help="The logical replication slot (pgoutput).")
@click.option("--tables", default=None,
              help="Only these tables of the publication, comma-separated (schema.table).")
@click.option("--create-slot", is_flag=True,
              help="Create the slot if it is missing (and take the initial snapshot).")
@click.option("--snapshot", type=click.Choice(["initial", "never"]), default="initial",
              show_default=True, help="Read the tables' rows when the slot is created.")
@click.option("--until-idle", type=click.FloatRange(min=0), default=None, metavar="S",
              help="Stop once no transaction arrived for S seconds (default: run on).")
@click.option("--max-txns", type=click.IntRange(min=1), default=None, metavar="N",
              help="Stop after N transactions.")
@table_format_option
@user_errors
def capture_postgres(lake_dir: Path | None, out_dir: Path | None, metastore_uri: str | None,
                     master: str, spark_conf: dict, dsn: str, publication: str, slot: str,
                     tables: str | None, create_slot: bool, snapshot: str,
                     until_idle: float | None, max_txns: int | None,
                     table_format: str | None) -> None:
    """Stream a PostgreSQL publication through a pgoutput slot into lake tables (--lake) or
    Materialize CDC logs (--out) named schema.table, each transaction at its commit LSN.

    The password comes from PGPASSWORD, ~/.pgpass, PGPASSFILE or PGSERVICE, never the DSN.

    \b
    Example:
      changelake capture postgres --dsn 'host=db dbname=shop user=capture' \\
        --publication shop_pub --slot changelake_shop --create-slot --lake lake
    Guide: docs/guides/postgres.md."""
    if (lake_dir is None) == (out_dir is None):
        raise click.UsageError("give exactly one of --lake DIR (lake tables) and --out DIR "
                               "(Materialize CDC logs)")
    if out_dir is not None and metastore_uri is not None:
        raise click.UsageError("--metastore-uri is for --lake; --out writes files only")
    from changelake.capture.postgres.capture import Capture, CaptureOptions
    from changelake.capture.postgres.source import Source

    options = CaptureOptions(dsn, publication, slot,
                             tables=tuple(tables.split(",")) if tables else None,
                             create_slot=create_slot, snapshot=snapshot,  # type: ignore[arg-type]
                             until_idle=until_idle, max_txns=max_txns)
    if out_dir is not None:  # no Spark at all
        from changelake.capture.postgres.to_log import LogSink

        result = Capture(LogSink(out_dir, options), options).run()
        where = f"logs under {out_dir}"
    else:
        from changelake.capture.postgres.to_lake import LakeCapture

        assert lake_dir is not None
        # The database's refusals (no connection, no publication, a table without a key)
        # come before the lake's Spark and metastore start: seconds, not half a minute.
        Source(options.dsn, options.publication, options.slot, tables=options.tables).close()
        lake = open_lake(lake_dir, metastore_uri, master, spark_conf, table_format)
        try:
            result = LakeCapture(lake, options).run()
        finally:
            lake.spark.stop()
        where = "tables"
    snapshot_rows = sum(result.snapshot_rows.values())
    if result.joined:
        click.echo(f"tables added to publication {publication} joined the capture, each "
                   f"with its snapshot: {', '.join(result.joined)}", err=True)
    click.echo(f"captured {result.transactions} transactions into "
               f"{len(result.tables)} {where} ({', '.join(result.tables)}), "
               f"{snapshot_rows} snapshot rows, {result.batches} commits; "
               f"frontier {result.frontier} (every transaction before it is in every "
               f"table); stopped: {result.stopped}",
               err=True)
