"""`changelake ingest`: files or Kafka topics committed to a lake table exactly once, in one
run or followed (`cli/follow.py`); which options go with which way of reading is the table in
`cli/ingest_sources.py`."""

from __future__ import annotations

from pathlib import Path

import click

from changelake.cli.follow import TopicFollow, follow_changefeed, follow_files_or_topics
from changelake.cli.group import main, user_errors
from changelake.cli.ingest_sources import check_topics, ingest_source
from changelake.cli.lake_access import open_lake, table_and_key
from changelake.cli.options import kafka_security_options, lake_options, table_format_option
from changelake.cli.set_aside import report_topic_set_aside


@main.command()
@lake_options
@click.option("--table", required=True,
              help="NAME or DATABASE.NAME (letters, digits and _, case-insensitive); created "
                   "on first ingest.")
@click.option("--key", default=None, help="Key columns, comma-separated: one row per key "
              "(for a new table, default with --from ydb: the schema's primary key; an "
              "existing one keeps its own).")
@click.option("--from", "source", type=click.Choice(["materialize", "debezium", "ydb"]),
              default="materialize", show_default=True)
@click.option("--schema", "schema_path", type=click.Path(exists=True, dir_okay=False,
                                                          path_type=Path),
              help="Materialize CDC Avro schema (materialize), or YDB table schema (ydb).")
@click.option("--scd2", is_flag=True,
              help="Also keep NAME_history: one row per version of a key with valid_from / "
                   "valid_to (SCD type 2). Takes effect when the table is created.")
@click.option("--close", is_flag=True,
              help="The input is the whole changefeed: commit its last transaction too "
                   "(debezium, ydb; as encode --from --close).")
@click.option("--kafka", "kafka", default=None, metavar="BOOTSTRAP",
              help="Read Kafka topics at these bootstrap servers instead of files, from the "
                   "offsets the table's last commit recorded: Materialize CDC messages "
                   "(Confluent-framed Avro), or with --from debezium|ydb a changefeed's JSON "
                   "records (Debezium: the table's topic, and its transaction topic if any).")
@click.option("--topic", "topics", multiple=True, metavar="T",
              help="With --kafka: a topic to read (repeat it, or separate names by commas).")
@click.option("--schema-registry", "schema_registry", default=None, metavar="URL",
              help="With --kafka: the registry that resolves the frames' schema ids.")
@click.option("--group", default=None, metavar="G",
              help="With --kafka: also commit the positions reached to this consumer group "
                   "(for monitoring; the lake's commit is where a run resumes).")
@click.option("--lenient", is_flag=True,
              help="With --kafka (also --follow --kafka): set bad records (not a frame, "
                   "unknown schema id, corrupt Avro, a tombstone; with --from debezium|ydb "
                   "not JSON, or not a change event) aside, reported on stderr, and go on.")
@click.option("--dead-letter-topic", "dead_letter_topic", default=None, metavar="T",
              help="With --kafka --lenient: also produce each record set aside to topic T (it "
                   "must exist) on the same cluster: value, key and headers as read, plus "
                   "headers changelake.topic, changelake.partition, changelake.offset and "
                   "changelake.error; before the lake commit, so at least once (those headers "
                   "identify a duplicate).")
@click.option("--follow", "following", is_flag=True,
              help="Keep following the INPUT directory of Materialize CDC files (each written "
                   "under a hidden name, then renamed), or the --kafka topics: a streaming "
                   "query commits each micro-batch exactly once, until SIGTERM or SIGINT (the "
                   "batch in flight commits first).")
@click.option("--checkpoint", "checkpoint", default=None, metavar="DIR",
              help="With --follow: the streaming checkpoint, a directory or a URI such as "
                   "s3a://bucket/prefix (default: _follow in the table's directory, on the "
                   "lake's store). Restart with the same one to resume.")
@click.option("--trigger-seconds", type=click.FloatRange(min=0, min_open=True), default=2.0,
              show_default=True, help="With --follow: how often to look for new files.")
@click.option("--max-files-per-trigger", type=click.IntRange(min=1), default=None,
              help="With --follow: at most N new files per micro-batch.")
@click.option("--max-records-per-trigger", type=click.IntRange(min=1), default=None,
              help="With --follow --kafka: at most N new records per micro-batch.")
@click.option("--until-idle", type=click.FloatRange(min=0), default=None, metavar="S",
              help="With --follow: stop (exit 0) once no new file came for S seconds.")
@click.option("--no-fail-on-data-loss", "tolerate_data_loss", is_flag=True,
              help="With --follow --kafka: records deleted (retention) or a topic recreated "
                   "before the follow read them is a warning on stderr (a line per partition), "
                   "and it goes on from the first "
                   "record still held (default: an error naming topic, partition and offsets).")
