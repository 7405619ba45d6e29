"""`ingest --follow`: a directory of Materialize CDC files or Kafka topics followed by a
streaming query, and changefeed topics followed in rounds of exactly-once ingests; each runs
until SIGTERM / SIGINT (or --until-idle) and stops once the batch in flight has committed."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from changelake.cli.ingest_sources import check_topics
from changelake.cli.lake_access import open_lake
from changelake.cli.set_aside import report_topic_set_aside


@dataclass(frozen=True)
class TopicFollow:
    """`ingest --follow --kafka`'s topics."""

    bootstrap: str
    topics: tuple[str, ...]
    schema_registry: str | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool = True
    lenient: bool = False
    dead_letter_topic: str | None = None


def _follow_set_aside(kafka: TopicFollow) -> Any:
    """`ingest --follow --kafka --lenient`: each batch's records set aside, reported as
    `ingest --kafka --lenient` reports them (prefixed by the batch), and dead-lettered."""
    from changelake.spark.kafka_set_aside import FollowSetAside

    def report(batch: Any) -> None:
        for item in batch.sample:
            click.echo(f"changelake: batch {batch.batch}: set aside: {item.location}: "
                       f"{item.reason}", err=True)
        more = batch.count - len(batch.sample)
        click.echo(f"changelake: batch {batch.batch}: {batch.count} record(s) set aside "
                   "(lenient mode)" + (f", {more} not listed" if more > 0 else ""), err=True)
        if batch.dead_lettered:
            click.echo(f"changelake: batch {batch.batch}: {batch.dead_lettered} record(s) "
                       f"produced to dead-letter topic {kafka.dead_letter_topic}", err=True)

    return FollowSetAside(kafka.bootstrap, kafka.dead_letter_topic, report=report)


def follow_files_or_topics(lake_dir: Path, metastore_uri: str | None, master: str,
                           spark_conf: dict, ident: Any, columns: tuple[str, ...],
                           schema_path: Path | None, scd2: bool, follow_dir: Path | None,
                           checkpoint: str | None, trigger_seconds: float,
                           max_files_per_trigger: int | None, until_idle: float | None,
                           kafka: TopicFollow | None = None,
                           table_format: str | None = None) -> None:
    """`ingest --follow`: run until SIGTERM / SIGINT (or --until-idle), then exit 0 once the
    batch in flight has committed (see lake/follow.py)."""
    import os
    from contextlib import ExitStack

    from changelake.lake.follow import (
        TOPICS,
        FollowControl,
        directory_source,
        follow,
        topic_source,
        topics_address,
    )

    steps = bool(os.environ.get("CHANGELAKE_FOLLOW_STEPS"))  # every step: for the kill tests

    def progress(batch: int, step: str, result: Any) -> None:
        if result is not None:
            upper = "∞" if result.upper is None else result.upper
            what = ("nothing new" if result.skipped else
                    f"{result.written:,} updates at times [{result.lower}, {upper})")
            click.echo(f"changelake: batch {batch}: committed version {result.version}: {what}",
                       err=True)
        elif steps or step in ("skipped", "waiting"):
            click.echo(f"changelake: batch {batch}: {step}", err=True)

    set_aside = losses = None
    with ExitStack() as cleanup:  # the data-loss report's file, whatever happens
        if kafka is not None:
            check_topics(kafka.bootstrap, kafka.topics, kafka.dead_letter_topic)
            if not kafka.fail_on_data_loss:
                from changelake.spark.kafka_source import LossReport

                losses = cleanup.enter_context(LossReport(
                    lambda line: click.echo(f"changelake: warning: {line}", err=True)))
            messages = topic_source(kafka.bootstrap, kafka.topics, schema=schema_path,
                                    schema_registry=kafka.schema_registry,
                                    max_records_per_trigger=kafka.max_records_per_trigger,
                                    fail_on_data_loss=kafka.fail_on_data_loss,
                                    lenient=kafka.lenient, losses=losses)
            address, kind = topics_address(kafka.bootstrap, kafka.topics), TOPICS
            if kafka.lenient:
                set_aside = _follow_set_aside(kafka)
        else:
            assert follow_dir is not None
            messages = directory_source(follow_dir, schema=schema_path,
                                        max_files_per_trigger=max_files_per_trigger)
            address, kind = str(follow_dir.resolve()), None
        control = FollowControl()
        arm = cleanup.enter_context(_stopped_by_signals(control))
        lake = open_lake(lake_dir, metastore_uri, master, spark_conf, table_format)
        arm()  # over Spark's own SIGINT handler
        try:
            click.echo(f"changelake: following {address} into {ident}", err=True)
            result = follow(lake, ident, messages, address,
                            checkpoint=checkpoint, key=columns, scd2=scd2,
                            trigger_seconds=trigger_seconds, until_idle=until_idle,
                            control=control, progress=progress, set_aside=set_aside,
                            losses=losses, **({"kind": kind} if kind is not None else {}))
        finally:
            lake.spark.stop()
    click.echo(f"changelake: follow {result.table}: stopped after {result.batches} "
               f"micro-batch(es), {result.committed} committed", err=True)


