"""`changelake demo`: its options; the demo itself is `changelake.demo.run`."""

from __future__ import annotations

from pathlib import Path

import click

from changelake.cli.group import main, user_errors
from changelake.cli.lake_access import remote_lake_held
from changelake.cli.options import LakeLocation, spark_options


@main.command()
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--updates", type=click.IntRange(min=1), default=20_000, show_default=True,
              help="Size of the protocol demo's history.")
@click.option("--rows", type=click.IntRange(min=1), default=200, show_default=True,
              help="Rows in the pipeline demo's snapshot.")
@click.option("--transactions", type=click.IntRange(min=1), default=300, show_default=True,
              help="Transactions in the pipeline demo's changefeed.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to keep the demo's files and lake (default: a temporary directory).")
@click.option("--lake", "lake", type=LakeLocation(), default=None,
              help="The demo's lake, which must hold no lake yet: a directory, or a Hadoop "
                   "FileSystem URI such as s3a://BUCKET/PREFIX (credentials and endpoint as "
                   "for every lake command: docs/guides/storage.md). Default: "
                   "WORKDIR/pipeline/lake.")
@click.option("--protocol-only", is_flag=True, help="Skip the Spark and lake parts.")
@click.option("--postgres/--no-postgres", default=True, show_default=True,
              help="Run the PostgreSQL parts (an embedded server): changelake's own "
                   "capture and Debezium's, through a Kafka broker.")
@click.option("--dsn", default=None,
              help="Run the PostgreSQL parts on this database (PostgreSQL 12+, wal_level = "
                   "logical) instead of an embedded server; its tables, publications and "
                   "slots are dropped after a passing run. Its password from PGPASSWORD, "
                   "~/.pgpass, PGPASSFILE or PGSERVICE, not the command line.")
@spark_options
@user_errors
def demo(seed: int, updates: int, rows: int, transactions: int, workdir: Path | None,
         lake: Path | str | None, protocol_only: bool, postgres: bool, dsn: str | None, master: str,
         spark_conf: dict) -> None:
    """Run the pipeline on generated data and check it: a mangled CDCv2 log decoded exactly;
    a Debezium changefeed through CDCv2, an at-least-once log, exactly-once lake ingest,
    compaction and AS OF reads, on local Spark with the lake's embedded metastore; an
    embedded PostgreSQL captured into lake tables while a workload runs, the capture killed
    once and restarted, every table and a cross-table invariant checked; and beside it, on
    the same workload, real Debezium writing to a real Kafka broker (Debezium killed once and
    restarted), its topics ingested into lake tables that must equal the database and the
    capture's tables, now and AS OF several transactions.

    \b
    Example (about 8 minutes on 2 cores; --protocol-only: seconds):
      changelake demo
      changelake demo --no-postgres --lake s3a://my-bucket/changelake-demo
    Docs: docs/getting-started.md (The demo)."""
    from changelake.demo.run import run_demo

    if lake is not None and not protocol_only:
        _refuse_a_lake(lake)
    run_demo(seed=seed, updates=updates, rows=rows, transactions=transactions,
             workdir=workdir, lake=lake, protocol_only=protocol_only, postgres=postgres, dsn=dsn,
             master=master, spark_conf=spark_conf)


def _refuse_a_lake(lake: Path | str) -> None:
    """The demo's checks count on tables of their own: a `--lake` that already holds a lake
    (its `tables`) is refused before anything runs. A remote lake `remote_lake_held` cannot
    ask is not asked."""
    from changelake.errors import ChangelakeError

    held = (lake / "tables").exists() if isinstance(lake, Path) else remote_lake_held(lake)
    if held:
        raise ChangelakeError(f"demo: --lake {lake} already holds a lake; give the demo a "
                              "directory or prefix of its own")
