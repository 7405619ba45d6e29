"""Kafka security settings (`--kafka-conf`, `--kafka-config`: `kafka/security.py`) against the
test broker's SASL listener (PLAIN, and SCRAM-SHA-512 from a Java client's JAAS line): the
right password works end to end (`encode --to-kafka`, `decode --kafka`, a `kafka-cdc` read
and `ingest --kafka`, whose executors read with the settings the planner sent them), a wrong
one is one line with exit status 2, and no password is printed anywhere: error lines, help,
the reader's options and repr, the Spark session's settings."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from changelake.cli import main
from changelake.kafka import security
from changelake.kafka.broker import KafkaBroker
from changelake.kafka.security import (
    SecurityError,
    from_command_line,
    parse_properties,
    translate,
)
from tests.support.decoded import decoded_history
from tests.support.kafka_helpers import SASL_PASSWORD, SASL_USER, new_topic, row_schema
from tests.support.paths import ROOT

EXAMPLES = ROOT / "examples" / "materialize"
SCHEMA = str(EXAMPLES / "schema.json")


def sasl_items(password: str = SASL_PASSWORD) -> list[str]:
    return ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN",
            f"sasl.username={SASL_USER}", f"sasl.password={password}"]


def conf_args(password: str = SASL_PASSWORD) -> list[str]:
    return [a for item in sasl_items(password) for a in ("--kafka-conf", item)]


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def printed(result: Result) -> str:
    return result.output + (result.stderr if result.stderr_bytes is not None else "")


def one_error_line(result: Result, *secrets: str) -> str:
    text = printed(result)
    for secret in secrets:
        assert secret not in text, text
    assert result.exit_code == 2, text
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("changelake: error: "), text
    return lines[0]


def test_a_java_properties_file_is_read_as_java_reads_it() -> None:
    text = ("# a comment\n! another\n  security.protocol = SASL_SSL\n"
            "sasl.mechanism:SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule \\\n"
            "    required username=\"alice\" password=\"p=w;d e\";\n"
            "ssl.truststore.type=PEM\nssl.truststore.location=/etc/ca.pem\n"
            "ssl.endpoint.identification.algorithm=\nkey\\ with\\ space=v\\u00e9\n")
    pairs = parse_properties(text, "f")
    assert pairs[0] == ("security.protocol", "SASL_SSL")
    assert pairs[1] == ("sasl.mechanism", "SCRAM-SHA-512")
    assert pairs[-1] == ("key with space", "vé")
    settings = translate(pairs[:-1], "f")
    assert settings == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                        "sasl.username": "alice", "sasl.password": "p=w;d e",
                        "ssl.ca.location": "/etc/ca.pem",
                        "ssl.endpoint.identification.algorithm": "none"}
    with pytest.raises(SecurityError, match="librdkafka reads certificates in PEM, not a JKS"):
        translate([("ssl.truststore.location", "/etc/trust.jks")], "f")
    with pytest.raises(SecurityError, match=r"login module .*OAuthBearerLoginModule"):
        translate([("sasl.jaas.config", "org.apache.kafka.common.security.oauthbearer."
                                        "OAuthBearerLoginModule required;")], "f")


def test_settings_are_checked_when_given_and_never_shown(tmp_path: Path) -> None:
    secret = f"pw-{uuid.uuid4().hex}"
    # a typo in a key: one line naming the key, exit 2, before any connection
    line = one_error_line(cli("decode", "--kafka", "127.0.0.1:1", "--topic", "t",
                              "--schema", SCHEMA, "--kafka-conf", f"sasl.pasword={secret}"),
                          secret)
    assert '"sasl.pasword"' in line
    # an item without '=' may be a bare password: named by its place only
    line = one_error_line(cli("decode", "--kafka", "127.0.0.1:1", "--topic", "t",
                              "--schema", SCHEMA, "--kafka-conf", "sasl.mechanism=PLAIN",
                              "--kafka-conf", secret), secret)
    assert "the 2nd --kafka-conf" in line
    missing = tmp_path / "none.properties"
    line = one_error_line(cli("decode", "--kafka", "127.0.0.1:1", "--topic", "t",
                              "--schema", SCHEMA, "--kafka-config", str(missing)))
    assert str(missing) in line
    found = from_command_line([f"sasl.password={secret}", "sasl.username=u",
                               "sasl.mechanism=PLAIN", "security.protocol=SASL_PLAINTEXT"])
    assert secret not in repr(found) and secret not in str(found)
    from changelake.redact import redact

    assert redact(f"a library quoting {secret} back") == "a library quoting *** back"
    help_text = cli("ingest", "--help").output
    assert "--kafka-conf KEY=VALUE" in help_text and "--kafka-config FILE" in help_text


def test_encode_and_decode_through_sasl_and_a_wrong_password(broker: KafkaBroker,
                                                             tmp_path: Path) -> None:
    topic = new_topic(broker, partitions=2)
    assert broker.sasl_bootstrap is not None
    done = cli("encode", "--schema", SCHEMA, "--close", "--to-kafka", broker.sasl_bootstrap,
               "--to-topic", topic, *conf_args(), str(EXAMPLES / "changes.jsonl"))
    assert done.exit_code == 0, printed(done)
    assert SASL_PASSWORD not in printed(done)
    properties = tmp_path / "client.properties"
    properties.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        f'  username="{SASL_USER}" password="{SASL_PASSWORD}";\n')
    read = cli("decode", "--schema", SCHEMA, "--kafka", broker.sasl_bootstrap, "--topic", topic,
               "--kafka-config", str(properties))
    assert read.exit_code == 0, printed(read)
    plain = cli("decode", "--schema", SCHEMA, "--kafka", broker.bootstrap, "--topic", topic)
    history = decoded_history(plain.output)
    assert decoded_history(read.output) == history and '"diff"' in read.output
    assert SASL_PASSWORD not in printed(read)
    scram = tmp_path / "scram.properties"
    scram.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{SASL_USER}" password="{SASL_PASSWORD}";\n')
    read = cli("decode", "--schema", SCHEMA, "--kafka", broker.sasl_bootstrap, "--topic", topic,
               "--kafka-config", str(scram))
    assert read.exit_code == 0 and decoded_history(read.output) == history, printed(read)

    wrong = SASL_PASSWORD + "-wrong"
    for args in (["decode", "--schema", SCHEMA, "--kafka", broker.sasl_bootstrap, "--topic",
                  topic, *conf_args(wrong)],
                 ["encode", "--schema", SCHEMA, "--close", "--to-kafka",
                  broker.sasl_bootstrap, "--to-topic", topic, *conf_args(wrong),
                  str(EXAMPLES / "changes.jsonl")]):
        line = one_error_line(cli(*args), wrong, SASL_PASSWORD)
        assert "Authentication failed" in line, line
    # without the settings the SASL listener does not serve us
    one_error_line(cli("decode", "--schema", SCHEMA, "--kafka", broker.sasl_bootstrap,
                       "--topic", topic))
    assert not security.current()  # each command clears what it set


def produce_history(broker: KafkaBroker, seed: int) -> tuple[Any, str]:
    from changelake.kafka import write_topic
    from changelake.simulate import random_history, write
    from tests.support.seeding import seeded

    history = random_history(seeded(seed), updates=120, times=8)
    topic = new_topic(broker, partitions=3)
    write_topic(write(history, batch_size=5), bootstrap=broker.bootstrap, topic=topic,
                schema=row_schema())
    return history, topic


@pytest.mark.spark
def test_a_kafka_cdc_read_on_the_executors_takes_the_settings(spark, broker: KafkaBroker
                                                               ) -> None:
    """The planner runs in a process of Spark's, the reads on executors: neither sees this
    process's settings, only what the `securityFile` option's file gave the reader (the SASL
    listener refuses a client without them: the CLI test above)."""
    from changelake.spark import kafka_source
    from changelake.spark.kafka_source import KafkaOptions, reader_options

    _history, topic = produce_history(broker, 91)
    plain = held_records(spark, reader_options(broker.bootstrap, [topic]))
    assert broker.sasl_bootstrap is not None
    security.use(from_command_line(sasl_items()))
    try:
        options = reader_options(broker.sasl_bootstrap, [topic])
        shared = Path(options["securityFile"])
        assert SASL_PASSWORD not in json.dumps(options)
        assert oct(shared.stat().st_mode & 0o777) == "0o600"
        parsed = KafkaOptions.parse({**options, "output": "records"})
        assert SASL_PASSWORD not in repr(parsed)
        assert parsed.consumer_config()["sasl.password"] == SASL_PASSWORD
        frame = (spark.read.format(kafka_source.NAME).options(**options, output="records")
                 .load())
        assert SASL_PASSWORD not in frame._jdf.queryExecution().toString()
        assert held_records(spark, options) == plain
    finally:
        security.use(None)
    assert not shared.exists()  # removed when the settings went
    assert SASL_PASSWORD not in json.dumps(spark.sparkContext.getConf().getAll())


@contextmanager
def sasl_settings() -> Iterator[None]:
    """The SASL settings in force (`security.use`) while the `with` lasts."""
    security.use(from_command_line(sasl_items()))
    try:
        yield
    finally:
        security.use(None)


def produce_history_with_schema(broker: KafkaBroker, seed: int, tmp_path: Path
                                ) -> tuple[Any, str, Path]:
    """`produce_history`, and the rows' CDC schema in a file."""
    history, topic = produce_history(broker, seed)
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(row_schema().avro))
    return history, topic, schema


