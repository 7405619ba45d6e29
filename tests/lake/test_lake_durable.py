"""Durable before told, in the lake: a Hive-format commit's Parquet files and directories are
fsync'd before its commit point (the view change), the manifest before it and the pointer
after; a Delta commit's data files and log entries are fsync'd before the commit returns; and
`capture postgres --lake` confirms its slot only once everything the tables' commits wrote is
on the disk. Spark's writer and Delta's log store sync nothing themselves, so each check fails
without the lake's own `sync_tree`.

The order is recorded in this process (`sync_order.SyncLog`: `os.fsync` and `os.replace`
wrapped, the view statements and the slot confirmations marked), and once across a real
`changelake ingest` process under strace (slow tier; skipped without strace)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest
from pyspark.sql import SparkSession

from changelake.capture.postgres.source import Source
from changelake.capture.postgres.to_lake import CaptureOptions, LakeCapture
from changelake.lake import Lake, ingest
from changelake.lake.compact import compact
from changelake.lake.layout import manifest_path, pointer_path
from tests.support.paths import SAMPLES
from tests.support.sync_order import (
    SyncLog,
    files_under,
    needs_strace,
    strace_command,
    strace_events,
)

pytestmark = pytest.mark.spark

SAMPLE = SAMPLES / "derived-rw-debezium-postgres-values.jsonl"
CLI = [str(Path(sys.executable).parent / "changelake")]


def record(monkeypatch: pytest.MonkeyPatch) -> SyncLog:
    """fsyncs and renames, and each view statement (the Hive format's commit point) marked
    "view" as it is sent."""
    log = SyncLog().install(monkeypatch)
    real = SparkSession.sql

    def sql(self, query: str, *args, **kwargs):
        if query.lstrip().upper().startswith(("ALTER VIEW", "CREATE VIEW")):
            log.mark("view", query)
        return real(self, query, *args, **kwargs)

    monkeypatch.setattr(SparkSession, "sql", sql)
    return log


def check_file_sets_synced_before_their_view(log: SyncLog, table_dir: Path, paths,
                                             version: int) -> None:
    """Every file and directory of the file sets `paths` (relative to `table_dir`), the
    directories above them up to the table's, and version `version`'s manifest and `_state`,
    synced before the view statement that commits `version`; its pointer after."""
    manifest = log.renamed_to(manifest_path(table_dir, version))
    view = log.index("view", start=manifest)
    synced = log.synced(before=view)
    for rel in paths:
        leaf = table_dir / rel
        files = files_under(leaf)
        assert files and files <= synced, (rel, files - synced)
        directories = {str(p) for p in leaf.rglob("*") if p.is_dir()} | {str(leaf)}
        assert directories <= synced, directories - synced
        parent = leaf.parent
        while parent != table_dir.parent:
            assert str(parent) in synced, parent
            parent = parent.parent
    assert any(e == ("fsync", str(table_dir / "_state")) for e in log.events[manifest:view])
    log.renamed_to(pointer_path(table_dir), start=view)  # after it


def test_a_hive_ingest_and_compaction_sync_their_files_before_the_view_changes(
        spark, tmp_path, monkeypatch) -> None:
    lake = Lake(spark, tmp_path / "lake", storage="hive")
    log = record(monkeypatch)
    report = ingest.ingest(lake, "durable_hive", [SAMPLE], key=["order_id"],
                             source="debezium", close=True)
    table = lake.table("durable_hive")
    state = table.state()
    assert state.storage == "hive" and report.commit.written > 0
    table_dir = table.directory
    check_file_sets_synced_before_their_view(
        log, table_dir, [f.path for f in state.segments()], state.version)
    # the new table's directories, up to the lake, before its first view
    first_view = log.index("view")
    for directory in (table_dir, table_dir.parent, table_dir.parent.parent):
        assert str(directory) in log.synced(before=first_view), directory

    log.events.clear()
    result = compact(table)
    compacted = table.state()
    assert result.version == compacted.version
    written = [f.path for f in compacted.files if f"v{compacted.version}" in f.path]
    assert written, compacted.files
    check_file_sets_synced_before_their_view(log, table_dir, written, compacted.version)


def test_a_delta_commit_syncs_its_data_and_log_before_it_returns(spark, tmp_path,
                                                                 monkeypatch) -> None:
    lake = Lake(spark, tmp_path / "lake", storage="delta")
    log = record(monkeypatch)
    ingest.ingest(lake, "durable_delta", [SAMPLE], key=["order_id"], source="debezium",
                    close=True)
    table = lake.table("durable_delta")
    state = table.state()
    assert state.storage == "delta"
    table_dir = table.directory
    synced = log.synced()
    for part in ("updates", "current"):  # data files, _delta_log entries, checksums
        files = files_under(table_dir / part)
        assert any(f.endswith(".parquet") for f in files)
        assert any("/_delta_log/" in f and f.endswith(".json") for f in files)
        assert files <= synced, files - synced
        assert str(table_dir / part / "_delta_log") in synced
        assert str(table_dir / part) in synced
    assert str(manifest_path(table_dir, state.version)) in synced or any(
        e[0] == "rename" and e[2] == str(manifest_path(table_dir, state.version))
        for e in log.events)
    assert str(table_dir) in synced


@pytest.fixture
def sql(pg_dsn: str):
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        yield c
    conn.close()


def lake_files(table_dir: Path) -> set[str]:
    """What a table's commits wrote: file sets, manifests, Delta tables."""
    found: set[str] = set()
    for part in ("seg", "delta", "base", "updates", "current"):
        if (table_dir / part).is_dir():
            found |= files_under(table_dir / part)
    found |= {str(p) for p in (table_dir / "_state").glob("v*.json")}
    return found


@pytest.mark.parametrize("storage", ["hive", "delta"])
def test_capture_confirms_the_slot_only_after_the_lake_is_synced(
        spark, pg_dsn, sql, tmp_path, monkeypatch, storage) -> None:
    name = f"dur_{storage}"  # one name each: a view and a Delta table drop differently
    sql.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, s text)")
    sql.execute(f"CREATE PUBLICATION p FOR TABLE {name}")
    sql.execute(f"INSERT INTO {name} SELECT g, 'snap' FROM generate_series(1, 20) g")
    lake = Lake(spark, tmp_path / "lake", storage=storage)
    try:
        check_capture(spark, pg_dsn, sql, lake, name, monkeypatch)
    finally:
        kind = "TABLE" if storage == "delta" else "VIEW"
        spark.sql(f"DROP {kind} IF EXISTS `public`.`{name}`")


