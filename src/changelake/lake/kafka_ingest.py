"""`changelake ingest --kafka`: topics of Materialize CDC messages into a lake table, exactly
once, resuming from the offsets the table's last commit recorded.

Why one module of over 500 lines: the plan, read and commit of one ingest share the offsets
argument below.

The offsets live in the lake, not in a consumer group: each commit's manifest records, per topic
and partition, where the next read starts (`layout.PartitionOffsets.resume`), written by the
same commit point as the data read from those offsets. So a crash anywhere before the commit
point leaves the previous offsets, and the next run re-reads exactly the uncommitted range; a
crash after it leaves both; nothing is lost or doubled. (`--group G` also commits the same
positions to a consumer group, after the lake commit, for tools that watch groups; it is never
read back.)

Where a read resumes. A run reads every partition from its recorded `resume` (the beginning of
the partition if none) to its end when the read starts (see `kafka.source`), decodes on Spark
from the table's committed frontier F, and commits the updates up to the input's frontier F'.
A record is *absorbed* once the table no longer needs it: an update message whose times are all
before F' (it is in the table, or was before F), a progress statement whose upper is at or
before F' (it covers nothing the table lacks); once the stream closed, every record. Records
that are not absorbed (updates at times not yet final, the statements that will justify them)
must be seen again: each partition resumes at its first record that is not absorbed, or at the
end of the read if all were. Re-reading records before a resume point that were absorbed is
harmless (the decoder drops updates before F and takes statements any number of times); never
re-reading an absorbed record is what makes "a restart continues at the committed offsets" true
for a stream whose frontier keeps up with the topic: then every partition resumes at its end.

Lenient mode (`lenient=True`, `--lenient`) sets bad records aside where strict mode stops at the
first (see below): the data source yields an `_error` row for each (location and reason, no
message), the decode never sees it, and it counts as absorbed for the resume points, so a run
that moves a partition's resume point past it never reads it again. A record is set aside once:
by the run that first reads it, which is the run that first commits offsets past it (its
partition's recorded `end`); a later run that reads it again, because the partition resumes
before it (updates not final yet), skips it without reporting it again. (A strict run after a
lenient one stops at such a record.) The report has their number and the first
`SET_ASIDE_SAMPLE` of them (in topic, partition, offset order; `spark.kafka_set_aside`). With a
dead-letter topic (`--dead-letter-topic T`, on the same cluster, existing, not one of the topics
read), every record set aside is read again by offset on the driver (they are few; see
`kafka.dead_letter`) and produced there, its value, key and headers as they were plus headers
`changelake.topic`, `changelake.partition`, `changelake.offset` and `changelake.error`, and
acknowledged BEFORE the lake commit. So the lake table stays exactly once, and the dead-letter
topic is at least once: a run killed between the two produces them again when it is run again,
with the same (topic, partition, offset) headers, which identify the duplicates. Protocol
violations between decodable messages (a conflicting diff, more updates than counted) are not
records to set aside: they stop a lenient run too.

The driver only plans: metadata and watermark calls give each partition's range (`_plan`).
The records are read on the executors by the `kafka-cdc` data source
(`spark.kafka_source`), one task per partition's range, as a DataFrame of messages in the
`materialize-cdc` source's shape with `_file` naming topic and partition and `_offset` the
record's offset, so a protocol error names its record. That DataFrame is cached for the run:
its count is the records read, the decode takes it, and the resume points are one aggregate
over it (per partition the least offset of a record still needed), so no record passes through
the driver. A bad record (not a frame, unknown schema id, corrupt Avro, a tombstone, a frame
of another row schema than the rows') stops the run at topic, partition and offset before
anything is committed. The rows' schema is `--schema`'s, or else the registry's latest for the
first topic's subject `<topic>-value`; every frame must carry that row schema.

Debezium and YDB topics are `kafka_changefeed`'s, on the same offsets, plans and reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from changelake.errors import LakeError, SchemaError
from changelake.lake.catalog import Lake
from changelake.lake.identifier import TableIdentifier, check_name
from changelake.lake.ingest import (
    DecodedInput,
    IngestReport,
    commit_input,
    decode_materialize,
    frontier_after,
)
from changelake.lake.layout import PartitionOffsets, SourceOffsets, TableState, TopicOffsets
from changelake.lake.table import DEFAULT_BUCKETS, CommitResult, ProgressFn
from changelake.protocol import Antichain
from changelake.spark.kafka_set_aside import SAMPLE as SET_ASIDE_SAMPLE
from changelake.spark.kafka_set_aside import collect as collect_set_aside
from changelake.spark.kafka_set_aside import dead_letter_topic as make_dead_letter_topic
from changelake.spark.kafka_set_aside import send as send_dead_letters

if TYPE_CHECKING:
    from changelake.formats.materialize import SetAside

KIND = "kafka"
FORMAT = "materialize"


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """One partition in one run: the offsets `[start, end)` read, where the next run starts
    (`resume`, as committed), and how far its statements reached (`PartitionOffsets`)."""

    topic: str
    partition: int
    start: int
    end: int
    resume: int
    reached: int | None = None


@dataclass(frozen=True, slots=True)
class KafkaIngestReport:
    """What `ingest --kafka` did: the ingest's report, each partition's read, the records
    read (`records`), and the offsets the commit recorded (None: nothing was committed).
    Lenient: how many records were set aside (`set_aside_count`), the first
    `SET_ASIDE_SAMPLE` of them (`set_aside`), and how many went to the dead-letter topic.
    `steps`: where the run's time went, when timed."""

    ingest: IngestReport
    partitions: list[PartitionRead] = field(default_factory=list)
    records: int = 0
    offsets: SourceOffsets | None = None
    set_aside: list[SetAside] = field(default_factory=list)
    set_aside_count: int = 0
    dead_lettered: int = 0
    steps: dict[str, float] = field(default_factory=dict)
    """Seconds each step of the run took, by name (`ingest --follow`'s rounds of a
    changefeed fill it: `follow_changefeed.ROUND_STEPS`); empty where not timed."""


