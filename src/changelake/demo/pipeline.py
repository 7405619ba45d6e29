"""The pipeline demo: a Debezium changefeed (snapshot, transactions, a replayed tail after a
restart) converted to CDCv2, mangled, delivered in several parts into a log directory, ingested
into a keyed lake table after each delivery (exactly once, on Spark), compacted in between, and
checked against the generated truth now and AS OF earlier times.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from changelake.formats.materialize import CdcSchema
from changelake.simulate import ORDER_COLUMNS, debezium_orders, mangle, write_log_files


@dataclass(frozen=True, slots=True)
class PipelineStep:
    name: str
    figure: str


@dataclass(frozen=True, slots=True)
class PipelineResult:
    steps: list[PipelineStep]
    checks: list[tuple[str, bool]]

    @property
    def ok(self) -> bool:
        return all(passed for _, passed in self.checks)


ORDERS_FIELDS = [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": ["null", "string"]},
    {"name": "amount_cents", "type": ["null", "long"]},
    {"name": "status", "type": ["null", "string"]},
]


def _rows(frame: Any) -> list[tuple]:
    return sorted(tuple(r[c] for c in ORDER_COLUMNS) for r in frame.collect())


def _truth(state: dict[int, dict]) -> list[tuple]:
    return sorted(tuple(row[c] for c in ORDER_COLUMNS) for row in state.values())


def run_pipeline_demo(
    workdir: Path, spark: Any, *, seed: int = 0, rows: int = 200, transactions: int = 300,
    table: str = "demo.orders", deliveries: int = 3, lake: Path | str | None = None,
) -> PipelineResult:
    """Debezium changefeed -> CDCv2 -> an at-least-once log -> exactly-once lake ingest in
    several deliveries, compaction between them -> checks against the generated truth.

    `spark` is a session with Hive support (the CLI builds one on the lake's metastore; tests
    pass theirs); the lake is `lake` (a directory or a remote URI; default: `workdir/lake`).
    """
    from changelake.convert import encode_changefeed
    from changelake.lake import api, ingest
    from changelake.lake.catalog import Lake

    rng = random.Random(seed)
    feed = debezium_orders(rng, rows=rows, transactions=transactions)
    steps: list[PipelineStep] = []
    checks: list[tuple[str, bool]] = []
    source = workdir / "debezium" / "orders.jsonl"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in feed.events))
    steps.append(PipelineStep("Debezium events (snapshot, transactions, replayed tail)",
                              f"{len(feed.events):,} ({feed.replayed} replayed)"))

    messages = list(encode_changefeed([source], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    schema = CdcSchema.for_fields(ORDERS_FIELDS)
    # An at-least-once log is mostly in order, with local disorder: each delivery carries
    # the next stretch of messages, re-batched, duplicated and shuffled.
    chunk = -(-len(messages) // deliveries)
    parts = [mangle([messages[i * chunk : (i + 1) * chunk]], rng, duplicate=0.5)
             for i in range(deliveries)]
    steps.append(PipelineStep("CDCv2 messages, then re-batched, duplicated and shuffled",
                              f"{len(messages):,} -> {sum(map(len, parts)):,}"))
    logdir = workdir / "log"
    schema_file = workdir / "orders.avsc"
    schema_file.write_bytes(orjson.dumps(schema.avro))

    lake = Lake(spark, workdir / "lake" if lake is None else lake)
    delivered: list[Path] = []
    for i, part in enumerate(parts):
        delivered += write_log_files(logdir, [part], schema, prefix="delivery-", start=i)
        if i == deliveries - 1 and deliveries > 1:  # the log re-delivers an earlier file
            first = delivered[0]
            (logdir / f"again-{first.name}").write_bytes(first.read_bytes())
        report = ingest.ingest(lake, table, [logdir], key=["id"], source="materialize",
                             schema=schema_file)
        steps.append(PipelineStep(
            f"ingest after delivery {i + 1} (the whole log directory again)",
            f"{report.commit.written:,} new updates, frontier {report.frontier}"))
        if i == deliveries - 2:
            result = api.compact(lake, table)
            steps.append(PipelineStep(
                "compact", f"since {result.since_before} -> {result.since}, "
                           f"{len(result.buckets_touched)} bucket(s) rewritten"))
    again = ingest.ingest(lake, table, [logdir], key=["id"], source="materialize",
                        schema=schema_file)
    checks.append(("ingesting the same log again changes nothing", again.commit.skipped))

    handle = lake.table(table)
    current = _rows(handle.current())  # the metastore view: plain Spark SQL reads this
    checks.append(("current state = the feed's final state, one row per key",
                   current == _truth(feed.final)))
    since = handle.since
    as_of_times = [t for t, _ in feed.states if t >= since]
    picked = sorted({as_of_times[0], as_of_times[len(as_of_times) // 2], as_of_times[-1]})
    for t in picked:
        state = next(s for time, s in reversed(feed.states) if time <= t)
        checks.append((f"AS OF {t} = the state after that transaction",
                       _rows(handle.as_of(t)) == _truth(state)))
    steps.append(PipelineStep("rows in the lake table", f"{len(current):,}"))
    return PipelineResult(steps, checks)


def warm_up(workdir: Path, spark: Any) -> None:
    """The training run of the JVM's class archive (`spark.class_archive`): a small pipeline
    demo (a Materialize CDC log decoded on Spark into a keyed table over the embedded
    metastore, compaction, AS OF reads), and the same Debezium feed ingested on the
    changefeed's Spark path, so that the classes both paths load are archived. Raises if a
    check fails: an archive of a run that went wrong would miss classes, not be wrong."""
    from changelake.errors import ChangelakeError
    from changelake.lake import ingest
    from changelake.lake.catalog import Lake

    result = run_pipeline_demo(workdir, spark, rows=40, transactions=60, deliveries=2)
    failed = [name for name, passed in result.checks if not passed]
    feed = workdir / "debezium" / "orders.jsonl"
    report = ingest.ingest(Lake(spark, workdir / "lake"), "demo.orders_from_debezium",
                             [feed], key=["id"], source="debezium", close=True)
    if failed or not report.commit.written:
        raise ChangelakeError(f"the class archive's training run failed: {failed or report}")
