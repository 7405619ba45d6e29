"""Spark's own Kafka connector (`spark-sql-kafka-0-10`, fetched by `spark.maven`) as the
ingest's reader (`reader="kafka"`), against the test run's Apache Kafka broker: the same
tables as `kafka-cdc` (Materialize CDC Avro topics, Debezium JSON topics), the planned
offsets and partitions, `failOnDataLoss` on deleted records, read-committed, and the security
settings passed as `kafka.*` options through the SASL/PLAIN listener, never shown (plans,
EXPLAIN, the session's settings, the JVM's log, an error)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from changelake.errors import ChangefeedError
from changelake.kafka import security, write_topic
from changelake.kafka.broker import KafkaBroker
from changelake.kafka.security import SecurityError, from_command_line, java_config
from changelake.lake import Lake
from changelake.lake.kafka_changefeed import ingest_changefeed_topics
from changelake.lake.kafka_ingest import connector_records, ingest_topics
from changelake.simulate import random_history, write
from changelake.spark import kafka_source
from tests.kafka.test_kafka_changefeed import pg_feed
from tests.lake.test_lake_kafka_changefeed import produce_debezium
from tests.support.kafka_helpers import SASL_PASSWORD, SASL_USER, new_topic, produce_raw, row_schema
from tests.support.seeding import seeded

pytestmark = pytest.mark.spark


@pytest.fixture
def lake(spark, tmp_path) -> Lake:
    return Lake(spark, tmp_path / "lake")


def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.json"
    path.write_bytes(orjson.dumps(row_schema().avro))
    return path


def table_rows(lake: Lake, name: str) -> Counter:
    out: Counter = Counter()
    for r in lake.table(name).updates().collect():
        out[tuple(sorted((k, str(v)) for k, v in r.asDict().items()))] += 1
    return out


def offsets(lake: Lake, name: str, topic: str) -> list[tuple[int, Any, Any]]:
    return [(p.partition, p.resume, p.reached)
            for p in lake.table(name).state().offsets.topic(topic).partitions]


def records(spark: Any, bootstrap: str, topic: str, **more: str) -> list[tuple]:
    """What Spark's connector reads of `topic` from the earliest to the latest offsets."""
    options = {**kafka_source.reader_options(bootstrap, [topic]), **more}
    rows = connector_records(spark, options).select("partition", "offset", "value").collect()
    return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows)


def test_materialize_topics_make_the_table_kafka_cdc_makes(broker: KafkaBroker, lake: Lake,
                                                          tmp_path: Path) -> None:
    """Two runs over a 3-partition topic of Confluent-framed Avro: each reader's table holds
    the same updates and records the same offsets per partition."""
    history = random_history(seeded(301), updates=200, times=12)
    messages = write(history, batch_size=5)
    topic = new_topic(broker, partitions=3)
    schema = schema_file(tmp_path)
    names = {r: f"c_{r.replace('-', '')}_{uuid.uuid4().hex[:6]}" for r in ("kafka-cdc", "kafka")}
    half = len(messages) // 2
    for part in (messages[:half], messages[half:]):
        write_topic(part, bootstrap=broker.bootstrap, topic=topic, schema=row_schema())
        reports = {r: ingest_topics(lake, n, broker.bootstrap, topic, schema=schema, reader=r)
                   for r, n in names.items()}
        assert reports["kafka"].records == reports["kafka-cdc"].records > 0
        assert reports["kafka"].ingest.frontier == reports["kafka-cdc"].ingest.frontier
        assert (offsets(lake, names["kafka"], topic)
                == offsets(lake, names["kafka-cdc"], topic))
    assert table_rows(lake, names["kafka"]) == table_rows(lake, names["kafka-cdc"])
    assert sum(table_rows(lake, names["kafka"]).values()) > 0


