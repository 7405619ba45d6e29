"""The Debezium part of the demo: the seed's pipeline with its real components, PostgreSQL ->
Debezium -> a Kafka broker -> `ingest --kafka --from debezium` -> lake tables, on the same
database and workload that the `postgres` part's own capture reads, and the two captures of it
compared.

Debezium (changelake's runner, `capture.debezium`: Debezium's embedded engine and its
PostgreSQL connector, a JVM process of its own) gets a slot and a publication of its own and
starts before the workload's first transaction, so both captures see the same transactions;
it writes the table topics and the transaction topic to a real broker (`kafka.broker`,
started by the demo in its work folder). Once the workload is mid-stream it is killed with
SIGKILL and started again: it re-sends what followed its last stored offsets (stored every
3 s here), which the ingest absorbs. After the workload, one more transaction touches each
of its tables without changing a value; once its END is on the transaction topic, Debezium
has sent everything before it, and it is stopped. Each table is then ingested from its topic
and the transaction topic, twice: the second run finds nothing new to commit.

The checks: each table Debezium fed equals the database table; it equals the capture's table
of the same database table, row for row; and AS OF the ends of a few of the workload's
transactions the two lakes agree. Both give a transaction's changes an LSN as their time, not
the same one: the capture its commit LSN, Debezium (`formats/debezium.py`) the end of the
transaction before it (`source.sequence[0]`). So AS OF the commit LSN of a transaction that
Debezium saw, each lake holds exactly the changes of that transaction and those before; the
times compared are such commit LSNs (the capture's times of the captured tables' changes,
after its snapshot).

What is captured is `TABLES`, the workload's tables that are never truncated; `documents`
without its `tags` column (an array: the Spark path, which `ingest --kafka` uses alone,
refuses arrays; Debezium's `column.exclude.list` leaves it out). `events`, truncated once by
the workload, joins `TABLES` when the Spark path converts Debezium's truncate events (today it
refuses them, and Debezium skips truncates by default: that table would differ from the
database).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from changelake.demo.postgres import (
    DEBEZIUM_PUBLICATION,
    DEBEZIUM_SLOT,
    Check,
    Workload,
    confirmed_lsn,
    connect,
    database_rows,
)

TABLES = ("public.accounts", "public.ledger", "public.documents")
"""The tables Debezium captures: the workload's tables that it never truncates. `public.events`
(truncated once) joins them when the Spark path converts Debezium's truncate events."""
KEYS = {"public.accounts": ("id",), "public.ledger": ("id",), "public.documents": ("id",)}
EXCLUDED_COLUMNS = {"public.documents": ("tags",)}
"""Columns left out of Debezium's events (arrays, which the Spark path refuses)."""
PREFIX = "demo"
LAKE_DATABASE = "dbz"
TRANSACTION_TOPIC = f"{PREFIX}.transaction"
OFFSET_FLUSH_MS = 3000
"""How often Debezium stores its offsets (Kafka Connect's default is 60 s): the kill finds
some stored and re-sends what came after."""


def lake_table(name: str) -> str:
    """The lake table Debezium's topic of the database table `name` lands in: `dbz.<table>`."""
    return f"{LAKE_DATABASE}.{name.split('.')[1]}"


def topic(name: str) -> str:
    return f"{PREFIX}.{name}"


