"""A fuzz campaign in a child process under an address-space cap, so that a bomb that gets
through fails the test, not the machine (the fuzz tests of issue 67)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
CAP = 1024 * 2**20


def run_campaign(worker: str, kind: str, examples: int, *, timeout: float) -> None:
    """Run `tests/<worker> kind examples` under `CAP` bytes of address space; it must pass."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    env = {**os.environ, "MALLOC_ARENA_MAX": "2",
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(HERE / worker), kind, str(examples)],
                            capture_output=True, timeout=timeout, preexec_fn=limit, env=env)
    assert result.returncode == 0, result.stderr.decode()[-6000:]
