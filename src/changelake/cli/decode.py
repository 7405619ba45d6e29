"""`changelake decode`: Materialize CDC messages (files, or a Kafka topic) to their recovered
history as JSON lines."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from changelake.cli.group import main, user_errors
from changelake.cli.options import (
    kafka_options,
    kafka_security_options,
    read_schema,
    since_frontier,
    spark_options,
)
from changelake.cli.set_aside import report_set_aside


def _kafka_target(kafka: str | None, topic: str | None, inputs: tuple[str, ...],
                  what: str) -> bool:
    """Whether the command works on a topic; usage errors for half-given options."""
    if kafka is None:
        if topic is not None:
            raise click.UsageError("--topic needs --kafka BOOTSTRAP")
        return False
    if topic is None:
        raise click.UsageError("--kafka needs --topic T")
    if inputs:
        raise click.UsageError(f"--kafka {what}: no input files as well")
    return True


@main.command()
@click.option("--schema", "schema_path", type=click.Path(exists=True, dir_okay=False,
                                                          path_type=Path),
              help="Materialize CDC Avro schema (JSON) for JSON-lines input.")
@click.option("--lenient", is_flag=True, help="Set bad input aside (reported) and go on.")
@click.option("--since", type=click.IntRange(min=0), default=None,
              help="Resume: start from this frontier instead of 0.")
@click.option("--state", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Resume from this reader state file if it exists; save it at the end "
                   "(local engine).")
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local",
              show_default=True)
@kafka_options("read")
@click.option("--group", default=None, metavar="G",
              help="With --kafka: start at this consumer group's offsets and commit the ends "
                   "read (needs --state).")
@spark_options
@click.argument("inputs", nargs=-1, type=click.Path())
@kafka_security_options
@user_errors
def decode(schema_path: Path | None, lenient: bool, since: int | None, state: Path | None,
           engine: str, kafka: str | None, topic: str | None, schema_registry: str | None,
           group: str | None, master: str, spark_conf: dict, inputs: tuple[str, ...]) -> None:
    """Read Materialize CDC messages (Avro OCF or JSON lines, any order and duplication; or a
    Kafka topic's, with --kafka) and print the recovered history as JSON lines, then the
    frontier.

    \b
    Example:
      changelake decode --schema examples/materialize/schema.json \\
        examples/materialize/log/changefeed.jsonl
    Guide: docs/guides/materialize.md (topics: docs/guides/kafka.md)."""
    schema = read_schema(schema_path)
    out = sys.stdout.buffer
    from_topic = _kafka_target(kafka, topic, inputs, "reads the topic")
    if not from_topic and (group is not None or schema_registry is not None):
        raise click.UsageError("--group and --schema-registry go with --kafka")
    if from_topic:
        if engine == "spark":
            raise click.UsageError("--kafka reads with the local engine (Spark: not yet)")
        from changelake.kafka import decode_topic

        report = decode_topic(kafka, topic, out, schema=schema,  # type: ignore[arg-type]
                              schema_registry=schema_registry, group=group, lenient=lenient,
                              since=since_frontier(since), state=state)
    elif engine == "spark":
        if state is not None:
            raise click.UsageError("--state is for the local engine; Spark resumes with --since")
        from changelake.spark.decode_files import decode_with_spark

        report = decode_with_spark(list(inputs), out, schema=schema, lenient=lenient,
                                   since=since_frontier(since), master=master, conf=spark_conf)
    else:
        from changelake.local import decode_local

        report = decode_local(list(inputs), out, schema=schema, lenient=lenient,
                              since=since_frontier(since), state=state)
    report_set_aside(report.set_aside, report.rejected)
    if report.waiting_for:
        click.echo(f"changelake: note: frontier stopped at {report.frontier.to_json()}: "
                   f"{report.waiting_for}", err=True)