def transaction_records(bootstrap: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every record on the transaction topic (its payloads), in offset order."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "changelake-demo",
                         "enable.auto.commit": False})
    try:
        partitions = sorted(consumer.list_topics(TRANSACTION_TOPIC, timeout=timeout)
                            .topics[TRANSACTION_TOPIC].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(TRANSACTION_TOPIC, p),
                                                  timeout=timeout)[1] for p in partitions}
        consumer.assign([TopicPartition(TRANSACTION_TOPIC, p, 0) for p in partitions
                         if ends[p] > 0])
        got: dict[int, list[dict[str, Any]]] = {p: [] for p in partitions}
        read = dict.fromkeys(partitions, 0)
        deadline = time.monotonic() + timeout
        while any(read[p] < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{TRANSACTION_TOPIC}: read {read} of {ends}")
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            read[message.partition()] = message.offset() + 1
            value = orjson.loads(message.value()) if message.value() else None
            if value is not None and message.offset() < ends[message.partition()]:
                got[message.partition()].append(value.get("payload", value))
    finally:
        consumer.close()
    return [record for p in partitions for record in got[p]]


@dataclass
class DebeziumDemo:
    """Debezium beside the capture, on the database at `dsn`, writing to the broker at
    `bootstrap`, its state (offsets, log) in `state`. `start` is `run_postgres_capture`'s
    `before_workload`; `finish` after the workload; `kill` in every path (the demo's exit
    stack)."""

    dsn: str
    bootstrap: str
    state: Path
    seed: int = 0
    steps: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from changelake.capture.debezium import DebeziumConfig, DebeziumRunner

        excluded = ",".join(f"{table}.{c}".replace(".", "\\.")
                            for table, columns in EXCLUDED_COLUMNS.items() for c in columns)
        self.config = DebeziumConfig(
            dsn=self.dsn, bootstrap=self.bootstrap, state=self.state, topic_prefix=PREFIX,
            slot=DEBEZIUM_SLOT, publication=DEBEZIUM_PUBLICATION, tables=TABLES,
            partitions=1, properties={"column.exclude.list": excluded,
                                      "offset.flush.interval.ms": str(OFFSET_FLUSH_MS)})
        self.runner = DebeziumRunner(self.config)
        self._killer: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, workload: Workload) -> None:
        """Start Debezium (it makes its slot and publication and reads its snapshot) and,
        in a thread, kill it once the workload is mid-stream and start it again."""
        started = time.monotonic()
        self.runner.start()
        self.steps.append(("Debezium started: its slot made, snapshot read, streaming",
                           f"{time.monotonic() - started:.1f} s"))
        self._killer = threading.Thread(target=self._kill_once, args=(workload,), daemon=True,
                                        name="changelake-demo-debezium")
        self._killer.start()

    def _kill_once(self, workload: Workload) -> None:
        try:
            first = confirmed_lsn(self.dsn, DEBEZIUM_SLOT)
            # Mid-stream: the workload's second half (the capture confirmed part of the stream)
            # and Debezium's offsets stored past its slot's start.
            while not workload.streaming.wait(0.2):
                if not workload.is_alive() and workload.done:
                    break
            deadline = time.monotonic() + 60
            while confirmed_lsn(self.dsn, DEBEZIUM_SLOT) == first \
                    and time.monotonic() < deadline and not workload.stop.is_set():
                time.sleep(0.2)
            time.sleep(random.Random(self.seed).uniform(0.3, 1.5))
            if workload.stop.is_set():
                return
            done = workload.done
            self.runner.kill()
            again = time.monotonic()
            self.runner.start()
            self.steps.append(("Debezium killed with SIGKILL mid-workload, started again",
                               f"after {done} of {workload.transactions} transactions; "
                               f"streaming again in {time.monotonic() - again:.1f} s"))
        except BaseException as e:  # reported by `finish`
            self._error = e

    def finish(self, timeout: float = 180.0) -> None:
        """After the workload: one transaction touching each table without changing a value
        (so every table has a change after any snapshot Debezium took again); once its END
        is on the transaction topic, stop Debezium (SIGTERM: it stores its offsets)."""
        from changelake.capture.debezium import DebeziumError

        if self._killer is not None:
            self._killer.join(timeout)
        if self._error is not None:
            raise DebeziumError(f"the Debezium part failed: {self._error}") from self._error
        conn = connect(self.dsn)
        try:
            with conn.cursor() as cursor:
                cursor.execute("UPDATE accounts SET owner = owner WHERE id = "
                               "(SELECT min(id) FROM accounts)")
                cursor.execute("UPDATE ledger SET amount = amount WHERE id = "
                               "(SELECT min(id) FROM ledger)")
                cursor.execute("UPDATE documents SET title = title WHERE id = "
                               "(SELECT min(id) FROM documents)")
                cursor.execute("SELECT txid_current() % 4294967296")
                xid = str(cursor.fetchone()[0])
            conn.commit()
        finally:
            conn.close()
        deadline = time.monotonic() + timeout
        while True:
            ends = [r for r in transaction_records(self.bootstrap) if r.get("status") == "END"]
            if any(str(r.get("id", "")).split(":")[0] == xid for r in ends):
                break
            if not self.runner.running:
                raise DebeziumError(f"Debezium stopped before it sent the last transaction; "
                                    f"see {self.runner.log}")
            if time.monotonic() > deadline:
                raise DebeziumError(f"Debezium had not sent the last transaction after "
                                    f"{timeout:g} s; see {self.runner.log}")
            time.sleep(0.5)
        if self.runner.stop() != 0:
            raise DebeziumError(f"Debezium did not stop cleanly; see {self.runner.log}")
        ids = [r["id"] for r in ends]
        self.steps.append(("transactions on the transaction topic (ENDs), re-sent by the "
                           "restart", f"{len(set(ids)):,}, {len(ids) - len(set(ids)):,}"))

    def kill(self) -> None:
        """Kill Debezium if it runs, and remove its properties file (it holds the DSN's
        password, if it has one)."""
        self.runner.kill()
        (self.state / "debezium.properties").unlink(missing_ok=True)

    def ingest(self, spark: Any, lake_dir: Path) -> list[Check]:
        """Each table's topic and the transaction topic into its lake table
        (`ingest --kafka --from debezium`), twice; the checks of the second run."""
        from changelake.lake.catalog import Lake
        from changelake.lake.kafka_changefeed import ingest_changefeed_topics

        lake = Lake(spark, lake_dir)
        checks = []
        for name in TABLES:
            table = lake_table(name)
            topics = [topic(name), TRANSACTION_TOPIC]
            first = ingest_changefeed_topics(lake, table, self.bootstrap, topics,
                                             source="debezium", key=KEYS[name])
            version = lake.table(table).state().version
            again = ingest_changefeed_topics(lake, table, self.bootstrap, topics,
                                             source="debezium", key=KEYS[name])
            self.steps.append((f"{topic(name)} --ingest --kafka --from debezium--> {table} "
                               "(twice)", f"{first.records:,} + {again.records:,} records read"))
            checks.append(Check(f"{table}: a second ingest commits nothing "
                                f"({again.records:,} records read again)",
                                lake.table(table).state().version == version))
        return checks