@table_format_option
@click.argument("inputs", nargs=-1, type=click.Path())
@kafka_security_options
@user_errors
def ingest(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict, table: str,
           key: str | None, source: str, schema_path: Path | None, scd2: bool, close: bool,
           kafka: str | None, topics: tuple[str, ...], schema_registry: str | None,
           group: str | None, lenient: bool, dead_letter_topic: str | None,
           following: bool, checkpoint: str | None,
           trigger_seconds: float, max_files_per_trigger: int | None,
           max_records_per_trigger: int | None, until_idle: float | None,
           tolerate_data_loss: bool, table_format: str | None,
           inputs: tuple[str, ...]) -> None:
    """Decode (or convert) INPUT (or --kafka topics) and commit what is new to a lake table,
    exactly once; or (--follow) keep doing so as files appear in a directory, or records in
    the topics.

    \b
    Example:
      changelake ingest --lake lake --table shop.orders --from debezium --key id \\
        --close examples/orders.jsonl
    Guides: docs/guides/debezium.md, kafka.md, operating.md (--follow)."""
    from rich.console import Console

    from changelake.lake import ingest as lake_ingest
    from changelake.lake import report

    ident, columns = table_and_key(table, key)
    options = {"--kafka": kafka, "--topic": topics, "--schema-registry": schema_registry,
               "--group": group, "--lenient": lenient, "--dead-letter-topic": dead_letter_topic,
               "--follow": following, "--checkpoint": checkpoint,
               "--max-files-per-trigger": max_files_per_trigger,
               "--max-records-per-trigger": max_records_per_trigger,
               "--until-idle": until_idle, "--no-fail-on-data-loss": tolerate_data_loss,
               "--close": close, "--schema": schema_path}
    given = [name for name, value in options.items()
             if value is not None and value is not False and value != ()]
    way = ingest_source(given, len(inputs), source=source)
    if way.changefeed and schema_path is not None:
        from changelake.formats.tableschema import read_table_json

        read_table_json(schema_path)  # a bad table schema is named before Spark starts
    if way.follow and way.changefeed:
        follow_changefeed(lake_dir, metastore_uri, master, spark_conf, ident, columns, source,
                          schema_path, scd2, kafka, tuple(topics), group, trigger_seconds,
                          until_idle, lenient, dead_letter_topic, table_format)
        return
    if way.follow:
        follow_files_or_topics(
            lake_dir, metastore_uri, master, spark_conf, ident, columns, schema_path, scd2,
            Path(inputs[0]) if inputs else None, checkpoint, trigger_seconds,
            max_files_per_trigger, until_idle,
            TopicFollow(kafka, tuple(topics), schema_registry, max_records_per_trigger,
                        not tolerate_data_loss, lenient, dead_letter_topic)
            if kafka is not None else None, table_format)
        return
    if way.kafka:
        assert kafka is not None
        check_topics(kafka, topics, dead_letter_topic)
    lake = open_lake(lake_dir, metastore_uri, master, spark_conf, table_format)
    try:
        with report.progress_bar(Console(stderr=True), f"ingest {ident}") as step:
            if way.kafka and way.changefeed:
                from changelake.lake.kafka_changefeed import ingest_changefeed_topics

                read = ingest_changefeed_topics(lake, ident, kafka, list(topics),
                                                source=source, key=columns,
                                                table_schema=schema_path, close=close,
                                                group=group, scd2=scd2, progress=step,
                                                lenient=lenient,
                                                dead_letter_topic=dead_letter_topic)
                result = read.ingest
            elif way.kafka:
                from changelake.lake.kafka_ingest import ingest_topics

                read = ingest_topics(lake, ident, kafka, list(topics), key=columns,
                                     schema=schema_path, schema_registry=schema_registry,
                                     group=group, scd2=scd2, progress=step, lenient=lenient,
                                     dead_letter_topic=dead_letter_topic)
                result = read.ingest
            else:
                result = lake_ingest.ingest(lake, ident, list(inputs), key=columns,
                                         source=source, schema=schema_path, progress=step,
                                         scd2=scd2, close=close)
    finally:
        lake.spark.stop()
    if way.kafka:
        click.echo(f"changelake: {report.topics_line(read)}", err=True)
        report_topic_set_aside(read, dead_letter_topic)
    click.echo(report.ingest_line(result), err=True)
    waiting = report.waiting_line(result)
    if waiting is not None:
        click.echo(f"changelake: {waiting}", err=True)

