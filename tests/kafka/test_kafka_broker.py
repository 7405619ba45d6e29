"""The real Apache Kafka broker the Kafka tests run against (`changelake.kafka.broker`): it
answers, keeps its records across a restart (clean or killed), serves its SASL/PLAIN listener
to the right password only, and a start that fails is one line naming the broker's log."""

from __future__ import annotations

import base64
import stat
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from changelake.kafka.broker import BrokerError, KafkaBroker, _cluster_id
from tests.support.kafka_helpers import SASL_PASSWORD, SASL_USER, new_topic
from tests.support.paths import ROOT


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0


def _watermarks(consumer: Consumer, topic: str) -> tuple[int, int]:
    """The partition's offsets, asked again while the restarted broker is still electing its
    leader (NOT_LEADER_FOR_PARTITION for a moment after a start, as a client sees it)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        except KafkaException as error:
            retriable = error.args[0].code() in (KafkaError.NOT_LEADER_FOR_PARTITION,
                                                 KafkaError.LEADER_NOT_AVAILABLE)
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def read_all(bootstrap: str, topic: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "read-all",
                         "enable.auto.commit": False})
    low, high = _watermarks(consumer, topic)
    consumer.assign([TopicPartition(topic, 0, low)])
    out = []
    while len(out) < high - low:
        record = consumer.poll(30)
        assert record is not None, "the broker stopped delivering"
        assert not record.error(), record.error()
        out.append(record.value())
    consumer.close()
    return out


def test_the_broker_keeps_records_across_a_clean_and_a_killed_restart(broker: KafkaBroker
                                                                       ) -> None:
    topic = new_topic(broker, partitions=1)
    produce(broker.bootstrap, topic, [b"a", b"b"])
    address = broker.bootstrap
    broker.stop()
    assert not broker.running
    broker.start()
    produce(broker.bootstrap, topic, [b"c"])
    broker.kill()
    broker.start()
    assert broker.bootstrap == address
    assert read_all(broker.bootstrap, topic) == [b"a", b"b", b"c"]
    folder = broker.folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert (folder / "broker.log").stat().st_size > 0


def sasl(broker: KafkaBroker, password: str) -> dict[str, str]:
    assert broker.sasl_bootstrap is not None
    return {"bootstrap.servers": broker.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": SASL_USER, "sasl.password": password}


def test_the_sasl_listener_takes_the_right_password_only(broker: KafkaBroker) -> None:
    topic = new_topic(broker, partitions=1)
    metadata = AdminClient(sasl(broker, SASL_PASSWORD)).list_topics(timeout=30)
    assert topic in metadata.topics
    assert [b.port for b in metadata.brokers.values()] == [broker.sasl_port]
    heard: list[KafkaError] = []
    wrong = AdminClient({**sasl(broker, SASL_PASSWORD + "x"), "log_level": 0,
                         "error_cb": heard.append})
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=3)
    wrong.poll(1)
    assert KafkaError._AUTHENTICATION in {e.code() for e in heard}, heard


def test_a_broker_that_cannot_start_is_one_line_naming_its_log(tmp_path: Path) -> None:
    bad = KafkaBroker(tmp_path / "bad", settings={"process.roles": "nonsense"},
                      die_with_parent=True)
    with pytest.raises(BrokerError) as failure, bad:
        pass
    message = str(failure.value)
    assert "\n" not in message
    assert str(tmp_path / "bad" / "broker.log") in message
    assert (tmp_path / "bad" / "broker.log").stat().st_size > 0


def test_a_failed_start_in_a_folder_of_its_own_keeps_the_log_it_names() -> None:
    """A broker that makes its own folder keeps it when its start fails: the error names the
    log in it (the setup's class archive run failed so once, and its log was gone)."""
    import re
    import shutil

    with pytest.raises(BrokerError) as failure, \
            KafkaBroker(settings={"process.roles": "nonsense"}, die_with_parent=True):
        pass
    named = re.search(r"its log: (\S+broker\.log)", str(failure.value))
    assert named is not None, failure.value
    log = Path(named.group(1))
    try:
        assert log.stat().st_size > 0
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)


def test_the_setup_fetches_once_and_without_maven_says_so_in_one_line(tmp_path: Path) -> None:
    import re

    from changelake.kafka.broker import KAFKA_VERSION, POM, fetch_jars, jar_folder, jars_present

    root = ROOT
    pom = (root / POM).read_text()
    assert re.search(r"<kafka.version>(.*?)</kafka.version>", pom)[1] == KAFKA_VERSION  # type: ignore[index]
    assert jars_present()  # the setup ran: a second run needs no Maven and changes nothing
    before = sorted(p.name for p in jar_folder().iterdir())
    assert fetch_jars(root / POM, mvn="no-such-mvn") == jar_folder()
    assert sorted(p.name for p in jar_folder().iterdir()) == before
    assert f"kafka_2.13-{KAFKA_VERSION}.jar" in before
    with pytest.raises(BrokerError) as failure:
        fetch_jars(root / POM, mvn="no-such-mvn", target=tmp_path / "jars")
    assert "Maven (`no-such-mvn`) is required" in str(failure.value)
    assert "\n" not in str(failure.value) and not (tmp_path / "jars").exists()


def test_the_setups_class_archive_is_mapped_by_the_brokers_jvm(broker: KafkaBroker) -> None:
    """`-Xshare:on` makes a JVM fail unless it maps the archive: the setup's archive fits this
    Java and the broker's class path, and the broker's JVM is told to map it."""
    import subprocess

    from changelake.kafka.broker import MAIN_CLASS, _java, archive_path, jar_folder

    archive = archive_path()
    assert archive.is_file(), "scripts/install.sh makes it (python -m changelake.kafka.broker)"
    assert f"-XX:SharedArchiveFile={archive}" in broker._command(MAIN_CLASS)
    done = subprocess.run([_java(), "-Xshare:on", f"-XX:SharedArchiveFile={archive}",
                           "-cp", f"{jar_folder()}/*", "-version"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_cluster_id_is_never_taken_for_an_option() -> None:
    """`kafka-storage format -t ID` refuses an id starting with "-" (one random UUID in 64 in
    URL-safe base64): the setup's class archive and a test's broker then failed to start."""
    ids = [_cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert {len(base64.urlsafe_b64decode(i + "==")) for i in ids} == {16}
    assert len(set(ids)) == len(ids)