def assert_holds(lake: Any, name: str, history: Any) -> None:
    """The table's updates are the history's, each once."""
    rows = Counter((r["id"], r["v"], r["_time"], r["_diff"])
                   for r in lake.table(name).updates().collect())
    assert rows == Counter((d.get("id"), d.get("v"), t, r) for d, t, r in history.truth)


def held_records(spark: Any, options: dict[str, str]) -> list[tuple]:
    from changelake.spark import kafka_source

    kafka_source.register(spark)
    rows = (spark.read.format(kafka_source.NAME).options(**options, output="records").load()
            .select("partition", "offset", "value").collect())
    return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows)


@pytest.mark.spark
def test_ingest_reads_on_the_executors_with_the_settings(spark, broker: KafkaBroker,
                                                         tmp_path: Path) -> None:
    """`ingest --kafka`'s read (planned here, read by `kafka-cdc` on the executors) through
    the SASL listener: the table holds the history; the password is in no setting of the
    session and not in the table's metadata."""
    from changelake.lake import Lake
    from changelake.lake.kafka_ingest import ingest_topics

    history, topic, schema = produce_history_with_schema(broker, 90, tmp_path)
    lake = Lake(spark, tmp_path / "lake")
    name = f"s_{uuid.uuid4().hex[:8]}"
    assert broker.sasl_bootstrap is not None
    with sasl_settings():
        report = ingest_topics(lake, name, broker.sasl_bootstrap, topic, schema=schema)
    assert_holds(lake, name, history)
    assert report.records > 0
    assert SASL_PASSWORD not in json.dumps(spark.sparkContext.getConf().getAll())
    assert SASL_PASSWORD not in repr(lake.table(name).state())


