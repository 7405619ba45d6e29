"""The seed's pipeline with its real components (issue 69): PostgreSQL -> Debezium -> Kafka ->
`changelake ingest --follow --kafka --from debezium` -> lake tables equal to the database.

The embedded PostgreSQL runs `pg_workload`'s seeded workload (a keyed table of transfers, a
table of TOASTed documents updated around their body, a table of events of many types with
transactions of 700 rows committed, rolled back and with a rolled-back savepoint, and a table
with no key, `REPLICA IDENTITY FULL`); changelake's Debezium runner (`capture.debezium`)
streams it to a real Kafka broker, the table topics and the transaction topic, JSON with
schemas; halfway through the workload the runner is killed with SIGKILL and started again, so
it re-sends the tail after its last stored offsets. Then each table is ingested by the command
line (`--follow --until-idle`), and every lake table holds exactly the database's rows:
nothing lost, nothing doubled.

The workload's `TRUNCATE events, marks` (a keyed table and one without a key, in one
transaction) reaches Kafka as truncate events (`DebeziumConfig` writes them:
`skipped.operations=none`), and the lake retracts every row of both tables there.

Two things of the workload are left out here, each a gap of changelake's found with real
Debezium (docs/guides/debezium.md, "Real Debezium"): the `tags int[]` column (arrays: the Spark
path, which `ingest --kafka` uses alone, refuses them; Debezium's `column.exclude.list` drops
it), and an update that moves a document's key while its TOAST
body is unchanged (the new key's row has Debezium's placeholder and no previous row to take
the body from: the lake would hold NULL; `test_debezium_real_samples.py` keeps that case).

And one more: a table whose topic holds only snapshot rows (Debezium snapshots again after a
kill that came before its snapshot's offsets were stored, and a table no later transaction
touches) is committed by `ingest --kafka` with nothing visible: snapshot rows have no time of
their own, and the transaction topic's later ENDs, of other tables' transactions, do not move
that table's frontier past them. The test touches every table once after the workload."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from changelake.capture.debezium import DebeziumConfig, DebeziumRunner
from tests.support.debezium_real import execute, topic_records, wait_for_records
from tests.support.paths import SUPPORT
from tests.support.pg_workload import TABLES, Workload, body, canonical, slot_position

pytestmark = pytest.mark.spark

WORKER = SUPPORT / "debezium_lake_worker.py"
PREFIX = "pipe"
KEYS = {"public.accounts": ["id"], "public.docs": ["id"], "public.events": ["id"],
        "public.marks": []}

#: Each table's rows as the lake holds them (Debezium's text for numeric, jsonb and
#: timestamptz; bytea as code points 0-255), read from the database.
DATABASE_QUERIES = {
    "public.accounts": "SELECT id, balance::text, note FROM accounts",
    "public.docs": "SELECT id, version, title, body FROM docs",
    "public.events": "SELECT id, kind, payload::text, to_char(at AT TIME ZONE 'UTC', "
                     "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), data, ok FROM events",
    "public.marks": "SELECT tag, score, n FROM marks",
}


class PipelineWorkload(Workload):
    """`pg_workload.Workload` without what the pipeline cannot carry yet (module docstring):
    a document keeps its key."""

    truncated = False

    def _truncate(self, c: Any) -> None:
        super()._truncate(c)
        self.truncated = True

    def _doc_change(self, c: Any) -> None:
        """`Workload._doc_change` with its re-keying update made an update of the version."""
        if not self.docs:
            return self._doc_insert(c)
        doc = self.rng.choice(sorted(self.docs))
        what = self.rng.random()
        if what < 0.65:  # the body is not touched: Debezium sends its placeholder
            c.execute("UPDATE docs SET version = version + 1, title = %s WHERE id = %s",
                      (f"v {self.rng.randrange(1000)}", doc))
        elif what < 0.85:
            c.execute("UPDATE docs SET body = %s, version = version + 1 WHERE id = %s",
                      (body(self.rng), doc))
        else:
            c.execute("DELETE FROM docs WHERE id = %s", (doc,))
            self.docs.discard(doc)
        return None


def database_rows(dsn: str) -> dict[str, Counter]:
    conn = psycopg2.connect(dsn)
    out = {}
    with conn.cursor() as c:
        for name, query in DATABASE_QUERIES.items():
            c.execute(query)
            out[name] = Counter(canonical(tuple(
                bytes(v).decode("latin-1") if isinstance(v, memoryview) else v for v in row))
                for row in c.fetchall())
    conn.close()
    return out


@pytest.mark.timeout(1800)
def test_real_debezium_killed_and_restarted_into_the_lake_equals_the_database(
        pg_dsn: str, broker: Any, tmp_path: Path) -> None:
    """`broker`: conftest's real Kafka broker (`kafka.broker.KafkaBroker`)."""
    seed = 69
    print(f"workload seed: {seed}")
    prefix = f"{PREFIX}{int(time.time() * 1000) % 10**9}"  # topics of this run only
    workload = PipelineWorkload(pg_dsn, seed, steps=120, pause=0.1)
    workload.setup()
    execute(pg_dsn, "CREATE TABLE dbz_marker (id int PRIMARY KEY)")
    config = DebeziumConfig(
        dsn=pg_dsn, bootstrap=broker.bootstrap, state=tmp_path / "debezium",
        topic_prefix=prefix, tables=(*TABLES, "public.dbz_marker"), slot=f"dbz_{seed}",
        publication="dbz", partitions=1,
        # Offsets stored every 3 s (Kafka Connect's default is 60 s): the kill re-sends a tail.
        properties={"column.exclude.list": "public\\.events\\.tags",
                    "offset.flush.interval.ms": "3000"})
    runner = DebeziumRunner(config)
    happened = []
    try:
        started = time.monotonic()
        runner.start()
        happened.append(f"streaming after {time.monotonic() - started:.1f} s")
        confirmed = slot_position(pg_dsn, config.slot)
        workload.start()
        # Mid-stream: once Debezium has stored the offsets of a streamed transaction (the
        # slot's confirmed position moves past the snapshot's), and a little later.
        while slot_position(pg_dsn, config.slot) == confirmed and workload.is_alive():
            time.sleep(0.05)
        time.sleep(1.5)
        runner.kill()
        happened.append(f"killed after {workload.done} transactions")
        time.sleep(1)
        runner.start()
        happened.append("started again")
        workload.join()
        assert workload.error is None, workload.error
        assert workload.truncated
        # A change to every table after the restart: a table whose topic holds only a
        # snapshot (the restart's, when the first run's snapshot offsets were not stored yet)
        # has no time past it, and `ingest --kafka` commits nothing of it (module docstring).
        # Then every change is in Kafka once the marker, committed last, is.
        execute(pg_dsn, "UPDATE accounts SET note = note WHERE id = 1",
                "UPDATE docs SET version = version WHERE id = (SELECT min(id) FROM docs)",
                "UPDATE events SET ok = ok WHERE id = (SELECT min(id) FROM events)",
                "UPDATE marks SET n = n WHERE tag = (SELECT min(tag) FROM marks)",
                "INSERT INTO dbz_marker VALUES (1)")
        wait_for_records(broker.bootstrap, f"{prefix}.public.dbz_marker", 1, timeout=180)
        assert runner.stop() == 0
    finally:
        runner.kill()
    happened.append(f"{workload.done} transactions sent in {time.monotonic() - started:.1f} s")
    ends = [r["value"]["payload"] for r in topic_records(broker.bootstrap,
                                                         f"{prefix}.transaction")
            if r["value"] and r["value"]["payload"]["status"] == "END"]
    truncates = [r for r in topic_records(broker.bootstrap, f"{prefix}.public.marks")
                 if r["value"] and r["value"]["payload"]["op"] == "t"]
    assert truncates, "no truncate event: Debezium skipped the TRUNCATE"
    resent = len(ends) - len({e["id"] for e in ends})
    happened.append(f"{len(ends)} ENDs on the transaction topic, {resent} re-sent")
    assert resent > 0, happened  # the restart re-sent what the kill had not stored

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"lake": str(tmp_path / "lake"), "bootstrap": broker.bootstrap,
                                "prefix": prefix, "master": "local[1]", "tables": KEYS,
                                "until_idle": 2}))
    dump = tmp_path / "lake.dump"
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(WORKER), str(spec), str(dump)],
                          capture_output=True, timeout=1200)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    tables, seconds = pickle.loads(dump.read_bytes())
    happened.append(f"ingested in {time.monotonic() - started:.1f} s: {seconds}")
    print("\n".join(happened))
    expected = database_rows(pg_dsn)
    for name in KEYS:
        got = Counter(canonical(row) for row in tables[name])
        assert got == expected[name], (name, happened,
                                       f"missing {expected[name] - got}",
                                       f"extra {got - expected[name]}")
