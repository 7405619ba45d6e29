"""Shared fixtures. One SparkSession per test run (Spark start-up costs ~10 s)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# The shared specification (seeds, formats, samples) sits beside the checkout, as in CI.
SHARED = Path(os.environ.get("CHANGELAKE_SHARED",
                             Path(__file__).resolve().parents[2] / "shared"))
SAMPLES = SHARED / "formats" / "samples"
SEEDS = SHARED / "seeds"


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
