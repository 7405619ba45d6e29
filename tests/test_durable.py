"""Durable before told: `sync_tree` syncs what a writer left unsynced (files, then their
directories, up to the table directory), and a file replaced whole (`--state`) is on the disk
before its name points at it, and its rename before the command says it saved it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from changelake.durable import replaced_whole, sync_tree
from changelake.formats.materialize import write_json_lines
from changelake.local import decode_local
from changelake.simulate import mangle, random_history, write
from tests.support.seeding import seeded
from tests.support.sync_order import SyncLog, needs_strace, strace_command, strace_events

CLI = [str(Path(sys.executable).parent / "changelake")]


def test_sync_tree_syncs_files_then_directories_up_to_the_top(tmp_path, monkeypatch) -> None:
    table = tmp_path / "table"
    written = table / "delta" / "v3"
    (written / "_bucket=0").mkdir(parents=True)
    (written / "_bucket=0" / "part-0.parquet").write_bytes(b"x")
    (written / "_SUCCESS").write_bytes(b"")
    log = SyncLog().install(monkeypatch)
    assert sync_tree(written, table) == 6
    order = [e[1] for e in log.events]
    files = {str(written / "_bucket=0" / "part-0.parquet"), str(written / "_SUCCESS")}
    assert set(order[:2]) == files  # the files first, then each directory after its entries
    assert order[2:] == [str(written / "_bucket=0"), str(written), str(table / "delta"),
                         str(table)]
    assert str(tmp_path) not in order  # not above the top


def test_sync_tree_without_a_top_syncs_the_parent_and_a_file_alone(tmp_path,
                                                                    monkeypatch) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    log = SyncLog().install(monkeypatch)
    sync_tree(tmp_path / "d")
    assert [e[1] for e in log.events] == [str(tmp_path / "d" / "f"), str(tmp_path / "d"),
                                          str(tmp_path)]
    log.events.clear()
    sync_tree(tmp_path / "d" / "f")
    assert [e[1] for e in log.events] == [str(tmp_path / "d" / "f"), str(tmp_path / "d")]


def test_sync_tree_newer_than_syncs_only_what_changed(tmp_path, monkeypatch) -> None:
    old, new = tmp_path / "t" / "old", tmp_path / "t" / "new"
    old.mkdir(parents=True)
    (old / "a").write_text("a")
    for path in (old / "a", old):
        os.utime(path, (1_000, 1_000))
    new.mkdir()
    (new / "b").write_text("b")
    log = SyncLog().install(monkeypatch)
    sync_tree(tmp_path / "t", newer_than=2_000)
    synced = log.synced()
    assert str(new / "b") in synced and str(new) in synced and str(tmp_path / "t") in synced
    assert str(old / "a") not in synced and str(old) not in synced


def test_sync_tree_leaves_other_file_systems_to_their_store(tmp_path, monkeypatch) -> None:
    log = SyncLog().install(monkeypatch)
    assert sync_tree("s3a://bucket/lake/tables/t") == 0
    assert sync_tree(f"hdfs://nn:8020{tmp_path}") == 0
    (tmp_path / "f").write_text("x")
    assert sync_tree(f"file://{tmp_path / 'f'}") == 2  # a file: URI is a local path
    assert log.synced() == {str(tmp_path / "f"), str(tmp_path)}


def test_replaced_whole_syncs_the_file_before_the_rename_and_the_directory_after(
        tmp_path, monkeypatch) -> None:
    path = tmp_path / "state.json"
    log = SyncLog().install(monkeypatch)
    with replaced_whole(path) as fo:
        fo.write(b"{}")
    temporary = tmp_path / ".state.json.tmp"
    assert log.events == [("fsync", str(temporary)),
                          ("rename", str(temporary), str(path)),
                          ("fsync", str(tmp_path))]


def _two_halves(tmp_path: Path) -> tuple[Path, Path]:
    rng = seeded(66)
    log = mangle([write(random_history(rng, updates=120, times=8), batch_size=5)], rng)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    with open(first, "wb") as fo:
        write_json_lines(fo, log[: len(log) // 2])
    with open(second, "wb") as fo:
        write_json_lines(fo, log[len(log) // 2:])
    return first, second


def _check_state_order(events: list[tuple[str, ...]], state: Path, output: Path) -> None:
    """The output, then the state's temporary file, synced before the state's rename, and
    the directory after it."""
    temporary = str(state.with_name(f".{state.name}.tmp"))
    renamed = next(i for i, e in enumerate(events)
                   if e[0] == "rename" and e[1:] == (temporary, str(state)))
    before = [e[1] for e in events[:renamed] if e[0] == "fsync"]
    assert temporary in before, events
    assert str(output) in before[:before.index(temporary)], events  # printed, then saved
    assert ("fsync", str(state.parent)) in events[renamed + 1:], events


def test_decode_state_is_synced_before_it_replaces_the_old(tmp_path, monkeypatch) -> None:
    first, _ = _two_halves(tmp_path)
    state, output = tmp_path / "reader.json", tmp_path / "out.jsonl"
    log = SyncLog().install(monkeypatch)
    with open(output, "wb") as out:
        decode_local([str(first)], out, state=state)
    _check_state_order(log.events, state, output)


@needs_strace
def test_decode_state_is_synced_by_the_command_under_strace(tmp_path) -> None:
    first, second = _two_halves(tmp_path)
    state, trace = tmp_path / "reader.json", tmp_path / "trace"
    for part in (first, second):  # the second replaces an existing state
        output = tmp_path / f"{part.stem}.out"
        with open(output, "wb") as out:
            done = subprocess.run([*strace_command(trace), *CLI, "decode", "--state",
                                   str(state), str(part)], stdout=out, stderr=subprocess.PIPE,
                                  timeout=120)
        assert done.returncode == 0, done.stderr
        _check_state_order(strace_events(trace), state, output)


@pytest.mark.parametrize("special", ["/dev/null"])
def test_replaced_whole_writes_a_special_file_in_place(special: str) -> None:
    with replaced_whole(Path(special)) as fo:
        fo.write(b"x")
    assert Path(special).exists()