def _needed(frontier: int) -> str:
    """The SQL condition on a message row under which the table, committed through `frontier`,
    needs the message again (see the module docstring): an update at or after the frontier, or
    a statement whose upper is not at or before it; never a record set aside (`_error`). (Once
    closed, no record is needed.)"""
    return ("CASE WHEN _error IS NOT NULL THEN false "
            f"WHEN updates IS NOT NULL THEN exists(updates, u -> u.time >= {frontier}) "
            f"ELSE size(progress.upper) = 0 OR get(progress.upper, 0) > {frontier} END")


def _plan(reader: Any, recorded: TopicOffsets | None, table: str) -> list[Any]:
    """The ranges of this run: from each partition's recorded resume point (or its beginning)
    to its end now. A resume point the topic no longer holds is an error: the topic was
    recreated or truncated (beyond its end), or records the table still needed were deleted
    (before its beginning)."""
    from changelake.kafka import PartitionRange

    ranges = []
    for planned in reader.plan():
        mark = recorded.partition(planned.partition) if recorded is not None else None
        if mark is None:
            ranges.append(planned)
            continue
        where = f"table {table}: topic {reader.topic} partition {planned.partition}"
        if mark.resume > planned.end:
            raise LakeError(f"{where} ends at offset {planned.end}, before offset "
                            f"{mark.resume} where the table's last commit left it: the topic "
                            "was recreated or truncated; nothing was read")
        if mark.resume < planned.start:
            raise LakeError(f"{where} begins at offset {planned.start}, after offset "
                            f"{mark.resume} where the table's last commit left it: records "
                            "the table still needs were deleted (retention); nothing was read")
        ranges.append(PartitionRange(planned.partition, mark.resume, planned.end))
    return ranges


READERS = ("kafka-cdc", "kafka")
"""Who reads the records: this project's `kafka-cdc` source, or Spark's own `kafka` connector
where the session has it (its records decoded by `spark.kafka_records`)."""