def test_sparks_own_connector_is_refused_a_setting_java_lacks_in_one_line(
        tmp_path: Path) -> None:
    """Spark's `kafka` connector takes the settings as the Java clients' `kafka.*` options
    (test_spark_kafka_connector.py); a librdkafka setting with no Java equivalent is refused
    in one line naming the key, before any Spark work."""
    from changelake.lake.kafka_ingest import connector_records

    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"sasl.username": SASL_USER, "sasl.password": SASL_PASSWORD,
                                    "sasl.mechanism": "PLAIN",
                                    "socket.keepalive.enable": "true"}))
    with pytest.raises(SecurityError, match=r"setting socket\.keepalive\.enable has no Java") as e:
        connector_records(None, {"securityFile": str(settings), "topics": "t"})
    assert SASL_PASSWORD not in str(e.value)


@pytest.mark.spark
def test_a_follow_reads_through_sasl(spark, broker: KafkaBroker, tmp_path: Path) -> None:
    """`ingest --follow --kafka`'s streaming source: its reader, made once when the query
    starts, takes the settings from the file; micro-batches read through SASL."""
    from changelake.lake import Lake
    from changelake.lake.follow import TOPICS, follow, topic_source, topics_address

    history, topic, schema = produce_history_with_schema(broker, 92, tmp_path)
    lake = Lake(spark, tmp_path / "lake")
    name = f"f_{uuid.uuid4().hex[:8]}"
    assert broker.sasl_bootstrap is not None
    with sasl_settings():
        done = follow(lake, name, topic_source(broker.sasl_bootstrap, [topic], schema=schema),
                      topics_address(broker.sasl_bootstrap, [topic]), kind=TOPICS,
                      trigger_seconds=0.5, until_idle=1.5)
    assert done.committed >= 1
    assert_holds(lake, name, history)