def check_capture(spark, pg_dsn, sql, lake: Lake, name: str, monkeypatch) -> None:
    log = SyncLog().install(monkeypatch)
    table_dir = lake.handle(f"public.{name}").directory
    unsynced: list[tuple[int, set[str]]] = []
    real = Source.confirm

    def confirm(self, lsn: int) -> None:
        # Everything the lake holds now must be on the disk before PostgreSQL is told.
        missing = lake_files(table_dir) - log.synced()
        unsynced.append((lsn, missing))
        log.mark("confirm", str(lsn))
        real(self, lsn)

    monkeypatch.setattr(Source, "confirm", confirm)
    options = CaptureOptions(pg_dsn, "p", f"{name}_slot", create_slot=True, until_idle=0.5,
                             heartbeat_seconds=0.3)
    LakeCapture(lake, options).run()
    for g in range(3):
        sql.execute(f"INSERT INTO {name} VALUES ({100 + g}, 'streamed')")
        sql.execute(f"UPDATE {name} SET s = 'changed {g}' WHERE id = {g + 1}")
    report = LakeCapture(lake, CaptureOptions(pg_dsn, "p", f"{name}_slot", until_idle=1.0,
                                              heartbeat_seconds=0.3)).run()
    assert report.transactions == 6
    assert unsynced, "the capture never confirmed the slot"
    assert all(not missing for _, missing in unsynced), [m for _, m in unsynced if m]
    assert lake.table(f"public.{name}").current().count() == 23
    # what the streamed transactions wrote is among what was synced before a confirmation
    assert any(f.endswith(".parquet") for f in lake_files(table_dir) & log.synced(
        before=log.positions("confirm")[-1]))


@pytest.mark.slow  # a Spark process under strace
@needs_strace
def test_the_ingest_command_syncs_the_segment_before_its_manifest_under_strace(
        tmp_path) -> None:
    trace = tmp_path / "trace"
    lake = tmp_path / "lake"
    done = subprocess.run([*strace_command(trace), "--seccomp-bpf", *CLI, "ingest", "--lake",
                           str(lake), "--master", "local[1]", "--format", "hive", "--table",
                           "orders", "--key", "order_id", "--from", "debezium", "--close",
                           str(SAMPLE)], capture_output=True, timeout=900)
    assert done.returncode == 0, done.stderr
    events = strace_events(trace)
    table_dir = lake / "tables" / "default" / "orders"
    segments = sorted((table_dir / "seg").iterdir())
    assert segments
    manifest = next(i for i, e in enumerate(events)
                    if e[0] == "rename" and e[2] == str(manifest_path(table_dir, 1)))
    synced = {e[1] for e in events[:manifest] if e[0] == "fsync"}
    for segment in segments:  # the manifest is written just before the view changes
        files = files_under(segment)
        assert files and files <= synced, files - synced
        assert str(segment) in synced and str(table_dir / "seg") in synced
    assert any(e[0] == "rename" and e[2] == str(pointer_path(table_dir))
               for e in events[manifest:])  # the pointer after the commit point


def test_a_follow_batch_syncs_its_state_before_the_lake_commit(spark, tmp_path,
                                                               monkeypatch) -> None:
    """`ingest --follow`: a batch's pending state is what the next batch starts from, so it
    is on the disk (its files, its directory under its temporary name, the rename) before the
    lake commit records the batch as done."""
    from changelake.lake.follow import CommitBatches, FollowControl, check_checkpoint
    from tests.lake.test_lake_follow import _batch, drop, pieces
    from tests.support.seeding import seeded

    source, checkpoint = tmp_path / "src", tmp_path / "checkpoint"
    files = [drop(source, n, piece) for n, piece in enumerate(pieces(seeded(7), 4))]
    lake = Lake(spark, tmp_path / "lake", storage="hive")
    check_checkpoint(checkpoint, "durable_follow", str(source))
    sink = CommitBatches(lake, "durable_follow", checkpoint, "by-hand", str(source),
                         FollowControl())
    log = record(monkeypatch)
    sink(_batch(spark, files[:2]), 0)
    states = checkpoint / "state" / "by-hand"
    final = states / f"{0:012d}"
    placed = next(i for i, e in enumerate(log.events) if e[0] == "rename" and e[2] == str(final))
    temporary = Path(log.events[placed][1])
    before = log.synced(before=placed)
    inside = {str(temporary / p.relative_to(final)) for p in final.rglob("*")}
    assert str(temporary / "state.json") in inside and inside <= before, inside - before
    assert {str(temporary), str(states)} <= before
    view = log.index("view", start=placed)
    assert ("fsync", str(states)) in log.events[placed:view]  # the rename, then the commit