def test_debezium_topics_make_the_table_kafka_cdc_makes(broker: KafkaBroker,
                                                        lake: Lake) -> None:
    """Debezium JSON on a 2-partition table topic with the transaction topic."""
    feed = pg_feed(11, transactions=8, metadata=True)
    data, tx = new_topic(broker, 2), new_topic(broker, 1)
    names = {r: f"d_{r.replace('-', '')}_{uuid.uuid4().hex[:6]}.t" for r in ("kafka-cdc", "kafka")}
    produce_debezium(broker, data, tx, feed, slice(None), 2)
    for reader, name in names.items():
        ingest_changefeed_topics(lake, name, broker.bootstrap, [data, tx],
                                 source="debezium", key=["id"], reader=reader)
    assert table_rows(lake, names["kafka"]) == table_rows(lake, names["kafka-cdc"])
    assert sum(table_rows(lake, names["kafka"]).values()) > 0
    out = Producer({"bootstrap.servers": broker.bootstrap})
    out.produce(data, value=b"{not json", partition=1)
    assert out.flush(30) == 0
    before = table_rows(lake, names["kafka"])
    with pytest.raises(ChangefeedError, match=f"topic {data} partition 1, offset [0-9]+: "):
        ingest_changefeed_topics(lake, names["kafka"], broker.bootstrap, [data, tx],
                                 source="debezium", key=["id"], reader="kafka")
    assert table_rows(lake, names["kafka"]) == before  # nothing committed


def test_deleted_records_fail_the_read_unless_failondataloss_is_false(
        spark, broker: KafkaBroker) -> None:
    """Offsets planned before DeleteRecords: the connector fails the read (its own
    failOnDataLoss, the default), or with `failOnDataLoss=false` reads the records still
    held. (`kafka-cdc`'s batch read refuses a start before the first offset whatever
    failOnDataLoss says, test_spark_kafka_data_loss.py; the ingest plans on the driver and
    refuses a range the table needs that was deleted before reading, whichever reader.)"""
    topic = new_topic(broker, partitions=2)
    produce_raw(broker, topic, [(p, f"r-{p}-{i}".encode()) for p in (0, 1) for i in range(10)])
    planned = json.dumps({topic: {"0": 0, "1": 0}})
    ending = json.dumps({topic: {"0": 10, "1": 10}})
    broker.delete_records(topic, 0, 4)
    with pytest.raises(Exception, match=r"(?i)data loss|lost|out of range|offset") as failed:
        records(spark, broker.bootstrap, topic, startingOffsets=planned, endingOffsets=ending)
    assert "Traceback" not in str(failed.value).splitlines()[0]
    held = records(spark, broker.bootstrap, topic, startingOffsets=planned,
                   endingOffsets=ending, failOnDataLoss="false")
    assert [(p, o) for p, o, _ in held] == (
        [(0, o) for o in range(4, 10)] + [(1, o) for o in range(10)])


def test_read_committed_leaves_aborted_transactions_out(spark, broker: KafkaBroker) -> None:
    """A committed and an aborted transaction: the connector reads the committed records only,
    as `kafka-cdc` (librdkafka's default) does; the ingest sets `kafka.isolation.level`
    read_committed for it (Spark's default is the Java clients', read_uncommitted)."""
    topic = new_topic(broker, partitions=1)
    out = Producer({"bootstrap.servers": broker.bootstrap,
                    "transactional.id": f"t-{uuid.uuid4().hex[:8]}"})
    out.init_transactions(30)
    for tag, commit in (("kept", True), ("aborted", False), ("after", True)):
        out.begin_transaction()
        for i in range(3):
            out.produce(topic, value=f"{tag}-{i}".encode(), partition=0)
        out.flush(30)
        (out.commit_transaction if commit else out.abort_transaction)(30)
    values = [v for _, _, v in records(spark, broker.bootstrap, topic)]
    assert values == [f"{t}-{i}".encode() for t in ("kept", "after") for i in range(3)]
    every = [v for _, _, v in records(spark, broker.bootstrap, topic,
                                      **{"kafka.isolation.level": "read_uncommitted"})]
    assert len(every) == 9


