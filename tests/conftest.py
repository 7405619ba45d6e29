"""Shared fixtures. One SparkSession per test run (Spark start-up costs ~10 s)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Every random test is seeded and says its seed. Hypothesis: derandomized (its generator is
# seeded from each test's name and source), so a run is repeatable; a failure prints the
# falsifying example, seeds drawn for `random.Random` included. Plain `random`: `seeded`.
settings.register_profile("changelake", derandomize=True, print_blob=True)
settings.load_profile("changelake")


def seeded(seed: int) -> random.Random:
    """A `random.Random` on `seed`, printed (pytest shows it with a failure) to reproduce it."""
    print(f"random seed: {seed}")
    return random.Random(seed)


def pytest_report_header() -> str:
    return "hypothesis: derandomized (profile changelake); random tests print their seed"

# Every fixture lives in the repository: the format samples (public examples of Debezium and
# YDB messages, each with its origin in `.source.txt`) and the seed documents the examples are
# cut from. A clone with nothing beside it runs the whole suite.
DATA = Path(__file__).resolve().parent / "data"
SAMPLES = DATA / "samples"
SEEDS = DATA / "seeds"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The one SparkSession of the test run, local[2], with an embedded Hive metastore."""
    from changelake.spark.session import build_session

    root = tmp_path_factory.mktemp("spark")
    session = build_session(
        "local[2]",
        app_name="changelake-tests",
        hive_metastore_dir=root / "metastore",
        warehouse_dir=root / "warehouse",
        conf={"spark.sql.shuffle.partitions": "4"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One embedded PostgreSQL server (wal_level = logical) for the test run.

    Its folder is not under pytest's temporary root: that is private to us (mode 700), and
    when the tests run as root the server runs as an unprivileged account that must reach it.
    """
    import shutil
    import tempfile

    from changelake.capture.postgres.server import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="changelake-test-pg-"))
    server = EmbeddedPostgres(root).start()
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_dsn(postgres: object, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database of the embedded server for one test; its slots go with it."""
    import re
    import time

    import psycopg2

    name = "t_" + re.sub(r"\W", "_", request.node.name.lower())[:50]
    admin = psycopg2.connect(postgres.dsn)  # type: ignore[attr-defined]
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    yield postgres.dsn_for(name)  # type: ignore[attr-defined]
    with admin.cursor() as cur:
        # A walsender outlives its client by a moment: wait for its slot to be released.
        for _ in range(200):
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE database = %s AND "
                        "active", (name,))
            if not cur.fetchone()[0]:
                break
            time.sleep(0.05)
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %s AND NOT active", (name,))
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture
def no_public_views(spark) -> Iterator[None]:
    """Captured tables are named after their PostgreSQL schema (`public.*`) and the test run
    shares one metastore, so another test's lake may have left a `public.accounts`: drop the
    views under `public`, before and after (their lakes are temporary directories)."""

    def drop() -> None:
        if spark.catalog.databaseExists("public"):
            for table in spark.catalog.listTables("public"):
                if not table.isTemporary:
                    spark.sql(f"DROP VIEW IF EXISTS `public`.`{table.name}`")

    drop()
    yield
    drop()


def execute(dsn: str, *statements: str) -> None:
    """Run `statements` on the database at `dsn`, each committed (set-up SQL of the tests)."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
    finally:
        conn.close()
