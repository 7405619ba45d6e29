"""The same Kafka topic read by Spark's own connector (`kafka`, spark-sql-kafka-0-10) and by
this project's `kafka-cdc` data source, in one session, on a real Apache Kafka broker.

A topic of `--partitions` partitions holds the Materialize CDC messages (Confluent-framed
Avro, schema id 0) of a history of `--updates` updates (`simulate.random_history` over
ten times as many keys: nearly all distinct, so few consolidate away; at most `--batch`
updates a message). Each way is read whole `--rounds` times, alternating, after one
unmeasured read of each (`bench_key_rule.alternate`), to `write.format("noop")`:

* records: the records undecoded (`kafka-cdc`'s `output=records` against the connector, the
  same columns): what each reader costs by itself;
* messages: the records decoded into the message rows the ingest takes (`kafka-cdc`'s
  messages, decoded in its reader's Python task, against the connector's records decoded by
  `kafka_records.messages_from_records`, a Python UDF over the records);
* from_avro: the connector's records decoded in the JVM by spark-avro's `from_avro` over
  `substring(value, 6)` (`kafka_records.messages_from_avro`), against kafka-cdc's messages.

Printed: each way's median seconds and the ratio connector / kafka-cdc (below 1: the
connector takes less time).

    python benchmarks/bench_kafka_readers.py --updates 1000000 --partitions 4 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_key_rule import alternate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()

    import random

    import orjson

    from changelake.formats.materialize import CdcSchema
    from changelake.kafka import write_topic
    from changelake.kafka.broker import KafkaBroker
    from changelake.lake.kafka_ingest import connector_records
    from changelake.simulate import random_history, write
    from changelake.spark import kafka_source
    from changelake.spark.kafka_records import messages_from_avro, messages_from_records
    from changelake.spark.session import build_session

    schema = CdcSchema.for_fields([{"name": "id", "type": "long"},
                                   {"name": "v", "type": "long"}])
    with KafkaBroker(heap="1g") as broker:
        topic = "bench"
        broker.create_topic(topic, args.partitions)
        started = time.perf_counter()
        history = random_history(random.Random(7), updates=args.updates,
                                 times=max(10, args.updates // 1000), keys=args.updates * 10)
        report = write_topic(write(history, batch_size=args.batch), bootstrap=broker.bootstrap,
                             topic=topic, schema=schema)
        print(f"topic: {report.messages:,} records ({args.updates:,} updates) on "
              f"{args.partitions} partitions ({time.perf_counter() - started:.1f} s to "
              "produce)", flush=True)
        spark = build_session(args.master)
        spark.sparkContext.setLogLevel("ERROR")
        kafka_source.register(spark)
        options = kafka_source.reader_options(broker.bootstrap, [topic])

        def timed(frame: object) -> float:
            start = time.perf_counter()
            frame.write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]
            return time.perf_counter() - start

        def cdc(output: str) -> object:
            more = {"output": "records"} if output == "records" else {
                "avroSchema": orjson.dumps(schema.avro).decode()}
            return spark.read.format(kafka_source.NAME).options(**options, **more).load()

        counts = {"connector": connector_records(spark, options).count(),
                  "kafka-cdc": cdc("records").count()}  # type: ignore[attr-defined]
        assert counts["connector"] == counts["kafka-cdc"] == report.messages, counts
        results = {}
        for what in ("records", "messages", "from_avro"):
            print(f"\n{what}:", flush=True)
            if what == "records":
                ways = {"connector": lambda: timed(connector_records(spark, options)),
                        "kafka-cdc": lambda: timed(cdc("records"))}
            elif what == "from_avro":
                ways = {"connector": lambda: timed(messages_from_avro(
                            connector_records(spark, options), schema)),
                        "kafka-cdc": lambda: timed(cdc("messages"))}
            else:
                ways = {"connector": lambda: timed(messages_from_records(
                            connector_records(spark, options), schema=schema, topic=topic)),
                        "kafka-cdc": lambda: timed(cdc("messages"))}
            results[what] = alternate(ways, args.rounds)
        spark.stop()
    print(f"\n{report.messages:,} records, median of {args.rounds} (connector / kafka-cdc):")
    for what, medians in results.items():
        print(f"  {what:<9} connector {medians['connector']:6.2f} s   kafka-cdc "
              f"{medians['kafka-cdc']:6.2f} s   ratio "
              f"{medians['connector'] / medians['kafka-cdc']:5.2f}x the time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