def _messages_frame(spark: Any, bootstrap: str, plans: Sequence[tuple[str, Sequence[Any]]],
                    given: Any, schema_registry: str | None,
                    config: Mapping[str, Any] | None, reader_name: str = "kafka-cdc",
                    lenient: bool = False) -> Any:
    """The planned ranges' messages, read on the executors by `kafka-cdc`, or by Spark's
    `kafka` connector and decoded by `kafka_records.messages_from_records` into the very same
    rows (see the module docstring)."""
    import orjson

    from changelake.spark import kafka_source

    starting = {topic: {str(r.partition): r.start for r in ranges} for topic, ranges in plans}
    ending = {topic: {str(r.partition): r.end for r in ranges} for topic, ranges in plans}
    options = kafka_source.reader_options(
        bootstrap, [topic for topic, _ in plans],
        avro_schema=orjson.dumps(given.avro).decode() if given is not None else None,
        schema_registry=schema_registry, config=config)
    options.update(startingOffsets=orjson.dumps(starting).decode(),
                   endingOffsets=orjson.dumps(ending).decode())
    if lenient:  # kafka-cdc's option (reader kafka: refused with lenient, see _check_lenient)
        options["lenient"] = "true"
    if reader_name == "kafka":  # Spark's connector: no schema options, `subscribe` for topics
        return _connector_messages(spark, options, given, schema_registry, plans)
    kafka_source.register(spark)
    return spark.read.format(kafka_source.NAME).options(**options).load()


def _connector_messages(spark: Any, options: Mapping[str, str], given: Any,
                        schema_registry: str | None,
                        plans: Sequence[tuple[str, Sequence[Any]]]) -> Any:
    """Spark's own `kafka` source's records of the same ranges, as `kafka-cdc`'s rows: with a
    schema and no registry (every frame of schema id 0) decoded in the JVM by spark-avro's
    `from_avro` (`messages_from_avro`: about half kafka-cdc's time, benchmarks/README.md),
    else by kafka-cdc's decoder in a Python UDF (`messages_from_records`: ids by the registry,
    single-object frames; and where from_avro would type a column otherwise)."""
    from changelake.spark.kafka_records import messages_from_avro, messages_from_records

    if given is not None and schema_registry is None:
        try:
            return messages_from_avro(connector_records(spark, options), given)
        except SchemaError:  # from_avro types some column otherwise (a logical type)
            pass
    return messages_from_records(connector_records(spark, options), schema=given,
                                 schema_registry=schema_registry,
                                 topic=plans[0][0] if plans else None)


def connector_records(spark: Any, options: Mapping[str, str]) -> Any:
    """The records Spark's own `kafka` source reads with the `kafka-cdc` reader's `options`
    (its `kafka.*` settings and offsets; `topics` becomes `subscribe`): the columns of
    `kafka-cdc`'s `output=records`. The security settings of `securityFile` (the command's
    `--kafka-conf`) become the Java clients' `kafka.*` options (`security.java_config`), which
    Spark masks wherever it shows options (`session.KAFKA_REDACTION`). A session without the
    connector is named."""
    from pyspark.errors import AnalysisException

    from changelake.kafka.security import java_config, load_file

    connector = {k: v for k, v in options.items()
                 if k.startswith("kafka.") or k.endswith("Offsets") or k == "failOnDataLoss"}
    if "securityFile" in options:
        secured = java_config(load_file(options["securityFile"]).settings)
        connector.update({f"kafka.{k}": v for k, v in secured.items()})
    # librdkafka's default, so kafka-cdc's: aborted transactions are never read (the Java
    # clients' default is read_uncommitted)
    connector.setdefault("kafka.isolation.level", "read_committed")
    try:
        return spark.read.format("kafka").options(
            **connector, subscribe=options["topics"]).load()
    except AnalysisException as error:
        if "kafka" in str(error).lower() and "find" in str(error).lower():
            raise LakeError("ingest --kafka with reader kafka needs Spark's Kafka connector "
                            "(spark-sql-kafka) in the session: run scripts/install.sh (or "
                            "`python -m changelake.spark.maven`); the reader kafka-cdc needs "
                            "nothing") from None
        raise


