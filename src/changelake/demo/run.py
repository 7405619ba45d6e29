"""The demo run whole, as `changelake demo` shows it: each part of the package in turn, its
figures as tables on the console and its checks as OK / FAILED lines; a mismatch is a
`DemoMismatch`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from changelake.errors import ChangelakeError


class DemoMismatch(ChangelakeError):
    """A part of the demo whose result differs from its source's truth."""


def run_demo(*, seed: int, updates: int, rows: int, transactions: int, workdir: Path | None,
             protocol_only: bool, postgres: bool, dsn: str | None, master: str,
             spark_conf: dict, lake: Path | str | None = None) -> None:
    """Run the parts (`protocol`; unless `protocol_only`, `pipeline` on a local Spark session
    and, if `postgres`, the `postgres` capture and `debezium` beside it, on one database and
    its workload) in `workdir` (default: a temporary directory), their lake tables in `lake`
    (a directory or a remote URI; default: in `workdir`), printing
    each one's figures and checks. The broker, Debezium and the embedded database are
    stopped in every path."""
    from contextlib import ExitStack

    from rich.console import Console

    from changelake.demo.pipeline import run_pipeline_demo
    from changelake.demo.protocol import run_protocol_demo

    console = Console()
    with tempfile.TemporaryDirectory(prefix="changelake-demo-") as tmp, ExitStack() as stack:
        where = workdir or Path(tmp)
        with console.status("writing, mangling and decoding a CDCv2 log ..."):
            result = run_protocol_demo(where / "cdc", seed=seed, updates=updates)
        print_steps(console, "1. CDCv2 through an at-least-once log (pure Python)", [
            ("changes generated", f"{result.changes:,}"),
            ("distinct updates (consolidated truth)", f"{result.truth:,}"),
            ("messages written by two writers", f"{result.messages_written:,}"),
            ("messages delivered (re-batched, duplicated, shuffled)",
             f"{result.messages_delivered:,}"),
            ("files (Avro OCF and JSON lines)", str(result.files)),
            ("updates recovered", f"{result.recovered:,}"),
            ("final frontier", str(result.frontier.to_json()))])
        if not result.matches:
            raise DemoMismatch("the recovered history differs from the generated one")
        console.print("[bold green]OK[/]: recovered exactly the generated history, once "
                      "each, in time order.")
        if protocol_only:
            return
        lake_dir = where / "pipeline" / "lake" if lake is None else lake
        captured = debezium = None
        if postgres:
            # Before this process opens the lake: the capture processes each hold the lake's
            # embedded metastore while they run.
            from changelake.demo import postgres as pg

            if dsn is None:
                dsn = stack.enter_context(pg.demo_database())
            else:  # a slot left on the user's server would hold its WAL forever
                stack.callback(pg.clean_up, dsn, tables=False)
            spark_args = ["--master", master,
                          *(a for k, v in spark_conf.items() for a in ("--conf", f"{k}={v}"))]
            import shutil

            from changelake.demo.debezium import DebeziumDemo
            from changelake.kafka.broker import KafkaBroker

            for old in ("kafka", "debezium"):  # a --workdir used before: its topics and
                shutil.rmtree(where / old, ignore_errors=True)  # offsets are another run's

            with console.status("starting a Kafka broker (KRaft, one node) ..."):
                broker = stack.enter_context(KafkaBroker(where / "kafka",
                                                         die_with_parent=True))
            debezium = DebeziumDemo(dsn, broker.bootstrap, where / "debezium", seed=seed)
            stack.callback(debezium.kill)  # before the database and broker stop
            with console.status("PostgreSQL: a workload runs while changelake and Debezium "
                                "capture it (each killed once, restarted) ..."):
                captured = pg.run_postgres_capture(
                    dsn, lake_dir, pg.capture_killed_once(
                        seed, spark_args, log=where / "pipeline" / "capture.log"), seed=seed,
                    before_workload=debezium.start)
            with console.status("Debezium: sending the last transaction, stopping ..."):
                debezium.finish()
        from changelake.lake.catalog import lake_session
        from changelake.spark.session import quiet_spark

        with console.status("starting Spark (local, embedded Hive metastore) ..."):
            spark = lake_session(lake_dir, master, conf=spark_conf)
            quiet_spark(spark)
        try:
            with console.status("changefeed -> CDCv2 -> log -> lake, compaction, checks ..."):
                pipeline = run_pipeline_demo(where / "pipeline", spark, seed=seed, rows=rows,
                                             transactions=transactions, lake=lake_dir)
            pg_checks, dbz_checks = [], []
            if captured is not None and debezium is not None:
                from changelake.demo import debezium as dbz

                with console.status("PostgreSQL: checking the lake against the database ..."):
                    pg_checks = pg.check(spark, captured.dsn, lake_dir, seed=seed)
                with console.status("Debezium's topics -> lake tables (ingest --kafka, "
                                    "twice) ..."):
                    dbz_checks = debezium.ingest(spark, lake_dir)
                with console.status("Debezium's tables against the database and the "
                                    "capture's ..."):
                    dbz_checks += dbz.check(spark, captured.dsn, lake_dir, seed=seed)
        finally:
            spark.stop()
        print_steps(console, "2. Debezium -> CDCv2 -> at-least-once log -> lake table (Spark)",
                     [(step.name, step.figure) for step in pipeline.steps])
        checks = list(pipeline.checks)
        for name, passed in pipeline.checks:
            console.print(f"{'[bold green]OK[/]' if passed else '[bold red]FAILED[/]'}: {name}")
        if captured is not None and debezium is not None:
            print_steps(console, "3. PostgreSQL -> changelake capture -> lake tables",
                         captured.steps)
            for c in pg_checks:
                console.print(f"{'[bold green]OK[/]' if c.passed else '[bold red]FAILED[/]'}: "
                              f"{c.name}")
            print_steps(console, "4. The same workload: PostgreSQL -> Debezium -> Kafka broker "
                         "-> ingest --kafka -> lake tables", debezium.steps)
            for c in dbz_checks:
                console.print(f"{'[bold green]OK[/]' if c.passed else '[bold red]FAILED[/]'}: "
                              f"{c.name}")
            checks += [(c.name, c.passed) for c in pg_checks + dbz_checks]
        if captured is not None:
            pg.clean_up(captured.dsn, tables=all(passed for _, passed in checks))
        if not all(passed for _, passed in checks):
            raise DemoMismatch("a lake table differs from its source's truth")


def print_steps(console: Any, title: str, steps: list[tuple[str, str]]) -> None:
    """A part's figures as a table titled `title`."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("step")
    table.add_column("figure", justify="right")
    for step, figure in steps:
        table.add_row(step, figure)
    console.print(table)