def follow_changefeed(lake_dir: Path, metastore_uri: str | None, master: str,
                      spark_conf: dict, ident: Any, columns: tuple[str, ...], source: str,
                      schema_path: Path | None, scd2: bool, kafka: str | None,
                      topics: tuple[str, ...], group: str | None, trigger_seconds: float,
                      until_idle: float | None, lenient: bool,
                      dead_letter_topic: str | None,
                      table_format: str | None = None) -> None:
    """`ingest --follow --kafka --from debezium|ydb`: rounds of exactly-once ingests until
    SIGTERM / SIGINT (the round in flight commits first) or --until-idle
    (lake/follow_changefeed.py)."""
    from changelake.lake import report
    from changelake.lake.follow import FollowControl
    from changelake.lake.follow_changefeed import follow_changefeed_topics

    assert kafka is not None

    def progress(number: int, read: Any) -> None:
        steps = ", ".join(f"{name} {seconds:.2f}" for name, seconds in read.steps.items())
        click.echo(f"changelake: round {number}: {report.topics_line(read)}; "
                   f"{report.ingest_line(read.ingest)}"
                   + (f"; seconds: {steps}" if steps else ""), err=True)
        report_topic_set_aside(read, dead_letter_topic)

    check_topics(kafka, topics, dead_letter_topic)
    control = FollowControl()
    with _stopped_by_signals(control) as arm:
        lake = open_lake(lake_dir, metastore_uri, master, spark_conf, table_format)
        arm()  # over Spark's own SIGINT handler
        try:
            click.echo(f"changelake: following {','.join(topics)} at {kafka} into {ident}",
                       err=True)
            result = follow_changefeed_topics(
                lake, ident, kafka, list(topics), source=source, key=columns,
                table_schema=schema_path, group=group, scd2=scd2,
                trigger_seconds=trigger_seconds, until_idle=until_idle, control=control,
                progress=progress, lenient=lenient, dead_letter_topic=dead_letter_topic)
        finally:
            lake.spark.stop()
    click.echo(f"changelake: follow {result.table}: stopped after {result.batches} "
               f"round(s), {result.committed} committed", err=True)


@contextmanager
def _stopped_by_signals(control: Any) -> Iterator[Callable[[], None]]:
    """SIGTERM and SIGINT ask `control` (a `FollowControl`) to stop, the batch or round in
    flight committing first; the previous handlers come back at the end. Yields `arm`, which
    sets the handlers again: call it once the lake is open, since starting a SparkContext
    sets its own SIGINT handler (cancel every job, raise KeyboardInterrupt), which would end
    a Ctrl-C'd follow mid-round with exit 1 instead of after the round's commit."""
    def stop(_signal: int, _frame: Any) -> None:
        control.stop()

    def arm() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    arm()
    try:
        yield arm
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
