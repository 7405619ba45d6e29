"""The Kafka demo, on librdkafka's mock cluster (no broker to install): a Debezium topic is
ingested into a lake table straight from its offsets (a second run, `--close`, resumes where
the first committed), and converted to a CDCv2 topic (the sink run twice, as after a crash: the
duplicates are what the format absorbs), ingested into a lake table from the offsets its
commits record (a second ingest reads nothing again), and the table's change feed goes out to
another CDCv2 topic that `decode` reads back to the table's history.

Each step is the library call the matching CLI command makes:

    Debezium topic --ingest --kafka --from debezium--> lake table (resumed at its offsets)
    Debezium topic --encode --from debezium --kafka--> cdc.orders (Confluent-framed Avro)
    cdc.orders --ingest --kafka--> lake table, offsets in its commits
    lake table --changes--> lake.orders.changes --decode --kafka--> history = the table
"""

from __future__ import annotations

import io
import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from changelake.demo.pipeline import ORDERS_FIELDS, PipelineResult, PipelineStep
from changelake.formats.materialize import CdcSchema
from changelake.simulate import ORDER_COLUMNS, debezium_orders

DEBEZIUM_TOPIC = "demo.public.orders"
CDC_TOPIC = "cdc.orders"
CHANGES_TOPIC = "lake.orders.changes"
PARTITIONS = 3


def _produce_debezium(bootstrap: str, events: list[dict]) -> None:
    """The connector's topic: keyed by the row's key, so one key's events share a partition
    and stay in order (Kafka's only ordering), as Debezium's default partitioner does."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for event in events:
        row = event["after"] or event["before"]
        producer.produce(DEBEZIUM_TOPIC, key=orjson.dumps({"id": row["id"]}),
                         value=orjson.dumps(event))
    if producer.flush(60) != 0:
        raise RuntimeError("the demo's Debezium events were not all delivered")


def _rows(frame: Any) -> Counter:
    return Counter(tuple(r[c] for c in ORDER_COLUMNS) for r in frame.collect())


def _accumulated(history: bytes) -> Counter:
    """Each row's multiplicity, summed over a decoded history (`decode`'s JSON lines)."""
    total: Counter = Counter()
    for line in history.splitlines():
        record = orjson.loads(line)
        if "data" in record:
            total[tuple(record["data"][c] for c in ORDER_COLUMNS)] += record["diff"]
    return +total


def run_kafka_demo(workdir: Path, spark: Any, lake_dir: Path, *, seed: int = 0,
                   rows: int = 100, transactions: int = 150, table: str = "demo.kafka_orders"
                   ) -> PipelineResult:
    """Run the steps in the module docstring and check each against the generated truth.
    `spark` is a session on the metastore of the lake at `lake_dir`."""
    from changelake.kafka import MockCluster, changefeed_messages, decode_topic, write_topic
    from changelake.lake.catalog import Lake
    from changelake.lake.changes import cdc_schema_of, change_messages, plan_changes
    from changelake.lake.kafka_changefeed import ingest_changefeed_topics
    from changelake.lake.kafka_ingest import ingest_topics

    rng = random.Random(seed)
    feed = debezium_orders(rng, rows=rows, transactions=transactions)
    truth = Counter(tuple(row[c] for c in ORDER_COLUMNS) for row in feed.final.values())
    schema = CdcSchema.for_fields(ORDERS_FIELDS)
    workdir.mkdir(parents=True, exist_ok=True)
    schema_file = workdir / "orders.avsc"
    schema_file.write_bytes(orjson.dumps(schema.avro))
    steps: list[PipelineStep] = []
    checks: list[tuple[str, bool]] = []
    lake = Lake(spark, lake_dir)
    with MockCluster(brokers=3) as cluster:
        bootstrap = cluster.bootstrap
        for topic in (DEBEZIUM_TOPIC, CDC_TOPIC, CHANGES_TOPIC):
            cluster.create_topic(topic, PARTITIONS)
        _produce_debezium(bootstrap, feed.events)
        steps.append(PipelineStep(f"Debezium events on {DEBEZIUM_TOPIC} ({PARTITIONS} "
                                  "partitions, keyed)", f"{len(feed.events):,}"))

        direct = f"{table}_direct"
        first = ingest_changefeed_topics(lake, direct, bootstrap, DEBEZIUM_TOPIC,
                                         source="debezium", key=["id"])
        last = ingest_changefeed_topics(lake, direct, bootstrap, DEBEZIUM_TOPIC,
                                        source="debezium", key=["id"], close=True)
        steps.append(PipelineStep(f"{DEBEZIUM_TOPIC} --ingest --kafka --from debezium--> lake "
                                  "(twice: then --close)",
                                  f"{first.records:,} + {last.records:,} records read"))
        checks.append(("Kafka: the table ingested from the Debezium topic = the feed's final "
                       "state", _rows(lake.table(direct).current()) == truth))

        produced = 0
        for _ in range(2):  # the sink re-run after a crash: its messages arrive twice
            messages = changefeed_messages(bootstrap, DEBEZIUM_TOPIC, source="debezium",
                                           keys=["id"], close=True)
            produced += write_topic(messages, bootstrap=bootstrap, topic=CDC_TOPIC,
                                    schema=schema).messages
        steps.append(PipelineStep(f"CDCv2 messages on {CDC_TOPIC} (the sink run twice)",
                                  f"{produced:,}"))

        first = ingest_topics(lake, table, bootstrap, CDC_TOPIC, key=["id"],
                              schema=schema_file)
        steps.append(PipelineStep("ingest --kafka (offsets recorded by the commit)",
                                  f"{first.records:,} records read"))
        handle = lake.table(table)
        checks.append(("Kafka: the lake table = the Debezium feed's final state",
                       _rows(handle.current()) == truth))
        version = handle.state().version
        again = ingest_topics(lake, table, bootstrap, CDC_TOPIC, key=["id"],
                              schema=schema_file)
        checks.append(("Kafka: a second ingest reads no record again and commits nothing",
                       again.records == 0 and handle.state().version == version))

        plan = plan_changes(handle, 0)
        sent = write_topic(change_messages(handle, plan), bootstrap=bootstrap,
                           topic=CHANGES_TOPIC, schema=cdc_schema_of(handle)).messages
        out = io.BytesIO()
        decoded = decode_topic(bootstrap, CHANGES_TOPIC, out, schema=cdc_schema_of(handle))
        steps.append(PipelineStep(f"lake changes -> {CHANGES_TOPIC} -> decode",
                                  f"{sent:,} messages, {decoded.updates:,} updates, "
                                  f"frontier {decoded.frontier.to_json()}"))
        checks.append(("Kafka: the table's change feed, decoded from its topic, accumulates "
                       "to the table", _accumulated(out.getvalue()) == _rows(handle.current())))
    return PipelineResult(steps, checks)
