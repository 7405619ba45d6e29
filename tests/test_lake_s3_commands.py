"""`capture postgres --lake s3a://...` against moto's S3 server on loopback and the embedded
PostgreSQL, through the real console script: the initial snapshot and the changes after it
land in Delta tables that live only on the S3 server, a second run resumes from the slot,
and the tables then hold the database's rows (read back without a JVM, `--engine arrow`,
and by `status`'s consistent frontier). The lake's other commands on S3:
`test_lake_s3.py`; follow: `test_lake_s3_follow.py`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg2
import pytest

from conftest import execute
from s3_server import SECRET_KEY, S3Server, s3_server
from test_lake_s3 import environment, ok, run


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
    keys = s3.keys("capture/")
    assert any("_delta_log" in k for k in keys), keys[:20]
    for key in keys:  # the DSN's and the S3 key's secrets stay out of the lake's metadata
        if key.endswith((".json", ".crc")):
            body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            assert SECRET_KEY.encode() not in body