def test_librdkafka_settings_become_the_java_clients() -> None:
    plain = java_config({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                         "sasl.username": "u", "sasl.password": 'p"q\\r',
                         "ssl.ca.location": "/ca.pem",
                         "ssl.endpoint.identification.algorithm": "none"})
    assert plain == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule '
                            'required username="u" password="p\\"q\\\\r";',
        "ssl.truststore.location": "/ca.pem", "ssl.truststore.type": "PEM",
        "ssl.endpoint.identification.algorithm": ""}
    scram = java_config({"sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "u",
                         "sasl.password": "p"})
    assert scram["sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.scram.ScramLoginModule required")
    with pytest.raises(SecurityError, match=r"setting socket\.keepalive\.enable has no Java") as e:
        java_config({"socket.keepalive.enable": "secret-value"})
    assert "secret-value" not in str(e.value)
    with pytest.raises(SecurityError, match=r"sasl\.mechanism GSSAPI"):
        java_config({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"})


def sasl_items(password: str = SASL_PASSWORD) -> list[str]:
    return ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN",
            f"sasl.username={SASL_USER}", f"sasl.password={password}"]


def test_sasl_settings_reach_the_connector_and_are_never_shown(
        spark, broker: KafkaBroker, lake: Lake, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    """`--kafka-conf` SASL/PLAIN settings: the connector reads through the SASL listener (the
    table equals kafka-cdc's), and the password is in no plan (`queryExecution`, the analyzed
    plan's text, EXPLAIN), no setting of the session, no line the JVM or Python wrote; a wrong
    password is an error without either password."""
    assert broker.sasl_bootstrap is not None
    history = random_history(seeded(303), updates=60, times=5)
    topic = new_topic(broker, partitions=2)
    write_topic(write(history, batch_size=5), bootstrap=broker.bootstrap, topic=topic,
                schema=row_schema())
    schema = schema_file(tmp_path)
    plain = f"p_{uuid.uuid4().hex[:8]}"
    ingest_topics(lake, plain, broker.bootstrap, topic, schema=schema)
    name = f"s_{uuid.uuid4().hex[:8]}"
    security.use(from_command_line(sasl_items()))
    try:
        ingest_topics(lake, name, broker.sasl_bootstrap, topic, schema=schema, reader="kafka")
        options = kafka_source.reader_options(broker.sasl_bootstrap, [topic])
        frame = connector_records(spark, options)
        shown = [frame._jdf.queryExecution().toString(),
                 frame._jdf.queryExecution().logical().toString(),
                 frame._jdf.queryExecution().analyzed().toString(),
                 *(spark._jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(), mode)
                   for mode in ("extended", "formatted", "cost"))]
        assert frame.count() > 0
        for text in shown:
            assert SASL_PASSWORD not in text, text
    finally:
        security.use(None)
    assert table_rows(lake, name) == table_rows(lake, plain)
    security.use(from_command_line(sasl_items("wrong-" + SASL_PASSWORD[::-1])))
    try:
        with pytest.raises(Exception) as failed:
            ingest_topics(lake, f"w_{uuid.uuid4().hex[:8]}", broker.sasl_bootstrap, topic,
                          schema=schema, reader="kafka")
    finally:
        security.use(None)
    for text in (str(failed.value), repr(failed.value)):
        assert SASL_PASSWORD not in text and SASL_PASSWORD[::-1] not in text
    assert SASL_PASSWORD not in json.dumps(spark.sparkContext.getConf().getAll())
    assert "jaas" in spark.conf.get("spark.sql.redaction.options.regex")
    output = capfd.readouterr()
    assert SASL_PASSWORD not in output.out + output.err
    assert SASL_PASSWORD[::-1] not in output.out + output.err


def test_from_avro_decodes_confluent_frames_as_the_python_decoder_does(
        spark, broker: KafkaBroker) -> None:
    """spark-avro's `from_avro` over `substring(value, 6)` (the Confluent header stripped)
    gives the very rows `messages_from_records` gives; a frame of another schema id fails
    naming topic, partition and offset."""
    from changelake.errors import InputError
    from changelake.spark.errors import translate_errors
    from changelake.spark.kafka_records import messages_from_avro, messages_from_records

    history = random_history(seeded(305), updates=80, times=6)
    topic = new_topic(broker, partitions=2)
    write_topic(write(history, batch_size=4), bootstrap=broker.bootstrap, topic=topic,
                schema=row_schema())
    read = connector_records(spark, kafka_source.reader_options(broker.bootstrap, [topic]))

    def rows(frame: Any) -> list[Any]:
        return sorted((r.asDict(recursive=True) for r in frame.collect()),
                      key=lambda r: (r["_file"], r["_offset"]))

    jvm = rows(messages_from_avro(read, row_schema()))
    assert jvm == rows(messages_from_records(read, schema=row_schema()))
    assert len(jvm) > 0 and any(r["progress"] for r in jvm) and any(r["updates"] for r in jvm)
    for partition, value in ((1, b"\x00\x00\x00\x00\x07not avro"),  # another schema id
                             (0, b"\x00\x00\x00\x00\x00\x09"),  # no such union branch
                             (0, None)):  # a tombstone
        bad = new_topic(broker, partitions=2)
        produce_raw(broker, bad, [(partition, value)])
        read = connector_records(spark, kafka_source.reader_options(broker.bootstrap, [bad]))
        with pytest.raises(InputError, match=rf"topic {bad} partition {partition}, offset 0: "
                                             "not a Confluent frame of schema id 0"):
            translate_errors(messages_from_avro(read, row_schema()).collect)
