"""The lake's commands on a Spark standalone cluster (a master and two workers on 127.0.0.1,
`test_spark_cluster.standalone`) with the lake only on moto's S3 server: `ingest --from
debezium` of files, `ingest --kafka` of a Debezium topic (librdkafka's mock cluster),
`compact` and `snapshot`, run with `--master spark://...`, give the tables local mode gives
(the topic's table made in local mode too; the files' rows are `test_lake_s3.EXPECTED`'s);
`capture postgres --lake` from the embedded PostgreSQL gives the database's rows.

The workers share no directory with the driver, and their environment has no AWS setting:
the store's endpoint and key pair reach the executors the way a user gives them to the
driver (the AWS SDK's environment, which the driver's session turns into its S3A settings),
never on a command line; the executors' launch commands, logs and work directories hold no
secret."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lake.test_lake_s3 import NOW, SAMPLE, environment, ok, pairs, run
from tests.spark.test_spark_cluster import standalone
from tests.support.kafka_helpers import MockCluster, cluster, new_topic
from tests.support.s3_server import SECRET_KEY, S3Server, s3_server
from tests.support.seeding import seeded

pytestmark = [pytest.mark.spark, pytest.mark.slow]
__all__ = ["cluster"]  # fixtures: Kafka's mock cluster


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Path]]]:
    """The standalone cluster, its workers started without any AWS setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with standalone(tmp_path_factory.mktemp("s3-cluster"), env) as running:
        yield running


def kafka_table(lake: str, master: list[str], kafka: MockCluster, topic: str,
                env: dict[str, str]) -> list[bytes]:
    """`ingest --kafka` of the Debezium topic into `shop.kafka` of `lake` on `master`, and
    the table's rows (`snapshot` on the same master)."""
    common = ["--lake", lake, *master]
    ok(run("ingest", *common, "--table", "shop.kafka", "--key", "id", "--from", "debezium",
           "--kafka", kafka.bootstrap, "--topic", topic, "--close", env=env))
    rows = ok(run("snapshot", *common, "--table", "shop.kafka", "--format", "jsonl",
                  "--engine", "spark", env=env))
    return sorted(rows.stdout.splitlines())


@pytest.mark.timeout(3600)
def test_lake_commands_on_a_standalone_cluster_with_the_lake_on_s3(
        s3: S3Server, spark_cluster: tuple[str, list[Path]], cluster: MockCluster,
        tmp_path: Path) -> None:
    from tests.kafka.test_kafka_changefeed import pg_feed
    from tests.lake.test_lake_kafka_changefeed import produce_debezium

    url, work_dirs = spark_cluster
    feed = pg_feed(seeded(6603).randrange(1 << 30), transactions=12, metadata=False)
    topic = new_topic(cluster, 3)
    produce_debezium(cluster, topic, None, feed, slice(0, len(feed.events)), 3)
    env = environment(s3, tmp_path)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    lake = s3.lake("on-cluster")
    on_cluster = ["--lake", lake, "--master", url, "--conf", "spark.executor.memory=768m",
                  "--conf", "spark.executor.cores=1"]
    # the Debezium sample, compacted: the local lake's rows (`test_lake_s3.EXPECTED`)
    ok(run("ingest", *on_cluster, "--table", "shop.orders", "--key", "order_id", "--from",
           "debezium", "--close", str(SAMPLE), env=env))
    ok(run("compact", *on_cluster, "--table", "shop.orders", env=env))
    assert pairs(run("snapshot", *on_cluster, "--table", "shop.orders", "--format", "jsonl",
                     "--engine", "spark", env=env)) == NOW
    # a Debezium topic: the cluster's table is the one local mode makes of it
    remote = kafka_table(lake, on_cluster[2:], cluster, topic, env)
    local = kafka_table(s3.lake("local-mode"), ["--master", "local[1]"], cluster, topic, env)
    assert remote == local and remote
    # the executors ran tasks, and nothing of theirs holds the secret
    logs = [p for work in work_dirs for p in work.rglob("*") if p.is_file()]
    assert any(b"Finished task" in p.read_bytes() for p in logs if p.name == "stderr"), logs
    assert not any(SECRET_KEY.encode() in p.read_bytes() for p in logs)
    assert not any(SECRET_KEY.encode() in p.read_bytes()
                   for p in work_dirs[0].parent.glob("*.log"))


@pytest.mark.timeout(2400)
def test_capture_postgres_on_a_standalone_cluster_with_the_lake_on_s3(
        s3: S3Server, spark_cluster: tuple[str, list[Path]], pg_dsn: str,
        tmp_path: Path) -> None:
    """`capture postgres --lake s3a://... --master spark://...`: the snapshot, then a resumed
    capture of updates, deletes and a multi-statement transaction, committed by the
    cluster's executors into the lake on S3; each time the table equals the database."""
    from tests.lake.test_lake_s3_commands import database_rows, lake_rows
    from tests.support.postgres import execute

    url, work_dirs = spark_cluster
    execute(pg_dsn,
            "CREATE SCHEMA shop",
            "CREATE TABLE shop.orders (id int PRIMARY KEY, item text NOT NULL, qty int)",
            "INSERT INTO shop.orders SELECT g, 'item ' || g, g FROM generate_series(1, 40) g",
            "CREATE PUBLICATION orders FOR TABLE shop.orders")
    env = environment(s3, tmp_path)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    lake = s3.lake("captured-on-cluster")
    capture = ["capture", "postgres", "--lake", lake, "--master", url, "--conf",
               "spark.executor.memory=768m", "--conf", "spark.executor.cores=1", "--dsn",
               pg_dsn, "--publication", "orders", "--slot", "cluster_orders", "--until-idle",
               "3"]
    before = {app for work in work_dirs for app in work.iterdir()}
    ok(run(*capture, "--create-slot", env=env))  # the snapshot, then idle
    assert lake_rows(lake, env) == database_rows(pg_dsn)
    # the capture's application ran tasks on the workers
    apps = [app for work in work_dirs for app in work.iterdir() if app not in before]
    assert any(b"Finished task" in p.read_bytes() for app in apps for p in app.rglob("stderr")
               ), apps
    execute(pg_dsn,
            "UPDATE shop.orders SET qty = qty * 10 WHERE id % 3 = 0",
            "DELETE FROM shop.orders WHERE id % 7 = 0",
            "INSERT INTO shop.orders VALUES (41, 'late', NULL)",
            "BEGIN; UPDATE shop.orders SET item = 'moved' WHERE id = 1; "
            "DELETE FROM shop.orders WHERE id = 2; COMMIT")
    ok(run(*capture, env=env))  # resumes from the slot's confirmed position
    assert lake_rows(lake, env) == database_rows(pg_dsn)
    logs = [p for work in work_dirs for p in work.rglob("*") if p.is_file()]
    assert not any(SECRET_KEY.encode() in p.read_bytes() for p in logs)
