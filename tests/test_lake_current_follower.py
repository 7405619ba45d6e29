"""`current` of Delta tables caught up in a thread of its own (`lake/current_follower.py`):
commits return at the commit point, `current` never runs ahead of it, and after the block every
table's `current` holds its last commit, equal to the truth computed in Python."""

from __future__ import annotations

import random
import threading

import pytest

from changelake.lake import Lake, delta_storage
from changelake.lake.current_follower import following
from changelake.lake.delta_storage import current_path
from lake_history import SCHEMA, increments, keyed_history, messages, rows_of, state_at, to_df

pytestmark = pytest.mark.spark


def test_commits_leave_current_to_the_follower_which_catches_up_by_the_end(spark, tmp_path):
    lake = Lake(spark, tmp_path / "lake")
    rng = random.Random(5)
    times = 8
    history = keyed_history(rng, times, 20, 5)
    msgs = messages(history, finish_every=2, rng=rng, last_time=times - 1)
    seen: list[tuple[int, int | None]] = []  # (committed version, current's version) each commit
    applied_in: set[str] = set()
    real = delta_storage.catch_up

    def spy(*args, **kwargs):
        applied_in.add(threading.current_thread().name)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(delta_storage, "catch_up", spy)
        with following(lake):
            table = lake.create_table("f.keyed", SCHEMA, key=["id"], storage="delta")
            for inc in increments(msgs, rng):
                table.commit(to_df(spark, inc.updates), inc.lower, inc.upper)
                version = table.state().version
                seen.append((version, delta_storage.transaction_version(
                    spark, current_path(table.directory))))
    assert applied_in == {"changelake-current"}  # never in the writer's thread
    assert all(held is None or held <= version for version, held in seen)
    last = table.state()
    assert delta_storage.transaction_version(spark, current_path(table.directory)) == \
        last.version
    assert rows_of(table.current()) == state_at(history, times - 1, keyed=True)


def test_a_failed_catch_up_is_raised_in_the_writers_thread(spark, tmp_path, monkeypatch):
    lake = Lake(spark, tmp_path / "lake")
    table = lake.create_table("f.fails", SCHEMA, key=["id"], storage="delta")

    def broken(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(delta_storage, "catch_up", broken)
    history = keyed_history(random.Random(2), 2, 5, 3)
    with pytest.raises(OSError, match="disk full"), following(lake) as follower:
        table = lake.table("f.fails")
        table.commit(to_df(spark, [u for u in history if u[1] == 0]), [0], [1])
        follower.flush()
    assert table.state().version == 1  # the commit itself stands; `current` trails it


def test_an_error_in_the_block_is_the_one_raised(spark, tmp_path):
    lake = Lake(spark, tmp_path / "lake")
    with pytest.raises(KeyError, match="mine"), following(lake):
        raise KeyError("mine")
    assert lake.current_follower is None