def _partition_facts(messages: Any, frontier: int | None,
                     places: Mapping[str, tuple[str, int]]
                     ) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """Per (topic, partition), in one aggregate on the executors: the least offset of a record
    the table still needs (None: all were absorbed), and the greatest upper of the progress
    statements read there (None: none; closing statements do not count), which says how far
    the partition has carried the stream (`PartitionOffsets.reached`)."""
    from pyspark.sql import functions as F

    needed = F.expr(_needed(frontier)) if frontier is not None else F.lit(False)
    upper = F.when(F.size("progress.upper") > 0, F.get(F.col("progress.upper"), 0))
    rows = (messages.groupBy("_file")
            .agg(F.min(F.when(needed, F.col("_offset"))).alias("first"),
                 F.max(upper).alias("reached")).collect())
    return {places[row["_file"]]: (row["first"], row["reached"]) for row in rows}


@dataclass
class TopicsRun:
    """One topics ingest under the table's writer lock, up to its read: what the table
    committed (`committed`, None: closed) and recorded, and this run's planned ranges (the
    driver's metadata and watermark calls, no records). Shared by the ingest of Materialize CDC
    topics and of changefeed topics (`kafka_changefeed`)."""

    table: str
    state: TableState | None
    committed: int | None
    recorded: SourceOffsets | None
    group: str | None
    readers: list[Any] = field(default_factory=list)
    plans: list[tuple[str, list[Any]]] = field(default_factory=list)

    @classmethod
    def begin(cls, writer: Any, cleanup: ExitStack, table: str, bootstrap: str,
              names: Sequence[str], *, format: str, what: str, group: str | None,
              **reader_options: Any) -> TopicsRun:
        """Check the offsets the table recorded are of this kind of source (`format`, named
        `what` in the error), and plan the topics unless the table is closed; the topic
        readers close with `cleanup`."""
        from changelake.kafka import TopicReader

        state = writer.state
        recorded = state.offsets if state is not None else None
        if recorded is not None and (recorded.kind, recorded.format) != (KIND, format):
            raise LakeError(f"table {table} records offsets of a {recorded.kind} "
                            f"{recorded.format} source, not of Kafka {what} topics")
        run = cls(table, state, state.upper if state is not None else 0, recorded, group)
        if run.committed is None:
            return run
        for name in names:
            reader = cleanup.enter_context(TopicReader(bootstrap, name, group=group,
                                                       **reader_options))
            run.readers.append(reader)
            run.plans.append((name, _plan(reader, recorded.topic(name) if recorded else None,
                                          table)))
        return run

    def unchanged(self, why: str | None = None, records: int = 0,
                  set_aside: Sequence[Any] = (), set_aside_count: int = 0,
                  dead_lettered: int = 0) -> KafkaIngestReport:
        """The report of a run that commits nothing (a closed table: `why` None)."""
        version = self.state.version if self.state is not None else -1
        result = CommitResult(self.table, version, self.committed, self.committed, 0, True)
        if self.committed is None:
            return KafkaIngestReport(IngestReport(self.table, False, result, []))
        return KafkaIngestReport(
            IngestReport(self.table, False, result, [self.committed], why),
            _partition_reads(self.plans, self.recorded, {}), records, self.recorded,
            [b.set_aside() for b in set_aside[:SET_ASIDE_SAMPLE]], set_aside_count,
            dead_lettered)

    def commit(self, writer: Any, decoded: DecodedInput, reads: list[PartitionRead],
               offsets: SourceOffsets | None, records: int, *, key: Sequence[str], buckets: int,
               scd2: bool, set_aside: Sequence[Any] = (), set_aside_count: int = 0,
               dead_lettered: int = 0) -> KafkaIngestReport:
        """Commit what the run decoded with the offsets it covered (one commit point), then
        the consumer group; the run's report."""
        result = commit_input(writer, decoded, key=key, buckets=buckets, scd2=scd2,
                              offsets=offsets)
        self.commit_group(reads)
        ingest = IngestReport(self.table, self.state is None, result, decoded.upper.to_json(),
                              decoded.waiting)
        return KafkaIngestReport(ingest, reads, records, offsets,
                                 [b.set_aside() for b in set_aside[:SET_ASIDE_SAMPLE]],
                                 set_aside_count, dead_lettered)

    def commit_group(self, partitions: Sequence[PartitionRead]) -> None:
        """After the lake commit (the lake's offsets are the truth), the same resume points
        to the consumer group, if one was given."""
        if self.group is None:
            return
        for reader in self.readers:
            reader.commit({p.partition: p.resume for p in partitions
                           if p.topic == reader.topic})


