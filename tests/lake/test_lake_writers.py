"""One writer at a time, end to end: two ingests of overlapping parts of one keyed Debezium feed
(without before-images, so each conversion reads the table's current rows) into a table that
neither has created yet, while a compaction runs, must leave one exactly-once application of
the union, whatever the interleaving.

Here the writers are threads on the shared session (the writer lock is an `flock` per open
file, so threads of one process exclude each other as processes do); the same race between
processes on the metastore service is in `test_lake_processes.py` (slow)."""

from __future__ import annotations

import itertools
import random
import threading
import uuid
from pathlib import Path

import pytest

from changelake.lake import Lake, ingest
from changelake.lake.compact import compact
from changelake.simulate import ORDER_COLUMNS
from tests.support.lake_history import changes_are_exactly_once, write_parts

pytestmark = pytest.mark.spark


def race(spark, tmp_path: Path, lake_root: Path | str, seed: int, *, rounds: int = 2,
         storage: str | None = None) -> None:
    """Writer A ingests part 1 then parts 1-2, writer B parts 1-2 then 1-3 (with `rounds=1`,
    only the last of each), a compaction runs every moment the lock is free."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    feed, (p1, p2, p3) = write_parts(tmp_path, rng)
    lake = Lake(spark, lake_root, storage=storage)
    name = f"w{uuid.uuid4().hex[:8]}.orders"
    commits: list[tuple[int, int | None, bool]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def write_rounds(rounds: list[list[str]]) -> None:
        try:
            for files in rounds:
                c = ingest.ingest(lake, name, files, key=["id"], source="debezium").commit
                commits.append((c.lower, c.upper, c.skipped))
        except BaseException as error:  # reported below, with the seed
            errors.append(error)

    def compactor() -> None:
        try:
            while not done.is_set():
                if lake.exists(name):
                    compact(lake.table(name))
                done.wait(0.2)
        except BaseException as error:
            errors.append(error)

    writers = [threading.Thread(target=write_rounds, args=([[p1], [p1, p2]][-rounds:],)),
               threading.Thread(target=write_rounds, args=([[p1, p2], [p1, p2, p3]][-rounds:],))]
    background = threading.Thread(target=compactor)
    background.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    done.set()
    background.join()
    assert not errors, errors
    table = lake.table(name)
    # every commit continued the one before it: no time range committed twice or skipped
    applied = sorted((lo, up) for lo, up, skipped in commits if not skipped)
    assert applied[0][0] == 0, applied
    assert all(a[1] == b[0] for a, b in itertools.pairwise(applied)), applied
    upper = table.state().upper
    assert applied[-1][1] == upper
    state = next(s for t, s in reversed(feed.states) if t < upper)
    truth = sorted(tuple(row[c] for c in ORDER_COLUMNS) for row in state.values())
    rows = sorted(tuple(r[c] for c in ORDER_COLUMNS) for r in table.current().collect())
    assert rows == truth
    assert changes_are_exactly_once(table)


def test_two_first_ingests_and_a_compaction_at_once(spark, tmp_path, lake_root):
    race(spark, tmp_path, lake_root, random.Random().randrange(10_000), rounds=1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_two_first_ingests_and_a_compaction_at_once_repeated(spark, tmp_path, lake_root, seed):
    race(spark, tmp_path, lake_root, 900 + seed)


def test_two_first_ingests_and_a_compaction_at_once_on_delta(spark, tmp_path, lake_root):
    """The same race on a Delta table (`delta_storage`): one commit after another, from one
    committed version to the next, and `current` equal to the truth."""
    race(spark, tmp_path, lake_root, 0, rounds=1, storage="delta")
