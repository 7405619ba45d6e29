"""`current` of Delta tables caught up in a thread of its own (`lake/current_follower.py`):
commits return at the commit point, `current` never runs ahead of it, and after the block every
table's `current` holds its last commit, equal to the truth computed in Python."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from deltalake import DeltaTable

from changelake.lake import Lake, delta_storage
from changelake.lake.current_follower import following
from changelake.lake.delta_storage import current_path
from changelake.spark import delta_txn
from tests.support.lake_history import (
    SCHEMA,
    increments,
    keyed_history,
    messages,
    rows_of,
    state_at,
    to_df,
)

pytestmark = pytest.mark.spark


def unique(name: str) -> str:
    """A table name no other test's lake registered in the session's metastore."""
    return f"cf_{uuid.uuid4().hex[:10]}.{name}"


@contextlib.contextmanager
def calls_in_threads(name: str) -> Iterator[list[str]]:
    """The names of the threads that call `delta_storage.<name>` in the block."""
    threads: list[str] = []
    real = getattr(delta_storage, name)

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(delta_storage, name, spy)
        yield threads


def test_commits_leave_current_to_the_follower_which_catches_up_by_the_end(spark, lake_root):
    lake = Lake(spark, lake_root)
    rng = random.Random(5)
    times = 6
    history = keyed_history(rng, times, 12, 4)
    msgs = messages(history, finish_every=2, rng=rng, last_time=times - 1)
    seen: list[tuple[int, int | None]] = []  # (committed version, current's version) each commit
    with calls_in_threads("catch_up") as applied_in, following(lake):
        table = lake.create_table(unique("keyed"), SCHEMA, key=["id"], storage="delta")
        for inc in increments(msgs, rng):
            table.commit(to_df(spark, inc.updates), inc.lower, inc.upper)
            state = table.state()
            seen.append((state.version, delta_storage.transaction_version(
                spark, current_path(table.directory))))
            # `latest` is the committed version whether `current` has it yet or not.
            assert rows_of(table.latest()) == state_at(history, state.upper - 1,
                                                       keyed=True)
    assert set(applied_in) == {"changelake-current"}  # never in the writer's thread
    assert all(held is None or held <= version for version, held in seen)
    assert any(held is None or held < version for version, held in seen)  # it did trail
    last = table.state()
    assert delta_storage.transaction_version(spark, current_path(table.directory)) == \
        last.version
    assert rows_of(table.current()) == state_at(history, times - 1, keyed=True)


def test_a_failed_catch_up_is_raised_in_the_writers_thread(spark, lake_root, monkeypatch):
    lake = Lake(spark, lake_root)
    name = unique("fails")
    table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")

    def broken(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(delta_storage, "catch_up", broken)
    history = keyed_history(random.Random(2), 2, 5, 3)
    with pytest.raises(OSError, match="disk full"), following(lake) as follower:
        table = lake.table(name)
        table.commit(to_df(spark, [u for u in history if u[1] == 0]), [0], [1])
        follower.flush()
    assert table.state().version == 1  # the commit itself stands; `current` trails it


def test_an_error_in_the_block_is_the_one_raised(spark, lake_root):
    lake = Lake(spark, lake_root)
    with pytest.raises(KeyError, match="mine"), following(lake):
        raise KeyError("mine")
    assert lake.current_follower is None



@pytest.mark.parametrize("follow", ["merge", "checkpoints", None])
def test_both_logs_are_checkpointed_every_few_versions_off_the_commit(spark, lake_root, follow,
                                                                    monkeypatch):
    monkeypatch.setattr(delta_txn, "CHECKPOINT_EVERY", 3)  # Delta's is 10: fewer commits
    lake = Lake(spark, lake_root)
    with calls_in_threads("checkpoint_logs") as threads, \
            calls_in_threads("catch_up") as merged_in, \
            following(lake, merge=follow == "merge") if follow else contextlib.nullcontext():
        table = lake.create_table(unique("log"), SCHEMA, key=["id"], storage="delta")
        for t in range(5):
            table.commit(to_df(spark, [((t, f"n{t}", t), t, 1)]), [t], [t + 1])
            if follow:
                lake.current_follower.flush()
            if follow != "merge":  # the commit brought `current` up before it returned
                assert delta_storage.transaction_version(spark, current_path(
                    table.directory)) == table.load().version
    for path in (delta_storage.updates_path(table.directory), current_path(table.directory)):
        log = path / "_delta_log"
        last = json.loads((log / "_last_checkpoint").read_text())
        assert last["version"] >= 3
        # Delta's own interval is out of reach: only the calls above wrote it.
        assert sorted(p.name for p in log.glob("*.checkpoint.parquet")) == \
            [f"{last['version']:020d}.checkpoint.parquet"]
        assert DeltaTable(str(path)).metadata().configuration["delta.checkpointInterval"] == \
            delta_storage.NO_CHECKPOINT_INTERVAL
    assert set(threads) == {"MainThread" if follow is None else "changelake-current"}
    assert set(merged_in) == {"changelake-current" if follow == "merge" else "MainThread"}
    assert rows_of(table.current()) == state_at(
        [((t, f"n{t}", t), t, 1) for t in range(5)], 4, keyed=True)


def test_latest_reads_the_commits_a_killed_runs_follower_never_applied(spark, lake_root):
    lake = Lake(spark, lake_root)
    name = unique("killed")
    rows = [((t, f"n{t}", t), t, 1) for t in range(3)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(delta_storage, "catch_up", lambda *_a, **_k: None)  # died before it
        with following(lake):
            table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")
            for t in range(3):
                table.commit(to_df(spark, [rows[t]]), [t], [t + 1])
    restarted = Lake(spark, lake_root).table(name)  # a new run, no follower yet
    assert rows_of(restarted.current()) == Counter()  # `current` never got them
    assert rows_of(restarted.latest()) == state_at(rows, 2, keyed=True)


def test_a_writer_reads_current_and_the_commits_it_trails_folded_in(spark, lake_root):
    """A writer's previous rows (`TableWriter.current`, which a changefeed's conversion takes
    each key's old row from), and a reader's (`Table.latest`), while `current` trails:
    `current` at the version it holds and the updates committed after it, folded per key;
    equal to the truth at every commit, inserts, updates and deletes of keys `current` has
    and has not."""
    lake = Lake(spark, lake_root)
    rng = random.Random(11)
    times = 8
    history = keyed_history(rng, times, 10, 5)
    table = lake.create_table(unique("folded"), SCHEMA, key=["id"], storage="delta")
    table.commit(to_df(spark, [u for u in history if u[1] < 3]), [0], [3])  # `current` has it
    held = table.state().version
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(delta_storage, "catch_up", lambda *_a, **_k: None)  # it trails from here
        with following(lake):
            for t in range(3, times):
                table.commit(to_df(spark, [u for u in history if u[1] == t]), [t], [t + 1])
                assert delta_storage.transaction_version(
                    spark, current_path(table.directory)) == held
                with table.writer() as writer:
                    # Read through `current`, not every update merged on read.
                    assert delta_storage.current_at(spark, table.directory,
                                                    writer.committed()) is not None
                    assert rows_of(writer.current()) == state_at(history, t, keyed=True), t
                # A reader's rows at the committed version (`Table.latest`): the same fold.
                with calls_in_threads("current_at") as folds:
                    latest = table.latest()
                assert folds and rows_of(latest) == state_at(history, t, keyed=True), t
    assert rows_of(table.current()) == state_at(history, 2, keyed=True)  # never caught up
