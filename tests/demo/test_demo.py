"""The pipeline demo, in-process on the shared SparkSession: its checks must pass, and they
must be able to fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from changelake.demo import run_pipeline_demo, run_protocol_demo


def test_protocol_demo(tmp_path: Path) -> None:
    result = run_protocol_demo(tmp_path, updates=3000, times=40)
    assert result.matches and result.recovered == result.truth


def test_pipeline_demo_checks_pass(spark, tmp_path: Path) -> None:
    result = run_pipeline_demo(tmp_path, spark, rows=40, transactions=60, table="demo.t_demo")
    failed = [name for name, passed in result.checks if not passed]
    assert not failed and len(result.checks) >= 4


@pytest.mark.slow  # minutes (6 on a loaded 2-core machine): the README's demo command runs
# it; by default test_debezium_real_samples.py (real Debezium's records through the Spark
# path), test_lake_kafka_changefeed.py (the ingest from topics) and
# test_demo_postgres.py::test_the_demo_refuses_a_database_holding_its_objects_and_cleans_up
# (the database side) cover its pieces
@pytest.mark.timeout(1200)
@pytest.mark.usefixtures("no_public_views")
def test_debezium_demo_equals_the_database_and_the_capture(spark, pg_dsn: str, broker,
                                                           tmp_path: Path) -> None:
    """The demo's Debezium part beside the capture (in this process), on one workload: real
    Debezium killed once and restarted, its topics on the real broker ingested twice; each
    table equals the database and the capture's table, now and AS OF transactions' ends."""
    from changelake.demo import debezium as dbz
    from changelake.demo.postgres import capture_in_process, run_postgres_capture

    lake = tmp_path / "lake"
    demo = dbz.DebeziumDemo(pg_dsn, broker.bootstrap, tmp_path / "debezium", seed=3)
    try:
        run_postgres_capture(pg_dsn, lake, capture_in_process(spark), seed=3,
                             transactions=160, before_workload=demo.start)
        demo.finish()
    finally:
        demo.kill()
    assert not (tmp_path / "debezium" / "debezium.properties").exists()
    assert any(step.startswith("Debezium killed") for step, _ in demo.steps), demo.steps
    checks = demo.ingest(spark, lake) + dbz.check(spark, pg_dsn, lake, times=4, seed=3)
    failed = [c.name for c in checks if not c.passed]
    assert not failed and len(checks) == 3 * len(dbz.TABLES) + 1, (failed, demo.steps)


def _demo_on(lake: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    cli = str(Path(sys.executable).parent / "changelake")
    return subprocess.run([cli, "demo", "--updates", "2000", "--rows", "40",
                           "--transactions", "60", "--lake", lake, "--master", "local[2]"],
                          capture_output=True, text=True, env=env, timeout=1200)


@pytest.mark.slow  # the whole demo, its lake on the S3 server (five minutes)
@pytest.mark.timeout(1800)
def test_the_demo_runs_with_its_lake_on_s3(tmp_path: Path) -> None:
    """`changelake demo --lake s3a://...` (issue 66): the demo's lake (the pipeline's, the
    PostgreSQL capture's and Debezium's tables) only on moto's S3 server, every check
    passing; a second run on the same prefix is refused in one line before anything runs."""
    from tests.support.s3_server import SECRET_KEY, command_environment, s3_server

    with s3_server() as s3:
        env = command_environment(s3)
        env["CHANGELAKE_STATE_HOME"] = str(tmp_path / "state")
        done = _demo_on(s3.lake("demo"), env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "FAILED" not in done.stdout and done.stdout.count("OK:") >= 20, done.stdout
        assert any(k.startswith("demo/tables/demo/orders/") for k in s3.keys("demo/"))
        again = _demo_on(s3.lake("demo"), env)
        assert again.returncode == 2 and again.stderr.strip().splitlines() == [
            "changelake: error: demo: --lake s3a://lake-bucket/demo already holds a lake; "
            "give the demo a directory or prefix of its own"], again.stderr
        assert SECRET_KEY not in done.stdout + done.stderr + again.stderr


def test_the_demo_refuses_a_lake_that_holds_one(tmp_path: Path) -> None:
    """A --lake with tables in it is refused before anything runs (the demo's checks count
    on tables of their own)."""
    from click.testing import CliRunner

    from changelake.cli import main

    (tmp_path / "lake" / "tables").mkdir(parents=True)
    result = CliRunner().invoke(main, ["demo", "--lake", str(tmp_path / "lake"),
                                       "--workdir", str(tmp_path / "work")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"changelake: error: demo: --lake {tmp_path / 'lake'} already holds a lake; give the "
        "demo a directory or prefix of its own")
