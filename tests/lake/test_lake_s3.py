"""A lake on S3 (`--lake s3a://bucket/prefix`), against moto's S3 server on loopback: every
lake command once, with the results a local lake gives (in the default run through click in
this process on the test run's session, `InProcess`; in the slow tier through the real
console script, a process each), and an ingest killed with SIGKILL then run again; a
lake that cannot be reached, a bucket that does not exist and missing credentials each one
line naming the URI (exit 2, no traceback, no secret); a Hive-format table there too;
a second writer refused cleanly by the table's lock object, in either format; and (slow
tier) Debezium ingests killed with SIGKILL while they hold the table and run again, nothing
lost or doubled.
(`ingest --follow` on an S3 lake: `test_lake_s3_follow.py`.)

The key pair and the endpoint reach the command processes in the AWS SDK's environment
variables only (`s3_server.command_environment`), never on a command line; `InProcess` sets
them on the shared session's Hadoop configuration for its test, then unsets them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.paths import SAMPLES, SUPPORT
from tests.support.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, command_environment, s3_server

CLI = [str(Path(sys.executable).parent / "changelake")]
SAMPLE = SAMPLES / "derived-rw-debezium-postgres-values.jsonl"

NOW = [(1, 3), (2, 2), (3, 2)]  # one row per key, order 1 moved to product 3
AT_0 = [(1, 1), (2, 2), (3, 2)]  # as of time 0: before the move


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def run(*args: str, env: dict[str, str], cwd: Path | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=900, env=env, cwd=cwd)


def environment(s3: S3Server, tmp_path: Path, *, credentials: bool = True) -> dict[str, str]:
    env = command_environment(s3, credentials=credentials)
    env["CHANGELAKE_STATE_HOME"] = str(tmp_path / "state")  # the remote lakes' metastores
    env["CHANGELAKE_LOCK_WAIT_SECONDS"] = "2"
    env.pop("CHANGELAKE_TABLE_FORMAT", None)  # Delta tables, unless a test names the format
    return env


def ok(out: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert out.returncode == 0, out.stderr.decode()
    assert SECRET_KEY.encode() not in out.stdout + out.stderr
    return out


def pairs(out: subprocess.CompletedProcess) -> list[tuple[int, int]]:
    return sorted((r["order_id"], r["product_id"])
                  for r in map(orjson.loads, ok(out).stdout.splitlines()))


def every_command(lake: str, env: dict[str, str], work: Path, *, run: Any = run,
                  database: str = "shop") -> dict[str, object]:
    """Every lake command once on `lake`: what each gave, comparable between lakes. `run`
    runs one command (`run`: a process of the console script; `InProcess`: click in this
    process, on the test run's session); the tables are `database`'s `orders` and `copy`."""
    common = ["--lake", lake, "--master", "local[1]"]
    table = ["--table", f"{database}.orders"]
    got: dict[str, object] = {}
    ok(run("ingest", *common, *table, "--key", "order_id", "--from", "debezium", "--close",
           str(SAMPLE), env=env))
    got["now"] = pairs(run("snapshot", *common, *table, "--format", "jsonl", env=env))
    got["as_of"] = pairs(run("snapshot", *common, *table, "--format", "jsonl", "--as-of",
                             "0", env=env))
    schema, log = work / "schema.json", work / "orders.cdc.jsonl"
    changes = ok(run("changes", *common, *table, "--since", "0", "--schema-out", str(schema),
                     env=env))
    log.write_bytes(changes.stdout)
    got["changes"] = sorted(
        (u["time"], u["diff"], u["data"]["order_id"]["long"], u["data"]["product_id"]["long"])
        for line in changes.stdout.splitlines() for u in orjson.loads(line).get("array", ()))
    # the change feed, as Materialize CDC files, into a second table
    copy = ["--table", f"{database}.copy"]
    ok(run("ingest", *common, *copy, "--key", "order_id", "--schema", str(schema), str(log),
           env=env))
    got["copy"] = pairs(run("snapshot", *common, *copy, "--format", "jsonl", env=env))
    ok(run("compact", *common, *table, env=env))
    status = ok(run("status", *common, "--format", "jsonl", env=env))
    got["status"] = sorted((r["name"].replace(database, "shop", 1), r["rows"], r["frontier"],
                            r["since"])
                           for r in map(orjson.loads, status.stdout.splitlines()))
    return got


EXPECTED = {
    "now": NOW,
    "as_of": AT_0,
    "changes": [(0, 1, 1, 1), (0, 1, 2, 2), (0, 1, 3, 2), (23911952, -1, 1, 1),
                (23911952, 1, 1, 3)],
    "copy": NOW,
    "status": [("shop.copy", 3, [], 0), ("shop.orders", 3, [], 23911952)],
}
"""What `every_command` gives on a local lake (`test_an_s3_lake_equals_a_local_lake`)."""


def test_ingest_snapshot_and_status_on_s3(s3: S3Server, tmp_path: Path) -> None:
    """A Debezium feed ingested into a Delta table with the lake only on the S3 server,
    read back (on Spark with another machine's metastore, and without a JVM) and its status:
    what a local lake gives (`EXPECTED`); the table's files, manifests and Delta logs on the
    store, its metastore local, the writer's lock released, no secret in the lake's metadata."""
    env = environment(s3, tmp_path)
    common = ["--lake", s3.lake("first"), "--master", "local[1]"]
    ok(run("ingest", *common, "--table", "shop.orders", "--key", "order_id", "--from",
           "debezium", "--close", str(SAMPLE), env=env))
    # read on Spark on "another machine" (a metastore of its own, which registers the table
    # at its first use), and without a JVM (pyarrow's S3 file system and delta-rs)
    elsewhere = {**env, "CHANGELAKE_STATE_HOME": str(tmp_path / "elsewhere")}
    assert pairs(run("snapshot", *common, "--table", "shop.orders", "--format", "jsonl",
                     "--engine", "spark", env=elsewhere)) == NOW
    assert pairs(run("snapshot", *common, "--table", "shop.orders", "--format", "jsonl",
                     "--engine", "arrow", env=env)) == NOW
    status = ok(run("status", *common, "--format", "jsonl", env=env))  # auto: without a JVM
    (row,) = map(orjson.loads, status.stdout.splitlines())
    assert (row["name"], row["rows"], row["frontier"], row["since"]) == \
        ("shop.orders", 3, [], 0)
    keys = s3.keys("first/")
    assert any(k.startswith("first/tables/shop/orders/updates/_delta_log/") for k in keys)
    assert any(k.startswith("first/tables/shop/orders/current/_delta_log/") for k in keys)
    assert "first/tables/shop/orders/_state/v1.json" in keys
    assert not any(k.endswith("/_lock") for k in keys)  # the writer's lock is released
    assert not any("metastore" in k for k in keys)  # the metastore is local
    assert list((tmp_path / "state" / "lakes").glob("*/metastore/metastore_db"))
    for key in keys:  # no secret in the lake's metadata
        if key.endswith((".json", ".crc")):
            body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            assert SECRET_KEY.encode() not in body and ACCESS_KEY.encode() not in body


@pytest.mark.slow  # eight Spark processes
@pytest.mark.timeout(1800)
def test_every_lake_command_on_s3(s3: S3Server, tmp_path: Path) -> None:
    """ingest (Debezium, and Materialize CDC files), snapshot now and AS OF, changes,
    compact and status, with the lake only on the S3 server: the local lake's results."""
    assert every_command(s3.lake("every"), environment(s3, tmp_path), tmp_path) == EXPECTED


class InProcess:
    """`every_command`'s `run` in this process: each command through click on the test
    run's SparkSession (its lake opened on that session, which S3A reaches the server
    through: `fs.s3a.*` set on its Hadoop configuration for the test, then unset), giving
    what a process would (exit status, stdout, stderr). The lake on the store is the
    product's; only the JVM is shared, so that the default run checks every command on S3
    in seconds rather than a Spark process each (the slow tier runs them as processes)."""

    KEYS = ("fs.s3a.endpoint", "fs.s3a.path.style.access", "fs.s3a.endpoint.region",
            "fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.connection.ssl.enabled")

    def __init__(self, spark: Any, s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
        from changelake.cli import ingest as cli_ingest
        from changelake.cli import maintain as cli_maintain
        from changelake.cli import read as cli_read
        from changelake.lake.catalog import Lake

        def on_this_session(lake_dir: Any, metastore_uri: Any, master: Any, conf: Any,
                            table_format: Any = None, *, existing: bool = False) -> Lake:
            return Lake(spark, lake_dir, storage=table_format)

        for module in (cli_ingest, cli_read, cli_maintain):
            monkeypatch.setattr(module, "open_lake", on_this_session)
        monkeypatch.setattr(type(spark), "stop", lambda self: None)  # the commands' last step
        for name, value in s3.environment().items():  # delta-rs's and pyarrow's settings
            monkeypatch.setenv(name, value)
        self.hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        env = s3.environment()
        values = (env["AWS_ENDPOINT_URL"], "true", env["AWS_REGION"], ACCESS_KEY, SECRET_KEY,
                  "false")
        for key, value in zip(self.KEYS, values, strict=True):
            self.hadoop.set(key, value)

    def close(self) -> None:
        for key in self.KEYS:
            self.hadoop.unset(key)

    def __call__(self, *args: str, env: dict[str, str], cwd: Path | None = None
                 ) -> subprocess.CompletedProcess:
        from click.testing import CliRunner

        from changelake.cli import main

        result = CliRunner(env=env).invoke(main, list(args))
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            repr(result.exception))
        return subprocess.CompletedProcess(args, result.exit_code, result.stdout_bytes,
                                           result.stderr_bytes)


@pytest.mark.spark
def test_every_lake_command_on_s3_in_this_process(s3: S3Server, spark: Any, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """ingest (Debezium, and Materialize CDC files), snapshot now and AS OF, changes,
    compact and status on a lake only on the S3 server, into Delta tables: the local lake's
    results (`EXPECTED`), no secret in the lake's objects."""
    database = "s3_every"
    spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")
    run_here = InProcess(spark, s3, monkeypatch)
    try:
        env = {"CHANGELAKE_TABLE_FORMAT": "delta"}
        assert every_command(s3.lake("here"), env, tmp_path, run=run_here,
                             database=database) == EXPECTED
    finally:
        run_here.close()
        spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")
    keys = s3.keys("here/")
    assert any(k.startswith(f"here/tables/{database}/orders/updates/_delta_log/")
               for k in keys), keys[:20]
    for key in keys:
        if key.endswith((".json", ".crc")):
            body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            assert SECRET_KEY.encode() not in body and ACCESS_KEY.encode() not in body


@pytest.mark.spark
def test_a_table_the_metastore_remembers_but_the_store_lost_is_made_again(
        s3: S3Server, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote lake's metastore is kept on this machine (`files.local_home`) and outlives
    the lake's objects (the prefix emptied, or the same URI on another store): an ingest
    then makes the table again rather than failing on the registration left behind."""
    database = "s3_lost"
    spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")
    run_here = InProcess(spark, s3, monkeypatch)
    env = {"CHANGELAKE_TABLE_FORMAT": "delta"}
    ingest = ["ingest", "--lake", s3.lake("lost"), "--table", f"{database}.orders", "--key",
              "order_id", "--from", "debezium", "--close", str(SAMPLE)]
    snapshot = ["snapshot", "--lake", s3.lake("lost"), "--table", f"{database}.orders",
                "--format", "jsonl"]
    try:
        ok(run_here(*ingest, env=env))
        for key in s3.keys("lost/"):
            s3.client().delete_object(Bucket=s3.bucket, Key=key)
        remembered = spark._jsparkSession.sharedState().externalCatalog()
        assert remembered.tableExists(database, "orders")
        ok(run_here(*ingest, env=env))
        assert pairs(run_here(*snapshot, env=env)) == NOW
    finally:
        run_here.close()
        spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")


@pytest.mark.slow  # the same commands twice: sixteen Spark processes
@pytest.mark.timeout(3600)
def test_an_s3_lake_equals_a_local_lake(s3: S3Server, tmp_path: Path) -> None:
    (tmp_path / "local").mkdir()
    (tmp_path / "remote").mkdir()
    env = environment(s3, tmp_path)
    local = every_command(str(tmp_path / "local" / "lake"), env, tmp_path / "local")
    remote = every_command(s3.lake("same"), env, tmp_path / "remote")
    assert local == remote == EXPECTED


# ------------------------------------------------------------------------------- errors


def refused(out: subprocess.CompletedProcess, uri: str) -> str:
    """The one line a refused command prints: exit 2, naming `uri`, no traceback, no
    secret."""
    stderr = out.stderr.decode()
    assert out.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("changelake: error: ") and uri in lines[0], stderr
    assert "Traceback" not in stderr and SECRET_KEY not in stderr
    assert SECRET_KEY.encode() not in out.stdout
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_store_that_cannot_be_reached_is_one_line(s3: S3Server, tmp_path: Path) -> None:
    env = environment(s3, tmp_path)
    env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    uri = s3.lake("unreachable")
    for engine in ("spark", "arrow"):  # S3A's error, and pyarrow's
        line = refused(run("status", "--lake", uri, "--master", "local[1]", "--engine",
                           engine, env=env), uri)
        assert "refused" in line.lower() or "connect" in line.lower(), line


def test_a_bucket_that_does_not_exist_is_one_line(s3: S3Server, tmp_path: Path) -> None:
    uri = "s3a://no-such-bucket/lake"
    line = refused(run("ingest", "--lake", uri, "--master", "local[1]", "--table", "t",
                       "--key", "order_id", "--from", "debezium", "--close", str(SAMPLE),
                       env=environment(s3, tmp_path)), uri)
    assert "does not exist" in line, line
    line = refused(run("status", "--lake", uri, "--engine", "arrow",
                       env=environment(s3, tmp_path)), uri)
    assert "no-such-bucket" not in [b["Name"] for b in s3.client().list_buckets()["Buckets"]]


def test_missing_credentials_are_one_line(s3: S3Server, tmp_path: Path) -> None:
    uri = s3.lake("no-credentials")
    env = environment(s3, tmp_path, credentials=False)
    line = refused(run("status", "--lake", uri, "--master", "local[1]", env=env), uri)
    assert "credential" in line.lower(), line
    # the JVM-free reads take the key pair from the environment only: refused, one line
    line = refused(run("snapshot", "--lake", uri, "--table", "t", "--engine", "arrow",
                       env=env), uri)
    assert "AWS_ACCESS_KEY_ID" in line, line


def test_a_hive_format_table_on_s3(s3: S3Server, tmp_path: Path) -> None:
    """A Hive-format table lives on a remote lake too: ingested, read without a JVM (its
    commit pointer, manifests and segments through pyarrow's S3 file system; on Spark: the
    lake tests with CHANGELAKE_TEST_LAKE=s3 CHANGELAKE_TABLE_FORMAT=hive), its
    files on the store and its lock object released. Its views are in the metastore that
    committed it: a command with another metastore (another machine's, without a shared
    `--metastore-uri`) is refused in one line, and never takes the table for a new one."""
    uri = s3.lake("hive")
    env = environment(s3, tmp_path)
    common = ["--lake", uri, "--master", "local[1]"]
    ok(run("ingest", *common, "--table", "shop.orders", "--key", "order_id", "--from",
           "debezium", "--close", "--format", "hive", str(SAMPLE), env=env))
    assert pairs(run("snapshot", *common, "--table", "shop.orders", "--format", "jsonl",
                     "--engine", "arrow", env=env)) == NOW
    keys = s3.keys("hive/")
    assert "hive/tables/shop/orders/_state/COMMITTED" in keys
    assert any(k.startswith("hive/tables/shop/orders/seg/") for k in keys)
    assert not any("_delta_log" in k or k.endswith("/_lock") for k in keys)
    elsewhere = {**env, "CHANGELAKE_STATE_HOME": str(tmp_path / "elsewhere")}
    line = refused(run("ingest", *common, "--table", "shop.orders", "--key", "order_id",
                       "--from", "debezium", "--close", "--format", "hive", str(SAMPLE),
                       env=elsewhere), uri)
    assert "another metastore" in line and "--metastore-uri" in line, line
    assert s3.keys("hive/") == keys


def test_the_metastore_service_is_refused_on_a_remote_lake(s3: S3Server, tmp_path: Path
                                                           ) -> None:
    """`changelake metastore` serves a local lake directory: one line, before anything is
    made (a URI taken for a path would make a local `s3a:` folder)."""
    uri = s3.lake("follow")
    env = environment(s3, tmp_path)
    refused(run("metastore", "--lake", uri, cwd=tmp_path, env=env), uri)
    assert s3.keys("follow/") == [] and not (tmp_path / "s3a:").exists()


# -------------------------------------------------------------------------- two writers


@pytest.mark.parametrize("table_format", ["delta", "hive"])
def test_a_second_writer_is_refused_by_the_lock_object(s3: S3Server, tmp_path,
                                                       table_format: str) -> None:
    """A writer on another host holds the table's lock object: an ingest waits
    (CHANGELAKE_LOCK_WAIT_SECONDS), then fails in one line naming the holder, with nothing
    written; the lock stays the holder's. Either table format: both lock so on a store."""
    prefix = f"locked-{table_format}"
    uri = s3.lake(prefix)
    lock = f"{prefix}/tables/shop/orders/_lock"
    held = json.dumps({"host": "another-host", "pid": 4242, "since": 0, "token": "x"})
    s3.client().put_object(Bucket=s3.bucket, Key=lock, Body=held.encode())
    line = refused(run("ingest", "--lake", uri, "--master", "local[1]", "--table",
                       "shop.orders", "--key", "order_id", "--from", "debezium", "--close",
                       "--format", table_format, str(SAMPLE), env=environment(s3, tmp_path)),
                   uri)
    assert "another writer" in line and "another-host" in line, line
    assert s3.keys(f"{prefix}/") == [lock]
    assert s3.client().get_object(Bucket=s3.bucket, Key=lock)["Body"].read() == held.encode()


def test_the_lock_object_is_made_by_a_conditional_put(s3: S3Server, tmp_path) -> None:
    """The writer lock's create (`files.create_exclusive`) on S3: a second create of the
    same object loses, and so does one overtaken between its start and its PUT by another
    writer's object: the store's check (If-None-Match: *), not a look before the PUT, which
    two writers on two hosts could both pass."""
    worker = SUPPORT / "s3_lock_worker.py"
    env = environment(s3, tmp_path)
    out = subprocess.run([sys.executable, str(worker), s3.lake("race")],
                         capture_output=True, timeout=600, env=env, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert json.loads(line[len("RESULT "):]) == {
        "first": True, "again": False, "overtaken": False, "held": "the other writer",
        "held_a": "writer 1"}


def test_a_remote_parquet_file_is_read_as_pyarrow_asks(s3: S3Server, tmp_path) -> None:
    """`files.parquet_source` on S3 (the export's staged parts, the footers a commit reads):
    the footer costs a few kilobytes, a row group about its own size, never the whole object;
    and the file reads the same through the session's Hadoop FileSystem and without a JVM."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    local = tmp_path / "part.parquet"
    rows = 400_000
    pq.write_table(pa.table({"id": pa.array(range(rows), pa.int64()),
                             "text": pa.array([f"row {i:09d}" * 3 for i in range(rows)])}),
                   local, row_group_size=rows // 8, compression="none")
    s3.client().put_object(Bucket=s3.bucket, Key="read/part.parquet", Body=local.read_bytes())
    worker = SUPPORT / "s3_read_worker.py"
    out = subprocess.run([sys.executable, str(worker), s3.lake("read") + "/part.parquet",
                          str(local)], capture_output=True, timeout=600,
                         env=environment(s3, tmp_path), text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    got = json.loads(line[len("RESULT "):])
    size = local.stat().st_size
    assert got["size"] == size > 8 << 20
    assert got["footer_fetched"] <= 64 << 10  # pyarrow reads the last 64 KiB
    assert got["groups_fetched"] - got["footer_fetched"] < size // 4
    assert got["same_with_spark"] and got["same_without_spark"]


@pytest.mark.slow
def test_a_dead_writers_lock_on_this_host_is_taken_over(s3: S3Server, tmp_path) -> None:
    """A lock object left by a killed writer on this host (its process is gone) does not
    stop the next one, which releases it when done."""
    uri = s3.lake("stale")
    lock = "stale/tables/shop/orders/_lock"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    held = json.dumps({"host": socket.gethostname(), "pid": int(gone), "since": 0,
                       "token": "x"})
    s3.client().put_object(Bucket=s3.bucket, Key=lock, Body=held.encode())
    env = environment(s3, tmp_path)
    ok(run("ingest", "--lake", uri, "--master", "local[1]", "--table", "shop.orders", "--key",
           "order_id", "--from", "debezium", "--close", str(SAMPLE), env=env))
    assert lock not in s3.keys("stale/")
    assert pairs(run("snapshot", "--lake", uri, "--master", "local[1]", "--table",
                     "shop.orders", "--format", "jsonl", env=env)) == NOW



# ------------------------------------------------------------------------ kill -9 of ingest


ORDERS_READ = """
import json, os, sys
from changelake.lake import arrow
from changelake.lake.identifier import TableIdentifier
ident = TableIdentifier.parse(sys.argv[2])
state = arrow.committed_state(sys.argv[1], ident)
rows = arrow.updates(state, ident.directory(arrow.lake_tables_dir(sys.argv[1]))).to_pylist()
print(json.dumps([[r["id"], r["customer"], r["amount_cents"], r["status"], r["_time"],
                   r["_diff"]] for r in rows]))
sys.stdout.flush()
os._exit(0)  # not the AWS SDK's teardown at exit, which has aborted ("terminate called")
"""


def killed_while_writing(args: list[str], env: dict[str, str], s3: S3Server, lock: str,
                         delay: float) -> bool:
    """Run `changelake *args`, and SIGKILL it `delay` seconds after the table's lock object
    appears (the writer holds the table: converting, committing, or releasing): its process
    group, its Spark JVM included, as a machine's end would take it (a JVM left running
    would go on writing beside the re-run). True if it was killed, False if it ended first."""
    import time

    from changelake.demo.postgres import kill_group

    process = subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while process.poll() is None and time.monotonic() < deadline:
            if lock in s3.keys(lock):
                time.sleep(delay)
                break
            time.sleep(0.1)
        killed = process.poll() is None
    finally:
        kill_group(process)
    return killed


@pytest.mark.slow  # five Spark processes, two of them killed
@pytest.mark.timeout(2400)
def test_kill9_of_debezium_ingests_into_an_s3_lake(s3: S3Server, tmp_path) -> None:
    """A Debezium feed delivered as a growing set of files, each delivery one `ingest` into a
    lake on S3, two of them killed with SIGKILL at a seeded moment while they hold the
    table's lock and run again: the killed writer's lock object is taken over (this host, its
    process gone), and the table's updates are those of the feed, each once (no update lost,
    none doubled: every key's diffs sum to 0 or 1, each (row, time) once), its rows the
    feed's last state."""
    import random as _random

    from changelake.simulate import debezium_orders
    from tests.support.seeding import seeded

    rng = seeded(6604)
    feed = debezium_orders(_random.Random(rng.randrange(1 << 30)), rows=15, transactions=40,
                           replay=3)
    cuts = sorted(rng.sample(range(5, len(feed.events) - 5), 2))
    parts = []
    for n, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(feed.events)], strict=True)):
        part = tmp_path / f"part-{n}.jsonl"
        part.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in feed.events[a:b]))
        parts.append(str(part))
    uri, env = s3.lake("killed-ingest"), environment(s3, tmp_path)
    env["CHANGELAKE_LOCK_WAIT_SECONDS"] = "120"  # the killed JVM's exit, then the takeover
    lock = "killed-ingest/tables/shop/orders/_lock"

    def ingest(files: list[str], *extra: str) -> list[str]:
        return ["ingest", "--lake", uri, "--master", "local[1]", "--table", "shop.orders",
                "--key", "id", "--from", "debezium", *extra, *files]

    ok(run(*ingest(parts[:1]), env=env))
    kills = []  # (killed, the lock object left behind)
    for files, extra in ((parts[:2], ()), (parts, ("--close",))):
        killed = killed_while_writing(ingest(files, *extra), env, s3, lock, rng.uniform(0, 3))
        kills.append((killed, lock in s3.keys(lock)))
        ok(run(*ingest(files, *extra), env=env))  # the re-run finishes the delivery
        assert lock not in s3.keys(lock)  # taken over, and released
    # at least one run was killed holding the lock, which its re-run took over
    assert (True, True) in kills, kills

    read = subprocess.run([sys.executable, "-c", ORDERS_READ, uri, "shop.orders"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert read.returncode == 0, read.stderr[-3000:]
    per_row_time: dict[tuple, int] = {}
    per_key: dict[int, int] = {}
    for *row, time, diff in json.loads(read.stdout):
        per_row_time[(*row, time)] = per_row_time.get((*row, time), 0) + diff
        per_key[row[0]] = per_key.get(row[0], 0) + diff
    assert all(d in (-1, 1) for d in per_row_time.values() if d), per_row_time
    assert all(d in (0, 1) for d in per_key.values()), per_key
    final = feed.states[-1][1]
    want = sorted((r["id"], r["customer"], r["amount_cents"], r["status"])
                  for r in final.values())
    got = pairs_of_orders(run("snapshot", "--lake", uri, "--table", "shop.orders",
                              "--format", "jsonl", "--engine", "arrow", env=env))
    assert got == want


@pytest.mark.spark
def test_kill9_of_an_ingest_into_an_s3_lake_then_its_rerun(s3: S3Server, spark: Any,
                                                            tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The default run's kill -9 on S3 (the slow tier's, above, kills two of three
    deliveries): an `ingest` process SIGKILLed while it holds the table's lock object, then
    the same delivery again (in this process, on the test run's session): the lock object is
    taken over, and the table's updates are the feed's, each once, its rows the feed's last
    state."""
    import random as _random

    from changelake.lake import arrow
    from changelake.lake.identifier import TableIdentifier
    from changelake.simulate import debezium_orders
    from tests.support.seeding import seeded

    rng = seeded(6605)
    feed = debezium_orders(_random.Random(rng.randrange(1 << 30)), rows=15, transactions=40,
                           replay=3)
    cut = rng.randrange(5, len(feed.events) - 5)
    parts = []
    for n, events in enumerate((feed.events[:cut], feed.events[cut:])):
        part = tmp_path / f"part-{n}.jsonl"
        part.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
        parts.append(str(part))
    database = "s3_killed"
    uri, env = s3.lake("killed-once"), environment(s3, tmp_path)
    env["CHANGELAKE_LOCK_WAIT_SECONDS"] = "120"  # the killed JVM's exit, then the takeover
    env["CHANGELAKE_TABLE_FORMAT"] = "delta"
    lock = f"killed-once/tables/{database}/orders/_lock"
    ident = TableIdentifier.parse(f"{database}.orders")

    def ingest(files: list[str], *extra: str) -> list[str]:
        return ["ingest", "--lake", uri, "--master", "local[1]", "--table", f"{database}.orders",
                "--key", "id", "--from", "debezium", *extra, *files]

    spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")
    run_here = InProcess(spark, s3, monkeypatch)
    try:
        ok(run_here(*ingest(parts[:1]), env=env))
        killed = killed_while_writing(ingest(parts, "--close"), env, s3, lock,
                                      rng.uniform(0.2, 1.5))
        left = lock in s3.keys(lock)
        assert killed and left, (killed, left)  # killed while it held the table
        ok(run_here(*ingest(parts, "--close"), env=env))  # the delivery again
        assert lock not in s3.keys(lock)  # taken over, and released
        state = arrow.committed_state(uri, ident)
        rows = arrow.updates(state, ident.directory(arrow.lake_tables_dir(uri))).to_pylist()
        now = pairs_of_orders(run_here("snapshot", "--lake", uri, "--table",
                                       f"{database}.orders", "--format", "jsonl", env=env))
    finally:
        run_here.close()
        spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")
    per_row_time: dict[tuple, int] = {}
    per_key: dict[int, int] = {}
    for r in rows:
        row = (r["id"], r["customer"], r["amount_cents"], r["status"])
        per_row_time[(*row, r["_time"])] = per_row_time.get((*row, r["_time"]), 0) + r["_diff"]
        per_key[r["id"]] = per_key.get(r["id"], 0) + r["_diff"]
    assert all(d in (-1, 1) for d in per_row_time.values() if d), per_row_time
    assert all(d in (0, 1) for d in per_key.values()), per_key
    final = feed.states[-1][1]
    assert now == sorted((r["id"], r["customer"], r["amount_cents"], r["status"])
                         for r in final.values())


def pairs_of_orders(out: subprocess.CompletedProcess) -> list[tuple]:
    return sorted((r["id"], r["customer"], r["amount_cents"], r["status"])
                  for r in map(orjson.loads, ok(out).stdout.splitlines()))
