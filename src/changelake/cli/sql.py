"""`changelake sql`: the lake's tables served over JDBC/ODBC (Spark's Thrift server), with a
table function per table for AS OF reads."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from changelake.cli.group import main, user_errors
from changelake.cli.lake_access import existing_lake
from changelake.cli.options import lake_options


@main.command("sql")
@lake_options
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port on 127.0.0.1 (0: a free one, printed).")
@click.option("--password-file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="FILE",
              help="Ask every client for the password on FILE's first line (a file of "
                   "yours, mode 0600); without it, anyone on this machine may connect and "
                   "run any Spark SQL as you.")
@user_errors
def sql_endpoint(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict,
                 port: int, password_file: Path | None) -> None:
    """Serve the lake's tables over JDBC/ODBC (Spark's Thrift server, HiveServer2's protocol)
    on 127.0.0.1 only, until Ctrl-C or SIGTERM: `beeline -u jdbc:hive2://127.0.0.1:PORT`.
    Without --password-file every local user may connect and run any SQL as you (reading
    your files, running programs): on a shared machine, give one
    (`beeline -u ... -n any -w FILE`).

    \b
    AS OF: per table, a SQL table function gives exactly `snapshot --as-of T`:
      SELECT * FROM orders_as_of(1200)        -- table default.orders
      SELECT * FROM shop_orders_as_of(1200)   -- table shop.orders
    A time outside the table's [since, frontier) is refused with snapshot's error. Tables
    ingested with --scd2 also have their NAME_history view.

    \b
    Example:
      changelake sql --lake lake --port 10000
    Guide: docs/guides/sql.md; docs/security.md."""
    from changelake.lake.sql_endpoint import serve_lake

    existing_lake(lake_dir)
    sys.exit(serve_lake(lake_dir, port, master=master, metastore_uri=metastore_uri,
                        conf=spark_conf, password_file=password_file, out=sys.stdout,
                        err=sys.stderr))
