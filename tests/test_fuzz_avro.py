"""Hypothesis fuzzing of the Avro container reader over arbitrary schemas and corrupted bytes,
and of Confluent framing (issue 67), each campaign in a child process under an address-space
cap (`fuzz_avro_worker.py`), so a bomb that gets through fails the test, not the machine.
The default run draws a few dozen examples each (seconds); `-m slow` draws thousands."""

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
    result = subprocess.run([sys.executable, str(HERE / "fuzz_avro_worker.py"), kind,
                             str(examples)], capture_output=True, timeout=1800,
                            preexec_fn=limit, env=env)
    assert result.returncode == 0, result.stderr.decode()[-6000:]


@pytest.mark.parametrize("kind", ["container", "framed"])
def test_avro_fuzz(kind: str) -> None:
    campaign(kind, 60)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["container", "framed"])
def test_avro_fuzz_long(kind: str) -> None:
    campaign(kind, 3000)