def _compared(capture: Any, debezium: Any, columns: list[str]) -> tuple[Counter, Counter]:
    """Two frames' rows on `columns`, Debezium's cast to the capture's types."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in capture.schema.fields}
    left = Counter(tuple(r) for r in capture.select(*(F.col(f"`{c}`") for c in columns))
                   .collect())
    right = Counter(tuple(r) for r in debezium.select(
        *(F.col(f"`{c}`").cast(types[c]).alias(c) for c in columns)).collect())
    return left, right


def check(spark: Any, dsn: str, lake_dir: Path, *, times: int = 6, seed: int = 0
          ) -> list[Check]:
    """The checks of the module docstring, on `spark`, whose metastore is the lake's."""
    from changelake.capture.postgres.consistency import consistent_frontier
    from changelake.capture.postgres.pgoutput import format_lsn
    from changelake.lake.catalog import Lake

    lake = Lake(spark, lake_dir)
    checks = []
    columns = {}
    for name in TABLES:
        fed = lake.table(lake_table(name))
        columns[name] = [f.name for f in fed.current().schema.fields]
        database, lake_rows = database_rows(dsn, lake, name, lake_name=lake_table(name),
                                            columns=columns[name])
        checks.append(Check(f"{lake_table(name)} (Debezium) equals the database table "
                            f"({sum(database.values()):,} rows)", database == lake_rows))
        ours, theirs = _compared(lake.table(name).current(), fed.current(), columns[name])
        checks.append(Check(f"{lake_table(name)} (Debezium) equals {name} (changelake's "
                            f"capture), row for row", ours == theirs))
    frontier = consistent_frontier(lake, TABLES)
    committed = sorted({r["_time"] for name in TABLES for r in lake.table(name).updates()
                        .select("_time").distinct().collect()})
    # After the capture's snapshot (its time is no transaction's commit LSN) and before its
    # frontier: commit LSNs of transactions that changed a captured table, which Debezium saw.
    committed = [t for t in committed[1:] if frontier is None or t < frontier]
    rng = random.Random(seed)
    picked = sorted({*committed[-1:], *rng.sample(committed, min(times - 1, len(committed)))})
    held = []
    for at in picked:
        same = True
        for name in TABLES:
            ours, theirs = _compared(lake.table(name).as_of(at),
                                     lake.table(lake_table(name)).as_of(at), columns[name])
            same = same and ours == theirs
        held.append(same)
    span = f"LSNs {format_lsn(picked[0])} to {format_lsn(picked[-1])}" if picked else "none"
    checks.append(Check(f"the Debezium tables equal the capture's AS OF the commit LSNs of "
                        f"{len(picked)} transactions ({span}), each table",
                        bool(picked) and all(held)))
    return checks
