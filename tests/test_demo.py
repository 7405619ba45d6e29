"""The pipeline demo, in-process on the shared SparkSession: its checks must pass, and they
must be able to fail."""

from __future__ import annotations

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


@pytest.mark.slow  # the README's demo command runs it; the Kafka tests cover its parts
def test_kafka_demo_checks_pass(spark, tmp_path: Path) -> None:
    from changelake.demo.kafka import run_kafka_demo

    result = run_kafka_demo(tmp_path, spark, tmp_path / "lake", rows=30, transactions=40,
                            table="demo.t_kafka_demo")
    failed = [name for name, passed in result.checks if not passed]
    assert not failed and len(result.checks) == 4
