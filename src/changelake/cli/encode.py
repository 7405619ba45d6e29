"""`changelake encode`: changes (CDCv2 JSON lines, or a Debezium / YDB changefeed from files or
topics) to Materialize CDC messages on stdout, in an Avro file or on a Kafka topic."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from changelake.cli.group import main, user_errors
from changelake.cli.options import kafka_security_options, read_schema
from changelake.cli.set_aside import report_set_aside


@main.command()
@click.option("--schema", "schema_path", type=click.Path(exists=True, dir_okay=False,
                                                          path_type=Path),
              help="Materialize CDC Avro schema (JSON) of the output.")
@click.option("--close", is_flag=True, help="Close the stream when the input ends.")
@click.option("--avro", type=click.Path(dir_okay=False, path_type=Path),
              help="Write an Avro object container file here instead of JSON lines.")
@click.option("--from", "source", type=click.Choice(["materialize", "debezium", "ydb"]),
              default="materialize", show_default=True,
              help="Input: CDCv2 JSON-lines changes, or a Debezium / YDB changefeed.")
@click.option("--key", default=None, help="Key columns, comma-separated (changefeeds).")
@click.option("--table-schema", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YDB table schema (JSON: columns and primary_key).")
@click.option("--batch-size", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--lenient", is_flag=True, help="Set bad input aside (reported) and go on.")
@click.option("--to-kafka", "kafka", default=None, metavar="BOOTSTRAP",
              help="Produce the messages to a Kafka topic (Confluent-framed Avro) at these "
                   "bootstrap servers, host:port,... (--kafka/--topic name a source topic).")
@click.option("--to-topic", "topic", default=None, metavar="T",
              help="The Kafka topic to produce to.")
@click.option("--schema-registry", "schema_registry", default=None, metavar="URL",
              help="With --to-kafka: the Confluent schema registry the schema id comes from "
                   "(subject T-value).")
@click.option("--transactional-id", default=None, metavar="ID",
              help="With --to-kafka: a transactional producer, one transaction per progress "
                   "statement.")
@click.option("--kafka", "source_kafka", default=None, metavar="BOOTSTRAP",
              help="With --from debezium|ydb: read the changefeed from Kafka topics at these "
                   "bootstrap servers (a bounded read: every partition up to its end now).")
@click.option("--topic", "source_topics", multiple=True, metavar="T",
              help="With --kafka: a changefeed topic; repeat it or separate names by commas "
                   "for a table's topic and the transaction metadata topic.")
@click.option("--group", default=None, metavar="G",
              help="With --kafka: once the output is complete, record in this consumer "
                   "group how far each partition was read (for monitoring: every run converts "
                   "the topics whole; ingest --kafka --from debezium|ydb resumes from offsets).")
@click.argument("inputs", nargs=-1, type=click.Path())
@kafka_security_options
@user_errors
def encode(schema_path: Path | None, close: bool, avro: Path | None, source: str,
           key: str | None, table_schema: Path | None, batch_size: int, lenient: bool,
           kafka: str | None, topic: str | None, schema_registry: str | None,
           transactional_id: str | None, source_kafka: str | None,
           source_topics: tuple[str, ...], group: str | None, inputs: tuple[str, ...]) -> None:
    """Write Materialize CDC messages from changes: JSON lines {"data":..,"time":..,"diff":..}
    with {"finished": T} marks, or a Debezium / YDB changefeed (--from; files, or topics with
    --kafka); to stdout, an Avro file (--avro) or a Kafka topic (--to-kafka).

    \b
    Example:
      changelake encode --from debezium --key id --close examples/orders.jsonl \\
        > orders.cdc.jsonl
    Guides: docs/guides/debezium.md, ydb.md, materialize.md."""
    out = sys.stdout.buffer
    if source_kafka is not None or source_topics or group is not None:
        _check_changefeed_topics(source, source_kafka, source_topics, group, inputs)
    if source != "materialize" and (source_kafka is not None or kafka is not None):
        _encode_changefeed(out, schema_path, close, avro, source, key, table_schema, lenient,
                           kafka, topic, schema_registry, transactional_id, source_kafka,
                           source_topics, inputs, group)
        return
    if kafka is not None or topic is not None:
        _encode_to_topic(schema_path, close, avro, source, batch_size, lenient, kafka, topic,
                         schema_registry, transactional_id, inputs)
        return
    if schema_registry is not None or transactional_id is not None:
        raise click.UsageError("--schema-registry and --transactional-id go with --to-kafka")
    if source != "materialize":
        from changelake.local import encode_changefeed_job

        report = encode_changefeed_job(
            list(inputs), out, source=source,
            keys=key.split(",") if key else None, table_schema=table_schema, close=close,
            lenient=lenient, schema=read_schema(schema_path), avro=avro)
        report_set_aside(report.set_aside, [])
        return
    if schema_path is None:
        raise click.UsageError("--schema is required with --from materialize")
    from changelake.local import encode_local

    report = encode_local(list(inputs), out, schema=read_schema(schema_path), close=close,
                          avro=avro, batch_size=batch_size, lenient=lenient,
                          stdin=None if inputs else sys.stdin.buffer)
    report_set_aside(report.set_aside, [])
    if report.unfinished:
        click.echo(f"changelake: note: {report.unfinished} change(s) at unfinished times were "
                   "not written; add {\"finished\": T} lines or --close", err=True)


def _check_changefeed_topics(source: str, kafka: str | None, topics: tuple[str, ...],
                             group: str | None, inputs: tuple[str, ...]) -> None:
    """Usage errors of `encode --kafka/--topic/--group` (changefeed topics as the source)."""

    if kafka is None:
        raise click.UsageError("--topic and --group go with --kafka BOOTSTRAP")
    if not topics:
        raise click.UsageError("--kafka needs --topic T")
    if source == "materialize":
        raise click.UsageError("encode --kafka reads a changefeed (--from debezium|ydb); a "
                               "topic of CDCv2 messages is read by decode --kafka")
    if inputs:
        raise click.UsageError("--kafka reads the topics: no input files as well")


def _encode_changefeed(out: Any, schema_path: Path | None, close: bool, avro: Path | None,
                       source: str, key: str | None, table_schema: Path | None, lenient: bool,
                       kafka: str | None, topic: str | None, schema_registry: str | None,
                       transactional_id: str | None, source_kafka: str | None,
                       source_topics: tuple[str, ...], inputs: tuple[str, ...],
                       group: str | None = None) -> None:
    """`encode --from debezium|ydb` reading files or topics (--kafka) and writing to stdout,
    an Avro file or a topic (--to-kafka); `group` records how far the topics were read."""
    from changelake.convert import ChangefeedEncoder
    from changelake.formats.materialize import expand_paths
    from changelake.local import load_table_schema, write_messages

    keys = key.split(",") if key else None
    parsed_schema = load_table_schema(table_schema)
    kept: list[Any] = []  # the report holds set-aside input too; this keeps it off the log
    feed: Any
    if source_kafka is not None:
        from changelake.kafka import TopicFeed

        feed = TopicFeed(source_kafka, list(source_topics), source=source,  # type: ignore[arg-type]
                         keys=keys, table_schema=parsed_schema, close=close, lenient=lenient,
                         set_aside=kept.append)
        report = feed.report
    else:
        if not inputs:
            raise click.UsageError("--from debezium|ydb needs input files or --kafka/--topic")
        feed = ChangefeedEncoder(expand_paths(list(inputs)), source=source,  # type: ignore[arg-type]
                                 keys=keys, table_schema=parsed_schema, close=close,
                                 lenient=lenient, set_aside=kept.append)
        report = feed.report
    schema = read_schema(schema_path)
    if kafka is not None or topic is not None:
        if kafka is None or topic is None:
            raise click.UsageError("--to-kafka BOOTSTRAP and --to-topic T go together")
        if avro is not None:
            raise click.UsageError("--avro and --to-kafka are two destinations: give one")
        if schema is None:
            raise click.UsageError("--to-kafka needs the schema of the messages (--schema)")
        from changelake.kafka import write_topic

        sink = write_topic(feed.messages(), bootstrap=kafka, topic=topic, schema=schema,
                           schema_registry=schema_registry, transactional_id=transactional_id)
        written = sink.messages
    else:
        if schema_registry is not None or transactional_id is not None:
            raise click.UsageError("--schema-registry and --transactional-id go with "
                                   "--to-kafka")
        written = write_messages(feed.messages(), schema, avro=avro, out=out)
    report_set_aside(report.set_aside, [])
    if group is not None:  # the output is complete: only now
        feed.commit_group(group)
    if source_kafka is not None:
        skipped = ", ".join(f"{n} {kind}(s)" for kind, n in sorted(report.skipped.items()))
        click.echo(f"changelake: read {feed.read.records} record(s) of topic(s) "
                   f"{', '.join(feed.topics)}: {report.changes} change(s), "
                   f"{report.stats.duplicates + report.stats.late} replay(s), "
                   f"skipped {skipped or 'none'}; wrote {written} message(s)", err=True)


def _encode_to_topic(schema_path: Path | None, close: bool, avro: Path | None, source: str,
                     batch_size: int, lenient: bool, kafka: str | None, topic: str | None,
                     schema_registry: str | None, transactional_id: str | None,
                     inputs: tuple[str, ...]) -> None:
    """`encode --to-kafka`: the messages `encode` writes, produced to a topic."""
    if kafka is None or topic is None:
        raise click.UsageError("--to-kafka BOOTSTRAP and --to-topic T go together")
    if avro is not None:
        raise click.UsageError("--avro and --to-kafka are two destinations: give one")
    if source != "materialize":
        raise click.UsageError("--to-kafka writes CDCv2 changes (--from materialize); "
                               "changefeeds to a topic: not yet")
    if schema_path is None:
        raise click.UsageError("--to-kafka needs the schema of the messages (--schema)")
    from changelake.kafka import write_topic
    from changelake.local import EncodeReport, encode_messages

    encoded = EncodeReport()
    schema = read_schema(schema_path)
    messages = encode_messages(list(inputs), schema=schema, close=close, batch_size=batch_size,
                               lenient=lenient, stdin=None if inputs else sys.stdin.buffer,
                               report=encoded)
    report = write_topic(messages, bootstrap=kafka, topic=topic, schema=schema,
                         schema_registry=schema_registry, transactional_id=transactional_id)
    report_set_aside(encoded.set_aside, [])
    click.echo(f"changelake: wrote {report.messages} message(s) to topic {topic} "
               f"({len(report.by_partition)} partition(s), schema id {report.schema_id})",
               err=True)
    if encoded.unfinished:
        click.echo(f"changelake: note: {encoded.unfinished} change(s) at unfinished times were "
                   "not written; add {\"finished\": T} lines or --close", err=True)
