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
