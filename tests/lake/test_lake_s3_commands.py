"""`capture`, `export`, `sql` and changefeed follow on a lake that lives only on moto's S3
server on loopback, through the real console script; all in the slow tier (each several
Spark processes).

`capture postgres --lake s3a://...` from the embedded PostgreSQL: the initial snapshot and
the changes after it land in Delta tables on the S3 server, a second run resumes from the
slot, and the tables then hold the database's rows (read back without a JVM, `--engine
arrow`, and by `status`'s consistent frontier); `export --to delta` of the captured table
into a local Delta table, read back by delta-rs. An export into a Delta table on the S3
server, run twice (the second adds nothing); `sql` serving an S3 lake's table and its AS
OF function to beeline; `ingest --follow --kafka --from debezium` into an S3 lake; a capture
killed with SIGKILL under a workload, losing and doubling nothing. The lake's other commands
on S3: `test_lake_s3.py`; a directory followed: `test_lake_s3_follow.py`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg2
import pytest
from deltalake import DeltaTable

from tests.lake.test_lake_s3 import AT_0, NOW, SAMPLE, environment, ok, run
from tests.support.kafka_helpers import cluster
from tests.support.postgres import execute
from tests.support.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server, s3_server

__all__ = ["cluster"]  # fixtures


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def database_rows(dsn: str) -> list[tuple[int, str, int]]:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT id, item, qty FROM shop.orders ORDER BY id")
        rows = [tuple(r) for r in c.fetchall()]
    conn.close()
    return rows


def lake_rows(lake: str, env: dict[str, str]) -> list[tuple[int, str, int]]:
    out = ok(run("snapshot", "--lake", lake, "--table", "shop.orders", "--format", "jsonl",
                 "--engine", "arrow", env=env))
    return sorted((r["id"], r["item"], r["qty"]) for r in map(orjson.loads,
                                                                 out.stdout.splitlines()))


@pytest.mark.slow  # four Spark processes (75-150 s on CI): the default run's S3 lake is
# test_lake_s3.py's (ingest, both engines' reads, status, the lock, the credentials)
@pytest.mark.timeout(1200)
def test_capture_into_an_s3_lake_and_resume(s3: S3Server, pg_dsn: str, tmp_path: Path) -> None:
    execute(pg_dsn,
            "CREATE SCHEMA shop",
            "CREATE TABLE shop.orders (id int PRIMARY KEY, item text NOT NULL, qty int)",
            "INSERT INTO shop.orders SELECT g, 'item ' || g, g FROM generate_series(1, 30) g",
            "CREATE PUBLICATION orders FOR TABLE shop.orders")
    lake, env = s3.lake("capture"), environment(s3, tmp_path)
    capture = ["capture", "postgres", "--lake", lake, "--master", "local[1]", "--dsn", pg_dsn,
               "--publication", "orders", "--slot", "s3_orders", "--until-idle", "2"]
    ok(run(*capture, "--create-slot", env=env))  # the snapshot, then idle
    assert lake_rows(lake, env) == database_rows(pg_dsn)

    execute(pg_dsn,
            "UPDATE shop.orders SET qty = qty * 10 WHERE id % 3 = 0",
            "DELETE FROM shop.orders WHERE id % 5 = 0",
            "INSERT INTO shop.orders VALUES (31, 'late', NULL)",
            "BEGIN; UPDATE shop.orders SET item = 'moved' WHERE id = 1; "
            "DELETE FROM shop.orders WHERE id = 2; COMMIT")
    ok(run(*capture, env=env))  # resumes from the slot's confirmed position
    assert lake_rows(lake, env) == database_rows(pg_dsn)

    status = ok(run("status", "--lake", lake, "--format", "jsonl", "--engine", "arrow",
                    env=env))
    lines = [orjson.loads(line) for line in status.stdout.splitlines()]
    (table,) = [r for r in lines if r.get("name") == "shop.orders"]
    assert table["rows"] == len(database_rows(pg_dsn)) and table["source"]
    (source,) = [r for r in lines if "database" in r]  # its consistent frontier
    assert source["tables"] == ["shop.orders"] and source["frontier_lsn"], source
    # `export` from the S3 lake: the captured table as a local Delta table
    target = tmp_path / "exported"
    ok(run("export", "--lake", lake, "--master", "local[1]", "--table", "shop.orders", "--to",
           "delta", str(target), env=env))
    exported = DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["item"], r["qty"]) for r in exported) == database_rows(pg_dsn)
    keys = s3.keys("capture/")
    assert any("_delta_log" in k for k in keys), keys[:20]
    for key in keys:  # the DSN's and the S3 key's secrets stay out of the lake's metadata
        if key.endswith((".json", ".crc")):
            body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            assert SECRET_KEY.encode() not in body


def ingested(s3: S3Server, prefix: str, env: dict[str, str]) -> str:
    """A lake on the S3 server holding `test_lake_s3`'s sample as table shop.orders."""
    lake = s3.lake(prefix)
    ok(run("ingest", "--lake", lake, "--master", "local[1]", "--table", "shop.orders",
           "--key", "order_id", "--from", "debezium", "--close", str(SAMPLE), env=env))
    return lake


