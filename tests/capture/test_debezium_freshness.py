"""The freshness benchmark's core at a tiny rate (`benchmarks/bench_debezium_freshness.py`,
issue 69): real Debezium streams single-row INSERTs paced at 20 a second to the real broker,
`changelake ingest --follow --kafka --from debezium` (the CLI, a process of its own, the
default table format) lands them, stopped with SIGINT as Ctrl-C stops it; at the end the lake
table equals the database table, every measured transaction was seen visible, and every round
line carried its steps' seconds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT

BENCHMARKS = ROOT / "benchmarks"

pytestmark = pytest.mark.spark


@pytest.mark.timeout(900)
def test_debezium_pipeline_at_a_tiny_rate_lands_the_database_in_the_lake(
        pg_dsn: str, broker: Any, tmp_path: Path) -> None:
    """`broker`: conftest's real Kafka broker (`kafka.broker.KafkaBroker`)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_debezium_freshness as bench
    finally:
        sys.path.remove(str(BENCHMARKS))
    said: list[str] = []
    result = bench.run(pg_dsn, broker.bootstrap, tmp_path, rate=20, seconds=5, warmup=2,
                       trigger=0.5, say=said.append)
    print("\n".join(said))
    assert result.equal, (result.lake_rows, result.database_rows)
    assert result.database_rows == 1 + 20 * 7  # the first row, the warm-up, the measured
    assert result.transactions == 100
    assert len(result.delays) == 100 and min(result.delays) > 0
    assert result.rounds and all(set(r.steps) == set(bench.STEPS) for r in result.rounds)
    assert all(len(v) == 100 for v in result.pieces.values()), result.notes
    # The warm-up's rounds (their records, before the measured window's) are reported apart.
    assert all(w.records and w.number < result.rounds[0].number for w in result.warmup)
    bench.report(result, 20, argparse.Namespace(trigger_seconds=0.5, poll=0.05, warmup=2), "")
