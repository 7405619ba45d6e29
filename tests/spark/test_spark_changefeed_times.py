"""`times.assign_times` places a change without a time of its own at the highest time of the
changes read before it (in its file, with `per_file`), whatever the chunking of its block."""

from __future__ import annotations

import random
from typing import Any

import pytest

from changelake.spark.changefeed import times

pytestmark = pytest.mark.spark


def _changes(seed: int, untimed_first: bool = False) -> list[tuple[int, int, int, int | None]]:
    """(file_index, block, row, ptime): two files of two blocks each, a third untimed; with
    `untimed_first`, a block's untimed changes come before its timed ones (a snapshot before
    the stream: no chunk then needs the window, `highest_before`)."""
    rng = random.Random(seed)
    out = []
    for file_index in (0, 1):
        for block in (0, 1000):
            row = (file_index * 2 + block // 1000) << 33  # as monotonically_increasing_id
            ptimes = [None if rng.random() < 0.33 else rng.randint(1, 100)
                      for _ in range(rng.randint(0, 12))]
            if untimed_first:
                ptimes.sort(key=lambda t: t is not None)
            for ptime in ptimes:
                out.append((file_index, block, row, ptime))
                row += rng.randint(1, 3)
    return out


def _expected(changes: list[tuple[int, int, int, int | None]],
              per_file: bool) -> dict[tuple[int, int, int], int]:
    out, high, file_index = {}, 0, None
    for f, b, r, t in sorted(changes):
        if per_file and f != file_index:
            high = 0
        file_index = f
        out[(f, b, r)] = high if t is None else t
        if t is not None:
            high = max(high, t)
    return out


@pytest.mark.parametrize(("bits", "per_file", "broadcast", "untimed_first"),
                         [(1, False, 0, False), (2, True, 10**6, False),
                          (16, False, 10**6, False), (1, True, 0, False),
                          (16, False, 10**6, True), (2, True, 0, True)])
def test_untimed_changes_take_the_highest_earlier_time(spark: Any, monkeypatch: Any, bits: int,
                                                       per_file: bool, broadcast: int,
                                                       untimed_first: bool) -> None:
    monkeypatch.setattr(times, "CHUNK_BITS", bits)
    monkeypatch.setattr(times, "BROADCAST_UNTIMED", broadcast)
    for seed in range(3):
        changes = _changes(seed, untimed_first)
        frame = spark.createDataFrame(
            [(f, b, r, t, False, None) for f, b, r, t in changes],
            "file_index int, block long, row long, ptime long, tx_min boolean, tx string")
        untimed = sum(1 for c in changes if c[3] is None)
        got = times.assign_times(spark, frame, by_tx=False, untimed=untimed, per_file=per_file)
        assert {(r["file_index"], r["block"], r["row"]): r["time"] for r in got.collect()} \
            == _expected(changes, per_file)
