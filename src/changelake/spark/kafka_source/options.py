"""The `kafka-cdc` source's options: what the planner and every reader task need, parsed and
resolved on the driver into plain values."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NAME = "kafka-cdc"
EARLIEST = -2  # Spark's own Kafka source's codes in JSON offsets
LATEST = -1
_TIMEOUT = 30.0

Offsets = dict[str, dict[str, int]]  # topic -> partition (as text: JSON keys) -> offset
# data-loss warnings (failOnDataLoss=false), under the package's name
log = logging.getLogger("changelake.spark.kafka_source")
RECORDS_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
                  "timestamp timestamp, timestampType int")
"""`output=records`: the columns of Spark's own `kafka` source (without headers)."""


def reader_options(bootstrap: str, topics: Sequence[str], *, avro_schema: str | None = None,
                   schema_registry: str | None = None,
                   config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The options of a `kafka-cdc` read (batch or streaming) of `topics`: the cluster, the
    schema (`avro_schema`, its JSON text) and the registry, and librdkafka settings as
    `kafka.*` (text or numbers only: options reach the executors as text)."""
    from changelake.kafka.security import shared_file

    options = {"kafka.bootstrap.servers": bootstrap, "topics": ",".join(topics)}
    security = shared_file()  # the command's --kafka-conf: a file's name, not the settings
    if security is not None:
        options["securityFile"] = str(security)
    if avro_schema is not None:
        options["avroSchema"] = avro_schema
    if schema_registry is not None:
        options["schemaRegistry"] = schema_registry
    for name, value in (config or {}).items():
        if not isinstance(value, str | int | float | bool):
            from changelake.kafka.errors import TopicError

            raise TopicError(f"{NAME}: the librdkafka setting {name!r} must be text or a "
                             f"number to reach the executors, not {type(value).__name__}")
        options[f"kafka.{name}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return options


def _fail(message: str) -> ValueError:
    """A planning error: the driver reports `kafka-cdc: ...` as one line (`spark.errors`)."""
    return ValueError(f"{NAME}: {message}")




@dataclass(frozen=True)
class KafkaOptions:
    """What the planner and every reader task need, resolved on the driver (plain values)."""

    bootstrap: str
    topics: tuple[str, ...]
    starting: str  # "earliest", "latest" or JSON offsets
    ending: str
    avro_schema: str | None  # JSON text: frames of schema id 0, single-object frames
    registry: str | None
    lenient: bool
    config: tuple[tuple[str, str], ...]  # librdkafka settings (without the `kafka.` prefix)
    max_records: int | None
    row_schema: str | None = None  # JSON text of the schema whose rows type the DataFrame
    records: bool = False  # output=records: the records undecoded, as Spark's `kafka` gives
    fail_on_data_loss: bool = True  # records gone before they were read: fail (else warn)
    loss_report: str | None = None  # the driver's file of data-loss warnings (`LossReport`)
    # librdkafka security settings, read on the driver from the `securityFile` option
    # (`kafka.security.shared_file`): they reach the executors inside the tasks, never shown
    security: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaOptions:
        raw = {k.lower(): v for k, v in dict(options).items()}
        bootstrap = raw.get("kafka.bootstrap.servers") or raw.get("bootstrap")
        if not bootstrap:
            raise _fail("give the cluster: the kafka.bootstrap.servers (or bootstrap) option")
        topics = tuple(t.strip() for t in raw.get("topics", raw.get("subscribe", "")).split(",")
                       if t.strip())
        if not topics:
            raise _fail("give the topics option (a comma list)")
        from changelake.spark.source import schema_option

        avro = schema_option(raw)
        registry = raw.get("schemaregistry") or None
        output = raw.get("output", "messages").lower()
        if output not in ("messages", "records"):
            raise _fail(f"output must be messages or records, not {raw['output']!r}")
        if avro is None and registry is None and output == "messages":
            raise _fail("reading a Kafka topic needs the schema: the schema (a file), avroSchema "
                        "or schemaRegistry option")
        config = tuple(sorted(
            (k[len("kafka."):], v) for k, v in raw.items()
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers"))
        if "kafka.auto.offset.reset" in raw:
            raise _fail("kafka.auto.offset.reset is not an option: startingOffsets says where a "
                        "read starts, failOnDataLoss what happens when its records are gone")
        fail_on_data_loss = raw.get("failondataloss", "true").strip().lower()
        if fail_on_data_loss not in ("true", "false"):
            raise _fail(f"failOnDataLoss must be true or false, not {raw['failondataloss']!r}")
        limit = raw.get("maxrecordspertrigger")
        if limit is not None and (not limit.isdigit() or int(limit) < 1):
            raise _fail(f"maxRecordsPerTrigger must be a positive integer, not {limit!r}")
        starting = raw.get("startingoffsets", "earliest")
        ending = raw.get("endingoffsets", "latest")
        for name, value in (("startingOffsets", starting), ("endingOffsets", ending)):
            _parse_offsets(name, value)
        security: tuple[tuple[str, str], ...] = ()
        if raw.get("securityfile"):
            from changelake.kafka.security import load_file

            security = tuple(sorted(load_file(raw["securityfile"]).settings.items()))
        return cls(bootstrap, topics, starting, ending, avro, registry,
                   raw.get("lenient", "false").lower() in ("true", "1", "yes"), config,
                   int(limit) if limit else None, records=output == "records",
                   fail_on_data_loss=fail_on_data_loss == "true",
                   loss_report=raw.get("lossreport") or None, security=security)

    def given_schema(self) -> Any:
        from changelake.formats.materialize import CdcSchema

        if self.avro_schema is None:
            return None
        import orjson

        return CdcSchema.from_json(orjson.loads(self.avro_schema))

    def resolved(self) -> KafkaOptions:
        """With `row_schema` set: the given schema, or the registry's latest of the first topic
        subject it has (see the module docstring)."""
        import dataclasses

        import orjson

        from changelake.errors import ChangelakeError
        from changelake.kafka.registry import SchemaRegistry, value_subject

        if self.row_schema is not None or self.records:
            return self
        if self.avro_schema is not None:
            return dataclasses.replace(self, row_schema=self.avro_schema)
        assert self.registry is not None
        try:
            registry = SchemaRegistry(self.registry)
            for topic in self.topics:
                found = registry.latest(value_subject(topic))
                if found is not None:
                    return dataclasses.replace(self, row_schema=orjson.dumps(found.avro).decode())
        except ChangelakeError as error:
            raise _fail(str(error)) from None
        subjects = ", ".join(value_subject(t) for t in self.topics)
        from changelake.redact import redact

        raise _fail(f"the registry at {redact(self.registry)} has no subject {subjects} to "
                    "type the rows with: give the schema or avroSchema option")

    def rows(self) -> Any:
        """The `CdcSchema` whose rows type the DataFrame (after `resolved`)."""
        import orjson

        from changelake.formats.materialize import CdcSchema

        assert self.row_schema is not None
        return CdcSchema.from_json(orjson.loads(self.row_schema))

    def consumer_config(self) -> dict[str, str]:
        """The librdkafka settings of every client of this read: the security settings, then
        the `kafka.*` options."""
        return {**dict(self.security), **dict(self.config)}


def _parse_offsets(name: str, value: str) -> str | Offsets:
    """`earliest`, `latest`, or the JSON offsets (validated)."""
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    ok = isinstance(parsed, dict) and all(
        isinstance(by, dict) and all(
            str(p).isdigit() and type(o) is int and o >= -2 for p, o in by.items())
        for by in parsed.values())
    if not ok:
        raise _fail(f'{name} must be earliest, latest or JSON {{"topic": {{"0": offset}}}}, '
                    f"not {value!r}")
    return {t: {str(p): o for p, o in by.items()} for t, by in parsed.items()}


def _offset_in(spec: str | Offsets, topic: str, partition: int, default: int) -> int:
    """The offset `spec` asks of a partition: EARLIEST, LATEST or an offset."""
    if isinstance(spec, str):
        return EARLIEST if spec == "earliest" else LATEST
    return spec.get(topic, {}).get(str(partition), default)
