"""The options several commands share, each declared once (`--master`/`--conf`, `--kafka`/
`--topic`, `--lake`, `--format`, `--engine`), and the checks of the values they give."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from changelake.cli.group import F


def checked_time(value: int | None, option: str) -> int | None:
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


def since_frontier(value: int | None) -> Any:
    """`--since T` as the frontier a read resumes from (None: from the start)."""
    from changelake.protocol import Antichain

    return None if value is None else Antichain([value])


def read_schema(path: Path | None) -> Any:
    """`--schema FILE`: a Materialize CDC Avro schema (None without the option)."""
    from changelake.formats.materialize import load_schema

    return None if path is None else load_schema(path)


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


def kafka_security_options(func: F) -> F:
    """--kafka-conf and --kafka-config: librdkafka security settings for every Kafka client
    the command makes (`kafka.security`). Put it above `user_errors`: it sets the settings for
    the command's run (`security.use`) and clears them after; a setting that cannot be used is
    one line, exit status 2, naming a key, never a value."""
    from functools import wraps

    from changelake.cli.group import user_errors

    @wraps(func)
    def wrapper(*args: Any, kafka_conf: tuple[str, ...] = (),
                kafka_config: Path | None = None, **kwargs: Any) -> Any:
        from changelake.kafka import security

        def run() -> Any:
            security.use(security.from_command_line(kafka_conf, kafka_config))
            try:
                return func(*args, **kwargs)
            finally:
                security.use(None)

        return user_errors(run)()

    wrapper = click.option(
        "--kafka-config", "kafka_config", default=None, metavar="FILE",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Kafka client settings for every Kafka connection of the command (security: "
             "SASL, SSL), a Java-style properties file: librdkafka's names, or the Java "
             "client's sasl.jaas.config (PLAIN, SCRAM) and PEM truststore. Never "
             "printed.")(wrapper)
    wrapper = click.option(
        "--kafka-conf", "kafka_conf", multiple=True, metavar="KEY=VALUE",
        help="A Kafka client setting (librdkafka's name, e.g. security.protocol=SASL_SSL, "
             "sasl.mechanism=PLAIN, sasl.username=U, sasl.password=P), over --kafka-config's "
             "(repeatable). Never printed.")(wrapper)
    return wrapper  # type: ignore[return-value]


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


def is_remote(lake_dir: Any) -> bool:
    """Whether `--lake` named a lake on another file system (a URI, as `LakeLocation` keeps
    it)."""
    return isinstance(lake_dir, str) and _is_remote_text(lake_dir)


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
                             "spark.hadoop.fs.s3a.*; see docs/guides/storage.md).")(func)


def table_format_option(func: F) -> F:
    """`--format`: the back end of the tables a command creates."""
    return click.option(
        "--format", "table_format", type=click.Choice(["delta", "hive"]), default=None,
        help="The format of a table this command creates: delta (a Delta Lake table every "
             "Delta reader reads) or hive (Parquet files under a view). Default: "
             "$CHANGELAKE_TABLE_FORMAT, else delta. An existing table keeps its own.")(func)


def engine_option(func: F) -> F:
    """`--engine`: how `snapshot` and `status` read the lake."""
    return click.option(
        "--engine", type=click.Choice(["auto", "arrow", "spark"]), default="auto",
        show_default=True,
        help="arrow: read the committed files with pyarrow, no JVM; spark: through the "
             "metastore; auto: arrow when the table is small (see changelake/lake/arrow.py) "
             "and its committed version is known without the metastore, else spark.")(func)
