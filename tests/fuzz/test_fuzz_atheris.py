"""The atheris campaign (coverage-guided, libFuzzer) of the slow tier, issue 67: the Avro
container reader, Debezium lines and the pgoutput decoder, each for `SECONDS` under an
address-space cap and libFuzzer's RSS limit (`atheris_worker.py`). atheris is an optional test
dependency (`pip install -e '.[fuzz]'`, which `.ci/slow` runs); without it these tests are
skipped, unless CHANGELAKE_REQUIRE_ATHERIS=1 (set by `.ci/slow`) makes that a failure."""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.test_fuzz_inputs import corpus
from tests.support.paths import ROOT, SAMPLES, SUPPORT

CAP = 3 * 2**30  # libFuzzer's own maps besides the target's
SECONDS = int(os.environ.get("CHANGELAKE_ATHERIS_SECONDS", "60"))

pytestmark = pytest.mark.slow


def _atheris() -> None:
    try:
        import atheris  # noqa: F401
    except ImportError:
        if os.environ.get("CHANGELAKE_REQUIRE_ATHERIS") == "1":
            raise
        pytest.skip("atheris is not installed (pip install -e '.[fuzz]')")


def _pgoutput_seeds() -> list[bytes]:
    relation = (b"R" + struct.pack(">I", 16384) + b"public\0t\0d" + struct.pack(">h", 2)
                + b"\x01id\0" + struct.pack(">Ii", 23, -1)
                + b"\x00v\0" + struct.pack(">Ii", 25, -1))
    row = struct.pack(">h", 2) + b"t" + struct.pack(">i", 1) + b"1" + b"n"
    begin = b"B" + struct.pack(">QqI", 2**32, 10**15, 7)
    commit = b"C" + struct.pack(">bQQq", 0, 2**32, 2**32 + 64, 10**15)
    insert = b"I" + struct.pack(">I", 16384) + b"N" + row
    update = b"U" + struct.pack(">I", 16384) + b"K" + row + b"N" + row
    stream = b"S" + struct.pack(">Ib", 9, 1)
    streamed = b"I" + struct.pack(">II", 9, 16384) + b"N" + row
    return [b"\x00" + b"\xff".join([begin, relation, insert, update, commit]),
            b"\x01" + b"\xff".join([stream, streamed, b"E", b"c" + struct.pack(">IbQQq", 9, 0,
                                                                           1, 2, 3)])]


def _seeds(kind: str, where: Path) -> Path:
    where.mkdir()
    if kind == "avro":
        seeds = [data for name, data in corpus().items() if name.endswith(".avro")]
    elif kind == "debezium":
        seeds = [p.read_bytes() for p in sorted(SAMPLES.glob("*dbz*.jsonl"))]
    else:
        seeds = _pgoutput_seeds()
    for i, data in enumerate(seeds):
        (where / f"seed{i}").write_bytes(data)
    return where


@pytest.mark.parametrize("kind", ["avro", "debezium", "pgoutput"])
def test_atheris(kind: str, tmp_path: Path) -> None:
    _atheris()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    seeds = _seeds(kind, tmp_path / "corpus")
    env = {**os.environ, "MALLOC_ARENA_MAX": "2",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, str(SUPPORT / "atheris_worker.py"), kind, str(seeds),
         f"-max_total_time={SECONDS}", "-rss_limit_mb=1536", "-timeout=30",
         f"-artifact_prefix={tmp_path}/"],
        capture_output=True, timeout=SECONDS + 600, preexec_fn=limit, env=env, cwd=tmp_path)
    out = result.stderr.decode(errors="replace")
    assert result.returncode == 0, out[-6000:]
    assert "Done " in out, out[-3000:]
