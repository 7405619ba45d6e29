"""Active-active capture, the CDCv2 promise of seed 002: two writers of one database's changes,
each with its own slot and process, batch them as their own timing has it; one is killed
mid-stream and restarted. A reader given both logs together gets exactly the database's
history: every update the two wrote twice counted once, none missing, the progress statements
of both true of it.

Each writer has its own log directory (`capture postgres --out A`, `--out B`): a log
directory has one writer, whose restart resumes from what it holds. The reader takes the two
logs of a table as one input, in any order: here the pure-Python reader (the specification),
and `ingest --from materialize` into a lake table for one of them.

Both slots are made before the workload's first transaction, so their initial snapshots
(`[0, consistent point)`, the rows at time 0) say the same rows: a slot made later would
snapshot later changes at time 0, which is another history (see `to_log.py`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from changelake.capture.postgres.avro import from_plain
from changelake.capture.postgres.rows import Table
from changelake.capture.postgres.source import connect
from changelake.capture.postgres.types import catalog
from changelake.demo.postgres import kill_group
from changelake.formats.materialize import read_all
from changelake.protocol import Reader
from tests.support.pg_workload import (
    TABLES,
    Workload,
    canonical,
    capture_command,
    database_rows,
    out_destination,
    run_and_kill,
    slot_position,
)

CHANGELAKE = str(Path(sys.executable).parent / "changelake")


def _started(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as err:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)


def _wait(condition, what: str, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.05)


def _both_logs(dsn: str, logs: list[Path]) -> tuple[dict[str, Counter], list[int]]:
    """Each table's rows and multiplicities from the two logs read as one input by the
    pure-Python reader, and each table's frontier."""
    conn = connect(dsn)
    with conn.cursor() as c:
        lookup = catalog(c)
        tables = {name: Table.from_catalog(c, name, lookup) for name in TABLES}
    conn.close()
    rows, frontiers = {}, []
    for name, table in tables.items():
        reader = Reader()
        held: Counter = Counter()
        # B's messages first, then A's: any order is one input
        for message in read_all([log / name for log in reversed(logs)]):
            for updates, _ in reader.push(message):
                for data, _, diff in updates:
                    held[canonical(tuple(from_plain(table, data)))] += diff
        assert all(n >= 0 for n in held.values()), (name, held)  # none retracted twice
        rows[name] = +held
        frontiers.append(max(reader.frontier) if not reader.frontier.is_closed else -1)
    return rows, frontiers


@pytest.mark.slow  # two captures, a workload, a restart and a Spark ingest: about a minute
def test_two_writers_one_killed_give_the_history_once(pg_dsn: str, tmp_path: Path) -> None:
    workload = Workload(pg_dsn, seed=7, steps=150)
    workload.setup()
    log = tmp_path / "captures.log"
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    command_a, command_b = (
        capture_command(pg_dsn, out_destination(out, pg_dsn), slot, until_idle=8)
        for out, slot in ((out_a, "writer_a"), (out_b, "writer_b")))

    def both_slots_then_the_workload() -> None:
        _wait(lambda: slot_position(pg_dsn, "writer_b") is not None, "slot writer_b")
        workload.start()

    def mid_stream() -> bool:  # B has written a few of the workload's transactions
        return len(list((out_b / "public.accounts").glob("*.avro"))) >= 4

    writer_a = _started(command_a, log)
    writer_b = None
    try:
        _wait(lambda: slot_position(pg_dsn, "writer_a") is not None, "slot writer_a")
        happened = run_and_kill(command_b, pg_dsn, "writer_b", "stream", 0.3, log,
                                when=mid_stream, connected=both_slots_then_the_workload)
        assert happened.startswith("killed"), happened
        writer_b = _started(command_b, log)  # B again, from its slot's confirmed position
        workload.join()
        assert workload.error is None, workload.error
        assert writer_a.wait(timeout=600) == 0, log.read_text()[-3000:]
        assert writer_b.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if workload.ident is None:
            workload.start()
        workload.join()
        kill_group(writer_a)
        if writer_b is not None:
            kill_group(writer_b)

    expected = database_rows(pg_dsn)
    rows, frontiers = _both_logs(pg_dsn, [out_a, out_b])
    for name in TABLES:
        assert rows[name] == expected[name], (
            name, f"missing {expected[name] - rows[name]}", f"extra {rows[name] - expected[name]}")
    assert min(frontiers) > 0
    # each log alone was batched its own way: the two directories do not hold the same files
    names = {d: sorted(p.name for p in (d / "public.accounts").iterdir()) for d in (out_a, out_b)}
    assert names[out_a] != names[out_b]

    # the lake: `ingest` of one table's two logs together
    lake = tmp_path / "lake"
    env_args = ["--lake", str(lake), "--master", "local[1]", "--table", "public.accounts"]
    ingest = subprocess.run([CHANGELAKE, "ingest", *env_args, "--from", "materialize",
                             str(out_a / "public.accounts"), str(out_b / "public.accounts")],
                            capture_output=True, timeout=900)
    assert ingest.returncode == 0, ingest.stderr.decode()[-3000:]
    snapshot = subprocess.run([CHANGELAKE, "snapshot", *env_args, "--format", "jsonl"],
                              capture_output=True, timeout=900)
    assert snapshot.returncode == 0, snapshot.stderr.decode()[-3000:]
    lake_rows = Counter((r["id"], Decimal(str(r["balance"])), r["note"])
                        for r in map(json.loads, snapshot.stdout.splitlines()))
    assert lake_rows == Counter((i, Decimal(b), n) for i, b, n in expected["public.accounts"])
