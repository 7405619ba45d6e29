"""The `changelake` command line. Commands only: the work lives in the modules they call.

Errors the user can act on (`ChangelakeError`) become one line on stderr and exit status 2;
no traceback.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from changelake.errors import ChangelakeError
from changelake.redact import redact

F = TypeVar("F", bound=Callable[..., Any])



def _time(value: int | None, option: str) -> int | None:
    """A logical time given on the command line, within what the wire carries (an Avro long,
    not negative); one line naming the option otherwise."""
    from changelake.errors import InputError
    from changelake.protocol.time import check_time

    if value is None:
        return None
    try:
        return check_time(value)
    except ValueError as error:
        raise InputError(f"{option}: {error}") from None


def _fail(message: str) -> None:
    click.echo(f"changelake: error: {message}", err=True)
    sys.exit(2)


def user_errors(func: F) -> F:
    """Turn `ChangelakeError` (and unreadable files) into one line and exit status 2.

    Anything else is a bug in changelake, not bad input (input errors are translated where the
    input is parsed, with its location): one "internal error" line and exit status 1, with the
    traceback only when CHANGELAKE_DEBUG is set.
    """

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ChangelakeError as error:  # one line, whatever the input held, no secret
            _fail(redact(" ".join(str(error).splitlines())))
        except BrokenPipeError:
            sys.exit(0)  # the reader went away (e.g. `| head`)
        except OSError as error:
            if error.errno == 32:  # broken pipe, raised as a plain OSError
                sys.exit(0)
            # An OSError raised with a message alone (delta-rs's, pyarrow's) has no strerror.
            detail = error.strerror or " ".join(str(error).split()) or type(error).__name__
            _fail(redact(f"{error.filename or ''}: {detail}".lstrip(": ")))
        except click.ClickException:
            raise  # usage errors: click prints them
        except Exception as error:
            import os

            if os.environ.get("CHANGELAKE_DEBUG"):
                raise
            text = redact(" ".join(str(error).split()))[:300]
            click.echo(f"changelake: internal error: {type(error).__name__}: {text} (a bug: "
                       "please report it; CHANGELAKE_DEBUG=1 shows the traceback)", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def _since(value: int | None) -> Any:
    from changelake.protocol import Antichain

    return None if value is None else Antichain([value])


def _schema(path: Path | None) -> Any:
    from changelake.formats.materialize import load_schema

    return None if path is None else load_schema(path)


def _report_set_aside(set_aside: list, rejected: list) -> None:
    for item in set_aside:
        click.echo(f"changelake: set aside: {item.location}: {item.reason}", err=True)
    for item in rejected:
        click.echo(f"changelake: set aside: {item.error}", err=True)
    if set_aside or rejected:
        click.echo(f"changelake: {len(set_aside) + len(rejected)} input(s) set aside "
                   "(lenient mode)", err=True)


class _Main(click.Group):
    """The command group, which removes the JVM's log it named (`main`) when the command
    succeeds; a failed command's is kept (its error line may name it) until `private.
    sweep_logs` removes it, a week later."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        except SystemExit as done:
            if done.code in (None, 0) and _OWN_LOG:
                import os

                for log in _OWN_LOG:
                    with contextlib.suppress(OSError):
                        os.unlink(log)
            raise


_OWN_LOG: list[str] = []


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """Our own warnings as one line, `changelake: warning: ...`; others as Python shows them."""
    from changelake.errors import ChangelakeWarning

    if issubclass(category, ChangelakeWarning):
        click.echo(f"changelake: warning: {redact(' '.join(str(message).split()))}", err=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="changelake")
def main() -> None:
    """Changefeeds to exactly-once CDCv2 (Materialize CDC) and lake tables on Spark."""
    import os

    from changelake.private import temporary_folder

    warnings.showwarning = _show_warning
    # Spark's JVM talks on stderr at start-up; keep that in a log so that our stderr is ours:
    # in this user's private folder (the session makes it), removed if the command succeeds.
    if not os.environ.get(JVM_LOG_ENV):
        log = str(temporary_folder("changelake") / f"spark-{os.getpid()}.log")
        os.environ[JVM_LOG_ENV] = log
        _OWN_LOG.append(log)


JVM_LOG_ENV = "CHANGELAKE_JVM_LOG"
"""`changelake.spark.session.JVM_LOG_ENV`, not imported from there: that would import pyspark,
which the lake reads on the Arrow path do without (a test checks that the two agree)."""


def _parse_conf(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict:
    conf = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        conf[key] = value
    return conf


def spark_options(func: F) -> F:
    """--master and --conf, for every command that runs on Spark."""
    func = click.option("--conf", "spark_conf", multiple=True, callback=_parse_conf,
                        metavar="KEY=VALUE",
                        help="Spark setting, overriding the 2-core defaults (repeatable).")(func)
    return click.option("--master", default="local[*]", show_default=True,
                        help="Spark master URL: local[*], spark://HOST:PORT, ...")(func)


def kafka_options(role: str) -> Callable[[F], F]:
    """--kafka, --topic and --schema-registry: a topic as the source of messages. (A topic as
    the destination is `--to-kafka`/`--to-topic`: `encode --from debezium` will read its
    changefeed from `--kafka` and may write to `--to-kafka` at once.)"""

    def decorate(func: F) -> F:
        func = click.option("--schema-registry", "schema_registry", default=None, metavar="URL",
                            help="Confluent schema registry: schema ids of the framed "
                                 "messages (subject TOPIC-value).")(func)
        func = click.option("--topic", default=None, metavar="T",
                            help=f"The Kafka topic to {role}.")(func)
        return click.option("--kafka", "kafka", default=None, metavar="BOOTSTRAP",
                            help=f"{role.capitalize()} a Kafka topic (Confluent-framed Avro) "
                                 "at these bootstrap servers, host:port,...")(func)

    return decorate


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
@user_errors
def decode(schema_path: Path | None, lenient: bool, since: int | None, state: Path | None,
           engine: str, kafka: str | None, topic: str | None, schema_registry: str | None,
           group: str | None, master: str, spark_conf: dict, inputs: tuple[str, ...]) -> None:
    """Read Materialize CDC messages (Avro OCF or JSON lines, any order and duplication; or a
    Kafka topic's, with --kafka) and print the recovered history as JSON lines, then the
    frontier."""
    schema = _schema(schema_path)
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
                              since=_since(since), state=state)
    elif engine == "spark":
        if state is not None:
            raise click.UsageError("--state is for the local engine; Spark resumes with --since")
        from changelake.spark.decode_files import decode_with_spark

        report = decode_with_spark(list(inputs), out, schema=schema, lenient=lenient,
                                   since=_since(since), master=master, conf=spark_conf)
    else:
        from changelake.local import decode_local

        report = decode_local(list(inputs), out, schema=schema, lenient=lenient,
                              since=_since(since), state=state)
    _report_set_aside(report.set_aside, report.rejected)
    if report.waiting_for:
        click.echo(f"changelake: note: frontier stopped at {report.frontier.to_json()}: "
                   f"{report.waiting_for}", err=True)


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
@user_errors
def encode(schema_path: Path | None, close: bool, avro: Path | None, source: str,
           key: str | None, table_schema: Path | None, batch_size: int, lenient: bool,
           kafka: str | None, topic: str | None, schema_registry: str | None,
           transactional_id: str | None, source_kafka: str | None,
           source_topics: tuple[str, ...], group: str | None, inputs: tuple[str, ...]) -> None:
    """Write Materialize CDC messages from changes: JSON lines {"data":..,"time":..,"diff":..}
    with {"finished": T} marks, or a Debezium / YDB changefeed (--from; files, or topics with
    --kafka); to stdout, an Avro file (--avro) or a Kafka topic (--to-kafka)."""
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
            lenient=lenient, schema=_schema(schema_path), avro=avro)
        _report_set_aside(report.set_aside, [])
        return
    if schema_path is None:
        raise click.UsageError("--schema is required with --from materialize")
    from changelake.local import encode_local

    report = encode_local(list(inputs), out, schema=_schema(schema_path), close=close,
                          avro=avro, batch_size=batch_size, lenient=lenient,
                          stdin=None if inputs else sys.stdin.buffer)
    _report_set_aside(report.set_aside, [])
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
    schema = _schema(schema_path)
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
    _report_set_aside(report.set_aside, [])
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
    schema = _schema(schema_path)
    messages = encode_messages(list(inputs), schema=schema, close=close, batch_size=batch_size,
                               lenient=lenient, stdin=None if inputs else sys.stdin.buffer,
                               report=encoded)
    report = write_topic(messages, bootstrap=kafka, topic=topic, schema=schema,
                         schema_registry=schema_registry, transactional_id=transactional_id)
    _report_set_aside(encoded.set_aside, [])
    click.echo(f"changelake: wrote {report.messages} message(s) to topic {topic} "
               f"({len(report.by_partition)} partition(s), schema id {report.schema_id})",
               err=True)
    if encoded.unfinished:
        click.echo(f"changelake: note: {encoded.unfinished} change(s) at unfinished times were "
                   "not written; add {\"finished\": T} lines or --close", err=True)


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
@click.option("--protocol-only", is_flag=True, help="Skip the Spark and lake parts.")
@click.option("--postgres/--no-postgres", default=True, show_default=True,
              help="Run the PostgreSQL capture part (an embedded server).")
@click.option("--dsn", default=None,
              help="Run the PostgreSQL part on this database (PostgreSQL 12+, wal_level = "
                   "logical) instead of an embedded server; its tables are dropped after a "
                   "passing run. Its password from PGPASSWORD, ~/.pgpass, PGPASSFILE or "
                   "PGSERVICE, not the command line.")
@spark_options
@user_errors
def demo(seed: int, updates: int, rows: int, transactions: int, workdir: Path | None,
         protocol_only: bool, postgres: bool, dsn: str | None, master: str,
         spark_conf: dict) -> None:
    """Run the pipeline on generated data and check it: a mangled CDCv2 log decoded exactly;
    a Debezium changefeed through CDCv2, an at-least-once log, exactly-once lake ingest,
    compaction and AS OF reads, on local Spark with the lake's embedded metastore; Kafka
    topics (librdkafka's mock cluster) into and out of the lake; and an
    embedded PostgreSQL captured into lake tables while a workload runs, the capture killed
    once and restarted, every table and a cross-table invariant checked."""
    from changelake.demo.run import run_demo

    run_demo(seed=seed, updates=updates, rows=rows, transactions=transactions,
             workdir=workdir, protocol_only=protocol_only, postgres=postgres, dsn=dsn,
             master=master, spark_conf=spark_conf)


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
    upgrading Java or pyspark (an archive they no longer match is ignored, not wrong)."""
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


# ------------------------------------------------------------------------------ lake tables


def lake_options(func: F) -> F:
    """--lake, --metastore-uri and the Spark options, for every lake command."""
    func = spark_options(func)
    func = click.option("--metastore-uri", default=None, metavar="thrift://HOST:PORT",
                        help="A Hive metastore service (default: the lake's embedded Derby; "
                             "see `changelake metastore`).")(func)
    return click.option("--lake", "lake_dir", required=True, type=LakeLocation(),
                        help="The lake directory (data files and the embedded metastore), or "
                             "a Hadoop FileSystem URI: s3a://BUCKET/PREFIX (credentials and "
                             "endpoint from the AWS environment variables or --conf "
                             "spark.hadoop.fs.s3a.*; see README, Lake on object storage).")(func)


class LakeLocation(click.ParamType):
    """`--lake`: a local directory (a `Path`, as `click.Path(file_okay=False)` gives it), or
    the URI of a lake on another file system (`s3a://bucket/prefix`, `hdfs://...`) as text,
    which a `Path` would mangle (`s3a:/bucket`)."""

    name = "directory|URI"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, Path):
            return value
        text = str(value)
        if _is_remote_text(text):
            return text
        return click.Path(file_okay=False, path_type=Path).convert(text, param, ctx)


def _is_remote_text(text: str) -> bool:
    from changelake.durable import local_path

    return local_path(text) is None


def _is_remote(lake_dir: Any) -> bool:
    return isinstance(lake_dir, str) and _is_remote_text(lake_dir)


def _refuse_hive_on_remote(lake_dir: Any, table_format: str | None) -> None:
    """A Hive-format table on a remote lake (`--format hive`, or the default from
    CHANGELAKE_TABLE_FORMAT) is refused before Spark starts (`table.check_remote_storage`
    refuses it again where a table is made)."""
    if not _is_remote(lake_dir):
        return
    import os

    from changelake.errors import LakeError

    chosen = table_format or os.environ.get("CHANGELAKE_TABLE_FORMAT", "").strip().lower()
    if chosen == "hive":
        raise LakeError(f"lake {redact(str(lake_dir))}: a Hive-format table cannot live on a "
                        "remote lake (its commits need a local file lock); create Delta "
                        "tables there (--format delta, or leave CHANGELAKE_TABLE_FORMAT "
                        "unset)")


def _existing_lake(lake_dir: Path) -> None:
    """Every lake command but `ingest` (whose first run makes the lake) reads a lake that
    exists: a mistyped --lake is an error naming it, not an empty lake, and is not made.
    (A remote lake is asked when its session starts: `files.probe`.)"""
    from changelake.errors import LakeError

    if _is_remote(lake_dir):
        return
    if not lake_dir.is_dir():
        raise LakeError(f"no lake at {lake_dir} (a lake is made by the first ingest into it)")


def _table_and_key(table: str, key: str | None = None) -> tuple[Any, tuple[str, ...]]:
    """The table name and key columns checked before Spark starts (see lake/identifier.py):
    a bad name is one line and exit 2 at once, with nothing created."""
    from changelake.lake.identifier import TableIdentifier, check_name

    ident = TableIdentifier.parse(table)
    columns = tuple(key.split(",")) if key else ()
    for column in columns:
        check_name(column, f"table {ident}: key column")
    return ident, columns


def table_format_option(func: F) -> F:
    """`--format`: the back end of the tables a command creates."""
    return click.option(
        "--format", "table_format", type=click.Choice(["delta", "hive"]), default=None,
        help="The format of a table this command creates: delta (a Delta Lake table every "
             "Delta reader reads) or hive (Parquet files under a view). Default: "
             "$CHANGELAKE_TABLE_FORMAT, else delta. An existing table keeps its own.")(func)


def _open_lake(lake_dir: Path, metastore_uri: str | None, master: str, conf: dict,
               table_format: str | None = None) -> Any:
    from changelake.lake.commands import open_lake
    from changelake.spark.session import quiet_spark

    lake = open_lake(lake_dir, master=master, metastore_uri=metastore_uri, conf=conf,
                     storage=table_format)
    quiet_spark(lake.spark)
    return lake


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
              type=click.Path(file_okay=False, path_type=Path),
              help="With --follow: the streaming checkpoint (default: _follow in the table's "
                   "directory). Restart with the same one to resume.")
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
@user_errors
def ingest(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict, table: str,
           key: str | None, source: str, schema_path: Path | None, scd2: bool, close: bool,
           kafka: str | None, topics: tuple[str, ...], schema_registry: str | None,
           group: str | None, lenient: bool, dead_letter_topic: str | None,
           following: bool, checkpoint: Path | None,
           trigger_seconds: float, max_files_per_trigger: int | None,
           max_records_per_trigger: int | None, until_idle: float | None,
           tolerate_data_loss: bool, table_format: str | None,
           inputs: tuple[str, ...]) -> None:
    """Decode (or convert) INPUT (or --kafka topics) and commit what is new to a lake table,
    exactly once; or (--follow) keep doing so as files appear in a directory, or records in
    the topics."""
    from rich.console import Console

    from changelake.lake import commands, report

    ident, columns = _table_and_key(table, key)
    if not following and (checkpoint is not None or max_files_per_trigger is not None
                          or max_records_per_trigger is not None or until_idle is not None):
        raise click.UsageError("--checkpoint, --max-files-per-trigger, "
                               "--max-records-per-trigger and --until-idle go with --follow")
    if close and source == "materialize":
        raise click.UsageError("--close is for --from debezium|ydb: a Materialize CDC log "
                               "closes itself")
    if kafka is None and (topics or schema_registry is not None or group is not None):
        raise click.UsageError("--topic, --schema-registry and --group go with --kafka")
    if kafka is not None and not topics:
        raise click.UsageError("--kafka needs --topic T")
    _check_lenient_topics(kafka, lenient, dead_letter_topic)
    if following and source != "materialize":
        if kafka is None or inputs:
            raise click.UsageError(f"--follow --from {source} follows changefeed topics "
                                   "(--kafka --topic), not files")
        if checkpoint is not None or max_files_per_trigger is not None or \
                max_records_per_trigger is not None or close:
            raise click.UsageError(
                "--checkpoint, --max-files-per-trigger, --max-records-per-trigger and --close "
                f"do not go with --follow --from {source}: each round reads from the offsets "
                "the table's last commit recorded, to the partitions' ends")
    if kafka is not None and source != "materialize" and schema_registry is not None:
        raise click.UsageError(f"--schema-registry is for Avro topics (--from materialize); "
                               f"{source} topics are JSON")
    if kafka is not None and source == "materialize" and schema_path is None and \
            schema_registry is None:
        raise click.UsageError("--kafka needs the messages' schema: --schema FILE or "
                               "--schema-registry URL")
    if source != "materialize" and schema_path is not None:
        from changelake.formats.tableschema import read_table_json

        read_table_json(schema_path)  # a bad table schema is named before Spark starts
    if tolerate_data_loss and (not following or kafka is None or source != "materialize"):
        raise click.UsageError("--no-fail-on-data-loss goes with --follow --kafka (--from "
                               "materialize: the streaming source's failOnDataLoss)")
    if following and _is_remote(lake_dir):
        from changelake.errors import LakeError

        raise LakeError(f"lake {redact(str(lake_dir))}: --follow keeps its state in local "
                        "files beside the table and does not run on a remote lake yet; "
                        "run ingest rounds instead")
    if following and source != "materialize":
        _follow_changefeed(lake_dir, metastore_uri, master, spark_conf, ident, columns, source,
                           schema_path, scd2, kafka, tuple(topics), group, trigger_seconds,
                           until_idle, lenient, dead_letter_topic, table_format)
        return
    if following:
        if kafka is not None:
            if inputs:
                raise click.UsageError("--follow --kafka follows the topics: no INPUT as well")
            if group is not None or max_files_per_trigger is not None:
                raise click.UsageError("--group and --max-files-per-trigger do not go with "
                                       "--follow --kafka (the checkpoint keeps the offsets)")
        elif len(inputs) != 1 or max_records_per_trigger is not None:
            raise click.UsageError("--follow follows one INPUT directory (no more than one "
                                   "INPUT as well), or --kafka topics")
        _follow(lake_dir, metastore_uri, master, spark_conf, ident, columns, schema_path,
                scd2, Path(inputs[0]) if inputs else None, checkpoint, trigger_seconds,
                max_files_per_trigger, until_idle,
                _TopicFollow(kafka, tuple(topics), schema_registry, max_records_per_trigger,
                             not tolerate_data_loss, lenient, dead_letter_topic)
                if kafka is not None else None, table_format)
        return
    if kafka is not None and inputs:
        raise click.UsageError("--kafka reads the topics: no input files as well")
    if kafka is None and not inputs:
        raise click.UsageError("no INPUT given (files or directories, or --kafka/--topic)")
    if kafka is not None:
        _check_topics(kafka, topics, dead_letter_topic)
    _refuse_hive_on_remote(lake_dir, table_format)
    lake = _open_lake(lake_dir, metastore_uri, master, spark_conf, table_format)
    try:
        with report.progress_bar(Console(stderr=True), f"ingest {ident}") as step:
            if kafka is not None and source != "materialize":
                from changelake.lake.kafka_changefeed import ingest_changefeed_topics

                read = ingest_changefeed_topics(lake, ident, kafka, list(topics),
                                                source=source, key=columns,
                                                table_schema=schema_path, close=close,
                                                group=group, scd2=scd2, progress=step,
                                                lenient=lenient,
                                                dead_letter_topic=dead_letter_topic)
                result = read.ingest
            elif kafka is not None:
                from changelake.lake.kafka_ingest import ingest_topics

                read = ingest_topics(lake, ident, kafka, list(topics), key=columns,
                                     schema=schema_path, schema_registry=schema_registry,
                                     group=group, scd2=scd2, progress=step, lenient=lenient,
                                     dead_letter_topic=dead_letter_topic)
                result = read.ingest
            else:
                result = commands.ingest(lake, ident, list(inputs), key=columns,
                                         source=source, schema=schema_path, progress=step,
                                         scd2=scd2, close=close)
    finally:
        lake.spark.stop()
    if kafka is not None:
        click.echo(f"changelake: {report.topics_line(read)}", err=True)
        _report_topic_set_aside(read, dead_letter_topic)
    click.echo(report.ingest_line(result), err=True)
    waiting = report.waiting_line(result)
    if waiting is not None:
        click.echo(f"changelake: {waiting}", err=True)


def _check_topics(bootstrap: str, topics: tuple[str, ...],
                  dead_letter_topic: str | None = None) -> None:
    """`ingest --kafka`'s topics (and dead-letter topic) checked on the driver before Spark
    and the lake's metastore start: a bootstrap no broker answers at, or a topic that does not
    exist, is the one line `decode --kafka` gives, in seconds, with no lake made. The reads
    in Spark check again (a topic may be deleted in between)."""
    from changelake.kafka.changefeed import topic_list
    from changelake.kafka.client import check_topics
    from changelake.kafka.errors import TopicError

    check_topics(bootstrap, topic_list(topics))
    if dead_letter_topic is not None:
        try:
            check_topics(bootstrap, [dead_letter_topic])
        except TopicError as error:
            raise TopicError(f"dead-letter topic: {error}") from None


def _check_lenient_topics(kafka: str | None, lenient: bool,
                          dead_letter_topic: str | None) -> None:
    """Usage errors of `ingest --lenient/--dead-letter-topic` (bad records of --kafka topics
    set aside)."""
    if kafka is None and (lenient or dead_letter_topic is not None):
        raise click.UsageError("--lenient and --dead-letter-topic go with --kafka (bad records "
                               "of topics)")
    if dead_letter_topic is not None and not lenient:
        raise click.UsageError("--dead-letter-topic takes the records --lenient sets aside: "
                               "give --lenient too")


def _report_topic_set_aside(read: Any, dead_letter_topic: str | None) -> None:
    """`ingest --kafka --lenient`: a line per record set aside (the report's sample), the
    total, and how many went to the dead-letter topic."""
    for item in read.set_aside:
        click.echo(f"changelake: set aside: {item.location}: {item.reason}", err=True)
    if read.set_aside_count:
        more = read.set_aside_count - len(read.set_aside)
        click.echo(f"changelake: {read.set_aside_count} record(s) set aside (lenient mode)"
                   + (f", {more} not listed" if more > 0 else ""), err=True)
    if dead_letter_topic is not None and read.dead_lettered:
        click.echo(f"changelake: {read.dead_lettered} record(s) produced to dead-letter topic "
                   f"{dead_letter_topic}", err=True)


def _follow_set_aside(kafka: _TopicFollow) -> Any:
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


@dataclass(frozen=True)
class _TopicFollow:
    """`ingest --follow --kafka`'s topics."""

    bootstrap: str
    topics: tuple[str, ...]
    schema_registry: str | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool = True
    lenient: bool = False
    dead_letter_topic: str | None = None


def _follow(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict,
            ident: Any, columns: tuple[str, ...], schema_path: Path | None, scd2: bool,
            follow_dir: Path | None, checkpoint: Path | None, trigger_seconds: float,
            max_files_per_trigger: int | None, until_idle: float | None,
            kafka: _TopicFollow | None = None, table_format: str | None = None) -> None:
    """`ingest --follow`: run until SIGTERM / SIGINT (or --until-idle), then exit 0 once the
    batch in flight has committed (see lake/follow.py)."""
    import os
    import signal
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
            _check_topics(kafka.bootstrap, kafka.topics, kafka.dead_letter_topic)
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
        previous = {sig: signal.signal(sig, lambda _s, _f: control.stop())
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        lake = _open_lake(lake_dir, metastore_uri, master, spark_conf, table_format)
        try:
            click.echo(f"changelake: following {address} into {ident}", err=True)
            result = follow(lake, ident, messages, address,
                            checkpoint=checkpoint, key=columns, scd2=scd2,
                            trigger_seconds=trigger_seconds, until_idle=until_idle,
                            control=control, progress=progress, set_aside=set_aside,
                            losses=losses, **({"kind": kind} if kind is not None else {}))
        finally:
            lake.spark.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    click.echo(f"changelake: follow {result.table}: stopped after {result.batches} "
               f"micro-batch(es), {result.committed} committed", err=True)


def _follow_changefeed(lake_dir: Path, metastore_uri: str | None, master: str,
                       spark_conf: dict, ident: Any, columns: tuple[str, ...], source: str,
                       schema_path: Path | None, scd2: bool, kafka: str | None,
                       topics: tuple[str, ...], group: str | None, trigger_seconds: float,
                       until_idle: float | None, lenient: bool,
                       dead_letter_topic: str | None,
                       table_format: str | None = None) -> None:
    """`ingest --follow --kafka --from debezium|ydb`: rounds of exactly-once ingests until
    SIGTERM / SIGINT (the round in flight commits first) or --until-idle
    (lake/follow_changefeed.py)."""
    import signal

    from changelake.lake import report
    from changelake.lake.follow import FollowControl
    from changelake.lake.follow_changefeed import follow_changefeed_topics

    assert kafka is not None

    def progress(number: int, read: Any) -> None:
        click.echo(f"changelake: round {number}: {report.topics_line(read)}; "
                   f"{report.ingest_line(read.ingest)}", err=True)
        _report_topic_set_aside(read, dead_letter_topic)

    _check_topics(kafka, topics, dead_letter_topic)
    control = FollowControl()
    previous = {sig: signal.signal(sig, lambda _s, _f: control.stop())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    lake = _open_lake(lake_dir, metastore_uri, master, spark_conf, table_format)
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
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo(f"changelake: follow {result.table}: stopped after {result.batches} "
               f"round(s), {result.committed} committed", err=True)


def engine_option(func: F) -> F:
    return click.option(
        "--engine", type=click.Choice(["auto", "arrow", "spark"]), default="auto",
        show_default=True,
        help="arrow: read the committed files with pyarrow, no JVM; spark: through the "
             "metastore; auto: arrow when the table is small (see changelake/lake/arrow.py) "
             "and its committed version is known without the metastore, else spark.")(func)


def _remote_engine(lake_dir: Any, engine: str) -> str:
    """The engine of `snapshot`/`status` on `lake_dir`. A remote lake is read without a JVM
    (pyarrow's S3 file system, delta-rs) on `s3a://` with the key pair in the environment
    (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`: `files.arrow_s3`); otherwise by Spark,
    whose S3A finds credentials wherever its provider chain looks (`auto`), and
    `--engine arrow` is refused in one line."""
    import os

    if not _is_remote(lake_dir) or engine == "spark":
        return engine
    scheme = str(lake_dir).split("://", 1)[0].lower()
    keys = os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")
    if scheme in ("s3a", "s3") and keys:
        from changelake.lake.files import RemotePath, arrow_probe

        root = RemotePath(str(lake_dir))
        arrow_probe(root)
        if not (root / "tables").is_dir():
            from changelake.errors import LakeError

            raise LakeError(f"no lake at {redact(str(lake_dir))} (a lake is made by the "
                            "first ingest into it)")
        return engine
    if engine == "arrow":
        from changelake.errors import LakeError

        raise LakeError(f"lake {redact(str(lake_dir))}: --engine arrow reads a remote lake on "
                        "s3a:// with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
                        "environment only; use --engine spark")
    return "spark"


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
    """Print the rows of a lake table now, AS OF a time, or its SCD type 2 history."""
    if history and as_of is not None:
        raise click.UsageError("--history and --as-of are exclusive")
    from changelake.lake import report

    fmt = fmt or ("table" if sys.stdout.isatty() else "jsonl")
    ident, _ = _table_and_key(table)
    as_of = _time(as_of, "--as-of")
    _existing_lake(lake_dir)
    engine = _remote_engine(lake_dir, engine)
    if engine != "spark":
        read = _arrow_snapshot(lake_dir, ident, as_of, history, engine)
        if read is not None:
            columns, rows = read
            report.write_snapshot(rows, columns, fmt, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            return
    from changelake.lake import commands

    lake = _open_lake(lake_dir, metastore_uri, master, spark_conf)
    try:
        columns = commands.snapshot_columns(lake, ident, history=history)
        report.write_snapshot(commands.snapshot(lake, ident, as_of=as_of, history=history),
                              columns, fmt, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    finally:
        lake.spark.stop()


@main.command()
@lake_options
@click.option("--table", required=True)
@click.option("--since", type=click.IntRange(min=0), default=None,
              help="Advance `since` to this time (default: the table's frontier).")
@user_errors
def compact(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict,
            table: str, since: int | None) -> None:
    """Fold change segments into the buckets they touch and advance `since`."""
    from rich.console import Console

    from changelake.lake import commands, report

    ident, _ = _table_and_key(table)
    since = _time(since, "--since")
    _existing_lake(lake_dir)
    lake = _open_lake(lake_dir, metastore_uri, master, spark_conf)
    try:
        with report.progress_bar(Console(stderr=True), f"compact {ident}") as step:
            result = commands.compact(lake, ident, since=since, progress=step)
    finally:
        lake.spark.stop()
    click.echo(report.compact_line(result), err=True)


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
    lines like `encode`'s, or --avro FILE) with exact progress statements: a change feed."""
    if history and avro is not None:
        raise click.UsageError("--history prints decoded lines; it does not go with --avro")
    from changelake.lake.changes import write_changes

    ident, _ = _table_and_key(table)
    since = _time(since, "--since")
    until = _time(until, "--until")
    _existing_lake(lake_dir)
    lake = _open_lake(lake_dir, metastore_uri, master, spark_conf)
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
    commits)."""
    from changelake.lake.export import export_table

    kind, target = to
    options = {k: v for k, v in (("catalog", catalog), ("identifier", identifier),
                                 ("warehouse", warehouse)) if v is not None}
    if kind == "delta" and options:
        raise click.UsageError(f"--{', --'.join(options)}: for --to iceberg only")
    if kind == "iceberg":  # a catalog that cannot be opened is refused before Spark starts
        from changelake.lake.export.iceberg import check_catalog

        check_catalog(target, warehouse)
    ident, _ = _table_and_key(table)
    _existing_lake(lake_dir)
    lake = _open_lake(lake_dir, metastore_uri, master, spark_conf)
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
@user_errors
def status(lake_dir: Path, metastore_uri: str | None, master: str, spark_conf: dict,
           fmt: str | None, live: bool, engine: str) -> None:
    """Per table: frontier, since, rows, segments, files, bytes, last commit. Per source
    database of captured tables: its tables, their consistent frontier (time and LSN), and,
    with --live, its slot's lag ("unreachable" with the reason if it cannot be asked); per
    table ingested from Kafka, its offsets and, with --live, their lag. Without --live no
    server the lake names is contacted: "not asked (--live)" where the lag would be.

    jsonl: a line per table (with "name"), then a line per source database (with "database")."""
    import orjson

    from changelake.lake import report

    fmt = fmt or ("table" if sys.stdout.isatty() else "jsonl")
    _existing_lake(lake_dir)
    engine = _remote_engine(lake_dir, engine)
    result = _arrow_status(lake_dir, engine, live) if engine != "spark" else None
    if result is None:
        from changelake.lake import commands

        lake = _open_lake(lake_dir, metastore_uri, master, spark_conf)
        try:
            result = commands.lake_status(lake, live=live)
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
    the lake runs as its user. Run it only on a machine (or container) you alone use."""
    from changelake.lake import commands

    if _is_remote(lake_dir):
        from changelake.errors import LakeError

        raise LakeError(f"lake {redact(str(lake_dir))}: `changelake metastore` serves a local "
                        "lake directory's metastore; a remote lake's is kept per machine "
                        "(CHANGELAKE_STATE_HOME), or give its commands a metastore service "
                        "of your own with --metastore-uri")
    sys.exit(commands.metastore(lake_dir, port=port))


@main.group()
def capture() -> None:
    """Capture a database's changes into lake tables or Materialize CDC logs (exactly once, one
    time domain)."""


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
    Materialize CDC logs (--out) named schema.table, each transaction at its commit LSN."""
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
        lake = _open_lake(lake_dir, metastore_uri, master, spark_conf, table_format)
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
    ingested with --scd2 also have their NAME_history view."""
    from changelake.lake.sql_endpoint import serve_lake

    _existing_lake(lake_dir)
    sys.exit(serve_lake(lake_dir, port, master=master, metastore_uri=metastore_uri,
                        conf=spark_conf, password_file=password_file, out=sys.stdout,
                        err=sys.stderr))


if __name__ == "__main__":
    main()
