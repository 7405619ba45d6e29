"""The commands that keep a lake and its machine in order: `compact` (a table's change
segments folded), `metastore` (the lake's metastore served to several Spark processes) and
`jvm-archive` (Spark's classes archived for faster starts)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from changelake.cli.group import main, user_errors
from changelake.cli.lake_access import existing_lake, open_lake, table_and_key
from changelake.cli.options import LakeLocation, checked_time, is_remote, lake_options
from changelake.redact import redact


@main.command()
@lake_options
@click.option("--table", required=True)
@click.option("--since", type=click.IntRange(min=0), default=None,
              help="Advance `since` to this time (default: the table's frontier).")
@user_errors
def compact(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict,
            table: str, since: int | None) -> None:
    """Fold change segments into the buckets they touch and advance `since`.

    \b
    Example:
      changelake compact --lake lake --table shop.orders --since 1500
    Guide: docs/guides/operating.md (Compaction)."""
    from rich.console import Console

    from changelake.lake import api, report

    ident, _ = table_and_key(table)
    since = checked_time(since, "--since")
    existing_lake(lake_dir)
    lake = open_lake(lake_dir, metastore_uri, master, spark_conf, existing=True)
    try:
        with report.progress_bar(Console(stderr=True), f"compact {ident}") as step:
            result = api.compact(lake, ident, since=since, progress=step)
    finally:
        lake.spark.stop()
    click.echo(report.compact_line(result), err=True)


@main.command()
@click.option("--lake", "lake_dir", required=True, type=LakeLocation())
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Port on 127.0.0.1 (default 9083).")
@user_errors
def metastore(lake_dir: Path, port: int | None) -> None:
    """Serve the lake's metastore as a Hive metastore service on 127.0.0.1, so that several
    Spark processes can use the lake at once (--metastore-uri thrift://127.0.0.1:PORT).
    It has no authentication (Hive's metastore protocol has none but Kerberos): every local
    user may connect, change the lake's tables and register code that a Spark process on
    the lake runs as its user. Run it only on a machine (or container) you alone use.

    \b
    Example:
      changelake metastore --lake lake --port 9083 &
      changelake snapshot --lake lake --metastore-uri thrift://127.0.0.1:9083 \\
        --table shop.orders
    Guide: docs/guides/operating.md (The metastore); docs/security.md."""
    from changelake.lake import api

    if is_remote(lake_dir):
        from changelake.errors import LakeError

        raise LakeError(f"lake {redact(str(lake_dir))}: `changelake metastore` serves a local "
                        "lake directory's metastore; a remote lake's is kept per machine "
                        "(CHANGELAKE_STATE_HOME), or give its commands a metastore service "
                        "of your own with --metastore-uri")
    sys.exit(api.metastore(lake_dir, port=port))


@main.command("jvm-archive")
@click.option("--path", "path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write it (default: in changelake's environment, or "
                   "$CHANGELAKE_CLASS_ARCHIVE).")
@click.option("--if-changed", is_flag=True,
              help="Only if there is none, or Java or pyspark changed since it was made.")
@user_errors
def jvm_archive(path: Path | None, if_changed: bool) -> None:
    """Archive the classes Spark loads, so that every later Spark command's JVM maps them
    instead of loading them (seconds off each start). The setup runs it; run it again after
    upgrading Java or pyspark (an archive they no longer match is ignored, not wrong).

    \b
    Example:
      changelake jvm-archive --if-changed
    Docs: docs/getting-started.md (Install)."""
    from changelake.demo.pipeline import warm_up
    from changelake.lake.catalog import lake_session
    from changelake.spark import class_archive
    from changelake.spark.session import check_java, quiet_spark

    target = path or class_archive.archive_path()
    if target is None:
        raise click.UsageError(f"{class_archive.ARCHIVE_ENV} is set empty: give --path")
    java = check_java()
    if if_changed and class_archive.is_current(target, java):
        click.echo(f"changelake: class archive {target}: made for this Java and pyspark",
                   err=True)
        return

    with tempfile.TemporaryDirectory(prefix="changelake-jvm-archive-") as tmp:

        def train(conf: Any) -> None:
            spark = lake_session(Path(tmp) / "lake", "local[*]", conf=dict(conf))
            quiet_spark(spark)
            warm_up(Path(tmp), spark)

        made = class_archive.make(target, train, java)
    click.echo(f"changelake: class archive {made.path}: {made.size / 2**20:,.0f} MiB, made in "
               f"{made.seconds:.0f} s", err=True)
