"""A float (32-bit) value prints as the shortest text that reads back to it (`1.1`, as
PostgreSQL, Spark's `show()` and Avro-Java print it), not as the double it widens to
(`1.100000023841858`): `values.float32_text` / `float32_value`, and end to end from a
PostgreSQL `real` column through a captured log, `decode`, a lake table and `snapshot`."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from changelake.values import float32_text, float32_value

CLI = [str(Path(sys.executable).parent / "changelake")]


def as_float32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


@settings(max_examples=2000, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_the_text_reads_back_to_the_same_float32_and_is_no_longer(single: float) -> None:
    text = float32_text(single)
    assert as_float32(float(text)) == single  # both directions: what is printed reads back
    assert math.copysign(1, float(text)) == math.copysign(1, single)  # -0 stays -0
    assert len(digits(text)) <= len(digits(repr(single)))  # (`%g` may take an exponent)
    value = float32_value(single)
    assert as_float32(value) == single and float(repr(value)) == value
    assert len(repr(value)) <= len(repr(single))  # what JSON writers, `str`, csv print


def digits(text: str) -> str:
    """The significant digits of a number's text (`5.2222075e+09`: `52222075`)."""
    mantissa = text.lstrip("-").split("e")[0].replace(".", "")
    return mantissa.lstrip("0").rstrip("0") or "0"


def test_known_texts() -> None:
    assert float32_text(as_float32(1.1)) == "1.1"
    assert repr(float32_value(as_float32(1.1))) == "1.1"
    assert float32_text(as_float32(0.1)) == "0.1"
    assert float32_text(as_float32(3.4028234663852886e38)) == "3.4028235e+38"  # the largest
    assert float(float32_text(16777217.0)) == 16777216.0  # rounded to float32 first
    assert float32_text(100000.0) == "100000" and float32_text(-0.0) == "-0"
    assert float32_value(math.inf) == math.inf and math.isnan(float32_value(math.nan))


# ------------------------------------------------------------------------- end to end

REALS = ["1.1", "0.1", "-2.5e-07", "3.4028235e+38", "123456.79", "1e-40"]
"""PostgreSQL `real` literals, each its own shortest text (PostgreSQL 12+ prints a `real` so);
1e-40 is subnormal."""


@pytest.mark.slow  # five CLI processes, three of them Spark's (25-35 s); the rule's own tests
# above run in the default tier
def test_a_postgres_real_prints_as_postgres_prints_it(pg_dsn: str, tmp_path: Path) -> None:
    """`real` values captured into a log (`capture --out`) print, through `decode` of the log
    and `snapshot` of a lake table ingested from it (both engines), as the number PostgreSQL
    prints; each reads back to the float32 PostgreSQL holds; a `double precision` column is
    untouched (0.1 + 0.2 keeps its 17 digits)."""
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE floats (id int PRIMARY KEY, r real, d double precision)")
        c.execute("CREATE PUBLICATION floats FOR TABLE floats")
        for i, text in enumerate(REALS):
            c.execute("INSERT INTO floats VALUES (%s, %s::real, 0.1::float8 + 0.2::float8)",
                      (i, text))
        c.execute("SELECT id, r::text, d::text FROM floats")
        held = {i: (r, d) for i, r, d in c.fetchall()}
    conn.close()
    assert [held[i][0] for i in range(len(REALS))] == REALS  # PostgreSQL's own shortest texts
    expected = [{"id": i, "r": float(held[i][0]), "d": 0.1 + 0.2} for i in range(len(REALS))]

    out, lake = tmp_path / "out", tmp_path / "lake"
    done = subprocess.run([*CLI, "capture", "postgres", "--dsn", pg_dsn, "--publication",
                           "floats", "--slot", "floats", "--out", str(out), "--create-slot",
                           "--until-idle", "0.5"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    log = out / "public.floats"
    decoded = subprocess.run([*CLI, "decode", str(log)], capture_output=True, text=True,
                             timeout=120)
    assert decoded.returncode == 0, decoded.stderr
    rows = [json.loads(line)["data"] for line in decoded.stdout.splitlines() if '"data"' in line]
    check(rows, expected, held, decoded.stdout)

    ingested = subprocess.run([*CLI, "ingest", "--lake", str(lake), "--table", "floats",
                               "--key", "id", "--master", "local[1]", str(log)],
                              capture_output=True, text=True, timeout=300)
    assert ingested.returncode == 0, ingested.stderr
    for engine in ("arrow", "spark"):
        shown = subprocess.run([*CLI, "snapshot", "--lake", str(lake), "--table", "floats",
                                "--format", "jsonl", "--engine", engine, "--master",
                                "local[1]"], capture_output=True, text=True, timeout=300)
        assert shown.returncode == 0, (engine, shown.stderr)
        check([json.loads(line) for line in shown.stdout.splitlines()], expected, held,
              shown.stdout)


def check(rows: list[dict], expected: list[dict], held: dict, text: str) -> None:
    """The rows hold PostgreSQL's numbers exactly, as the shortest texts: 1.1 is printed
    `1.1`, and `1.100000023841858` (the float32 widened) appears nowhere."""
    assert sorted(rows, key=lambda r: r["id"]) == expected, text
    for row in rows:
        assert as_float32(row["r"]) == as_float32(float(held[row["id"]][0]))
    assert "1.100000023841858" not in text and '"r":1.1,' in text