def ingest_topics(
    lake: Lake,
    table: str | TableIdentifier,
    bootstrap: str,
    topics: str | Sequence[str],
    *,
    key: Sequence[str] = (),
    source: str = "materialize",
    schema: Path | None = None,
    schema_registry: str | None = None,
    group: str | None = None,
    buckets: int = DEFAULT_BUCKETS,
    scd2: bool = False,
    progress: ProgressFn | None = None,
    config: Mapping[str, Any] | None = None,
    reader: str = "kafka-cdc",
    lenient: bool = False,
    dead_letter_topic: str | None = None,
) -> KafkaIngestReport:
    """Read `topics` of Materialize CDC messages at `bootstrap` from the offsets `table`'s last
    commit recorded, and commit what is new with the offsets it covered: exactly once (see the
    module docstring). `schema` decodes frames with schema id 0, the registry at
    `schema_registry` the others. `group` also commits the positions to that consumer group
    (after the lake commit; never read). `config` adds librdkafka settings. `reader`
    (`READERS`): `kafka` reads with Spark's own connector where the session has it; the rest
    of the ingest cannot tell the difference. `lenient` sets bad records aside instead of
    stopping, and `dead_letter_topic` (with `lenient`) produces them to that topic before the
    commit (see the module docstring)."""
    from pyspark.sql import functions as F

    from changelake.formats.materialize import load_schema
    from changelake.kafka.changefeed import topic_list
    from changelake.kafka.source import location
    from changelake.spark.decoder import split_messages
    from changelake.spark.errors import translate_errors

    records_by = reader  # who reads the records (`READERS`)
    if records_by not in READERS:
        raise LakeError(f"ingest --kafka: unknown reader {records_by!r} "
                        f"(one of {', '.join(READERS)})")
    if source != FORMAT:
        raise LakeError(
            f"ingest_topics reads topics of Materialize CDC messages (--from materialize), "
            f"not {source}: `lake.kafka_changefeed.ingest_changefeed_topics` reads those")
    names = topic_list(topics)
    _check_lenient(lenient, dead_letter_topic, names, records_by)
    given = load_schema(schema) if schema is not None else None
    if given is None and schema_registry is None:
        raise SchemaError("reading a Kafka topic needs the schema: --schema FILE or "
                          "--schema-registry URL")
    handle = lake.handle(table)
    for column in key:
        check_name(column, f"table {handle.name}: key column")
    step = progress or (lambda _d, _i, _n: None)
    step("waiting for the table's writer lock", 0, 3)
    with handle.writer() as writer, ExitStack() as cleanup:
        key = writer.ingest_key(key)
        run = TopicsRun.begin(writer, cleanup, handle.name, bootstrap, names, format=FORMAT,
                              what="Materialize CDC", group=group, schema=given,
                              schema_registry=schema_registry, config=config)
        committed, recorded, plans = run.committed, run.recorded, run.plans
        if committed is None:  # closed: no record can add anything
            return run.unchanged()
        step("reading topics", 1, 3)
        dead_letters = make_dead_letter_topic(bootstrap, dead_letter_topic, config)
        planned = sum(r.end - r.start for _, ranges in plans for r in ranges)
        if given is None and planned == 0:  # no record, no schema to create the table with
            return run.unchanged("the topics hold no messages beyond the committed offsets")
        places = {location(topic, r.partition, 0).file: (topic, r.partition)
                  for topic, ranges in plans for r in ranges}
        # only the planned partitions: one created since the plan waits for the next run
        messages = translate_errors(_messages_frame, lake.spark, bootstrap, plans, given,
                                    schema_registry, config, records_by, lenient).where(
            F.col("_file").isin(list(places))).cache()
        cleanup.callback(messages.unpersist)
        records = translate_errors(messages.count)  # the read: a bad record stops it here
        aside_count, aside = (collect_set_aside(messages, new=_new_records(plans, recorded),
                                                everything=dead_letters is not None)
                              if lenient else (0, []))
        updates, statements = split_messages(messages)
        decoded: DecodedInput = decode_materialize(updates, statements, Antichain([committed]),
                                                   cleanup)
        frontier = frontier_after(committed, decoded.upper)
        facts = translate_errors(_partition_facts, messages, frontier, places)
        partitions = _partition_reads(plans, recorded, facts)
        offsets = _offsets(bootstrap, recorded, partitions)
        dead_lettered = send_dead_letters(bootstrap, dead_letters, aside, config)
        step("committing", 2, 3)
        report = run.commit(writer, decoded, partitions, offsets, records, key=key,
                            buckets=buckets, scd2=scd2, set_aside=aside,
                            set_aside_count=aside_count, dead_lettered=dead_lettered)
    step("done", 3, 3)
    return report