@pytest.mark.slow  # three Spark processes
@pytest.mark.timeout(1200)
def test_export_from_an_s3_lake_into_a_delta_table_on_s3(s3: S3Server, tmp_path: Path) -> None:
    env = environment(s3, tmp_path)
    lake = ingested(s3, "export", env)
    target = f"s3a://{s3.bucket}/exported/orders"
    export = ["export", "--lake", lake, "--master", "local[1]", "--table", "shop.orders",
              "--to", "delta", target]
    ok(run(*export, env=env))
    ok(run(*export, env=env))  # nothing new: exactly once, no second copy
    store = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true",
             "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    exported = DeltaTable(target.replace("s3a://", "s3://"), storage_options=store)
    assert exported.version() == 0  # the second run committed nothing
    rows = exported.to_pyarrow_table().to_pylist()
    assert sorted((r["order_id"], r["product_id"]) for r in rows) == NOW


@pytest.mark.slow  # the ingest, the server and beeline: three JVMs
@pytest.mark.timeout(1200)
def test_sql_serves_an_s3_lake(s3: S3Server, tmp_path: Path) -> None:
    import re
    import signal

    from tests.lake.test_lake_sql_endpoint import beeline, results, sql_server

    env = environment(s3, tmp_path)
    with sql_server(ingested(s3, "sql", env), tmp_path, env) as (server, out, err):
        port = int(re.search(r"127\.0\.0\.1:(\d+)/", out.read_text()).group(1))
        script = tmp_path / "queries.sql"
        script.write_text("SELECT 'now' AS q, order_id, product_id FROM shop.orders;\n"
                          "SELECT 'at0' AS q, order_id, product_id "
                          "FROM shop_orders_as_of(0);\n")
        got = results(beeline(port, script).stdout)
        assert sorted((int(a), int(b)) for a, b in got["now"]) == NOW
        assert sorted((int(a), int(b)) for a, b in got["at0"]) == AT_0
        assert SECRET_KEY not in out.read_text() + err.read_text()
        server.send_signal(signal.SIGTERM)
        assert server.wait(120) == 0, err.read_text()[-3000:]


@pytest.mark.slow  # two Spark processes besides the reference ingest in the test's session
@pytest.mark.timeout(1200)
def test_changefeed_follow_into_an_s3_lake(s3: S3Server, cluster, spark, tmp_path: Path
                                           ) -> None:
    """`ingest --follow --kafka --from debezium` into a lake on S3 (rounds of Kafka ingests,
    each committed with its offsets in the Delta table's log), then `ingest --kafka --close`:
    the table's rows are those of the file ingest of the same events."""
    from changelake.lake import Lake, api
    from tests.kafka.test_kafka_changefeed import pg_feed, write_files
    from tests.lake.test_lake_kafka_changefeed import produce_debezium, reference
    from tests.support.kafka_helpers import new_topic
    from tests.support.seeding import seeded

    feed = pg_feed(seeded(86).randrange(1 << 30), transactions=12, metadata=False)
    local = Lake(spark, tmp_path / "reference-lake")
    ref = reference(local, write_files(feed, tmp_path, metadata=False), "debezium", key=["id"])
    data = new_topic(cluster, 3)
    produce_debezium(cluster, data, None, feed, slice(0, len(feed.events)), 3)
    lake, env = s3.lake("changefeed-follow"), environment(s3, tmp_path)
    base = ["ingest", "--lake", lake, "--table", "t", "--key", "id", "--from", "debezium",
            "--kafka", cluster.bootstrap, "--topic", data, "--master", "local[1]"]
    followed = ok(run(*base, "--follow", "--trigger-seconds", "0.5", "--until-idle", "2",
                      env=env))
    assert b"round 1: read " in followed.stderr
    ok(run(*base, "--close", env=env))
    out = ok(run("snapshot", "--lake", lake, "--table", "t", "--format", "jsonl", "--engine",
                 "arrow", env=env))

    def shown(row: dict) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in row.items()))

    got = sorted(shown(orjson.loads(line)) for line in out.stdout.splitlines())
    want = sorted(shown(r) for r in api.snapshot(local, ref))
    assert got == want and got


@pytest.mark.slow  # two to four Spark processes, killed and restarted
@pytest.mark.timeout(1800)
def test_kill_capture_into_an_s3_lake(s3: S3Server, pg_dsn: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`test_capture_pg_kill`'s kill -9 of a capture under a workload, into a lake only on the
    S3 server: after the restarts, every table equals its PostgreSQL table and the slot is
    not confirmed past the lake's frontier."""
    from tests.support.pg_workload import kill_and_check, lake_destination

    for name, value in s3.environment().items():  # the capture runs inherit them
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CHANGELAKE_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CHANGELAKE_TABLE_FORMAT", raising=False)
    kill_and_check(pg_dsn, 3, lake_destination(s3.lake("kill"), dump=tmp_path / "lake.dump"),
                   tmp_path)
