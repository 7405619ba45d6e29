"""Hypothesis fuzzing of the Debezium and YDB changefeed lines (parser and converter) and of the
pgoutput decoder (issue 67), each campaign in a child process under an address-space cap
(`fuzz_lines_worker.py`), so a bomb that gets through fails the test, not the machine: any
input converts or is one line naming its place. The default run draws a few dozen examples
each (seconds); `-m slow` draws thousands."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CAP = 1024 * 2**20


def campaign(kind: str, examples: int) -> None:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    env = {**os.environ, "MALLOC_ARENA_MAX": "2",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(HERE / "fuzz_lines_worker.py"), kind,
                             str(examples)], capture_output=True, timeout=3600,
                            preexec_fn=limit, env=env)
    assert result.returncode == 0, result.stderr.decode()[-6000:]


@pytest.mark.parametrize("kind, examples", [("debezium", 60), ("ydb", 60), ("pgoutput", 200)])
def test_lines_fuzz(kind: str, examples: int) -> None:
    campaign(kind, examples)


@pytest.mark.slow
@pytest.mark.parametrize("kind, examples", [("debezium", 3000), ("ydb", 3000),
                                            ("pgoutput", 20000)])
def test_lines_fuzz_long(kind: str, examples: int) -> None:
    campaign(kind, examples)