def _partition_reads(plans: Sequence[tuple[str, Sequence[Any]]],
                     recorded: SourceOffsets | None,
                     facts: Mapping[tuple[str, int], tuple[int | None, int | None]]
                     ) -> list[PartitionRead]:
    """This run's partitions: where each resumes (its first needed record, or the end of the
    read), and how far it reached, at least as far as recorded before."""
    out = []
    for topic, ranges in plans:
        old = recorded.topic(topic) if recorded is not None else None
        for r in ranges:
            first, reached = facts.get((topic, r.partition), (None, None))
            before = old.partition(r.partition) if old is not None else None
            if before is not None and before.reached is not None:
                reached = before.reached if reached is None else max(reached, before.reached)
            out.append(PartitionRead(topic, r.partition, r.start, r.end,
                                     r.end if first is None else first, reached))
    return out


def _offsets(bootstrap: str, recorded: SourceOffsets | None,
             partitions: Sequence[PartitionRead]) -> SourceOffsets:
    """The offsets to record: this run's partitions, and what was recorded of topics (and
    partitions) this run did not read, as it was."""
    topics: dict[str, dict[int, PartitionOffsets]] = {}
    for old in recorded.topics if recorded is not None else ():
        topics[old.topic] = {p.partition: p for p in old.partitions}
    for p in partitions:
        topics.setdefault(p.topic, {})[p.partition] = PartitionOffsets(p.partition, p.resume,
                                                                       p.end, p.reached)
    return SourceOffsets(KIND, FORMAT, bootstrap, tuple(
        TopicOffsets(name, tuple(by[n] for n in sorted(by))) for name, by in topics.items()))


# ----------------------------------------------------------------------- records set aside


def _check_lenient(lenient: bool, dead_letter_topic: str | None, names: Sequence[str],
                   reader: str) -> None:
    if lenient and reader != "kafka-cdc":
        raise LakeError(f"ingest --kafka --lenient reads with kafka-cdc only, not reader "
                        f"{reader} (not yet)")
    if dead_letter_topic is None:
        return
    if not lenient:
        raise LakeError("ingest --kafka: a dead-letter topic takes the records lenient mode "
                        "sets aside; strict mode stops at the first bad record: give "
                        "--lenient too")
    if dead_letter_topic in names:
        raise LakeError(f"ingest --kafka: the dead-letter topic {dead_letter_topic!r} is one "
                        "of the topics read: its records would be read and set aside again")


def _new_records(plans: Sequence[tuple[str, Sequence[Any]]],
                 recorded: SourceOffsets | None) -> Any:
    """The condition on a message row that no committed run read its record: at or after its
    partition's recorded `end` (records before it were judged, and set aside, already)."""
    from pyspark.sql import functions as F

    from changelake.kafka.source import location

    new = F.lit(True)
    for topic, ranges in plans:
        old = recorded.topic(topic) if recorded is not None else None
        for r in ranges:
            mark = old.partition(r.partition) if old is not None else None
            if mark is not None and mark.end > r.start:
                new = F.when(F.col("_file") == location(topic, r.partition, 0).file,
                             F.col("_offset") >= mark.end).otherwise(new)
    return new


# ---------------------------------------------------------------------------------- status


__all__ = ["KafkaIngestReport", "PartitionRead", "ingest_topics"]
