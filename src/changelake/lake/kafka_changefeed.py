"""`changelake ingest --kafka --from debezium|ydb`: changefeed topics into a lake table, exactly
once, resuming from the offsets the table's last commit recorded.

The promise is `kafka_ingest`'s: each commit records, per topic and partition, where the next
read starts, by the same commit point as the data; a run reads from there to each partition's end
when it starts, and commits what is new up to the input's frontier. A crash anywhere before the
commit point leaves the previous offsets, so the next run reads the same records again; nothing
is lost or doubled.

Why this needs no saved converter state. Converting a changefeed from the middle needs two things
of what came before: each key's current row (an update without a before-image, a delete, must
retract it) and the times. The lake table *is* the first: the conversion takes a key's previous
row from the table's current rows, as the file ingest does (`ingest.ingest`). And changefeed
times are the source's own positions (a PostgreSQL LSN, a MySQL binlog place, a YDB step), the
same whatever read a record comes in, so the table's committed frontier F says which records are
in it: those of times below F. Records re-read below F are skipped by the conversion (`since`),
and a transaction below F holds no frontier back: a connector restart may re-send one whose END
(or some of whose events) is before the resume offsets (`spark.changefeed.progress`).

Where each partition resumes. After a run commits up to F', a partition resumes at the least
offset among the records the table still needs:

* a change at a time at or after F' (not committed yet);
* (YDB) the partition's last barrier: its frontier is the least of the partitions' last
  barriers, so a read that skipped it would hold the frontier at 0 until the next one;
* (Debezium's transaction topic) a BEGIN or END after the last one of a transaction committed in
  this run, unless it is one of those: a transaction the table does not have yet, or one whose
  events have not arrived; what comes before that last one is of transactions committed, or of
  other tables.

Re-reading from there gives every needed record the time it had: a change's own position does
not depend on the read, and a snapshot row (no position) takes the highest time before it in
its own partition (`times.py` with `per_file`), which, from the first record at or after F' on,
is the same in a read that starts there (everything before that record is below F', everything
from it on at or above). A transaction whose time comes from its first event (MySQL GTIDs
without `sequence`) and that a resume point cuts would be timed by its later events only: a
connector emits a transaction's events together, so only a replay that straddles the resume
point can do that; it is the one case where the re-read is not exact.

Partitions and the frontier. Debezium writes one partition in log order, but partitions
independently: without transaction metadata, a run's frontier is at most the least of the
highest times of the partitions it read records from (`debezium_path._partition_cap`), so an event
still on its way to one partition is not put below the frontier by another partition's later
events. With the transaction topic, the ENDs count each transaction's events wherever they are.
YDB partitions carry their own barriers (`convert.progress`). Each partition's highest time
(Debezium) or last barrier (YDB) is recorded as its `reached`, and `status` names the partition
that holds the frontier back, as for Materialize CDC topics.

The records are read on the executors (`kafka-cdc` with `output=records`, one task per
partition's range) into lines (`changefeed.read.record_lines`: tombstones are no lines) and
converted by the Spark path of `spark.changefeed.pipeline`. A batch that path does not cover is
refused with its reason (a Debezium schema that changes inside the read, more than 1000
truncates, ...: see `debezium_path.py`), after the Python path has named its first bad record,
if it has one, by topic, partition and offset; nothing is committed then. The table's current
rows go to the conversion whether it is keyed or not: a truncate retracts them.

Lenient mode sets bad records aside first (`pipeline.bad_lines`: not UTF-8, too long, or refused
by the format's Python parser, among the lines Java leaves) and converts the rest; a record set
aside is never needed again, so the resume points pass it. As in `kafka_ingest`, each is
reported (and, with a dead-letter topic, produced there before the commit: at least once) by the
run that first reads it, and only by that one. What the conversion still refuses stops a lenient
run too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from changelake.errors import ChangefeedError, ChangelakeError, LakeError, Location
from changelake.formats.tableschema import read_table_json
from changelake.lake.catalog import Lake
from changelake.lake.identifier import TableIdentifier, check_name
from changelake.lake.ingest import (
    DecodedInput,
    changefeed_input,
    check_columns,
    frontier_after,
)
from changelake.lake.kafka_ingest import (
    READERS,
    KafkaIngestReport,
    TopicsRun,
    _check_lenient,
    _new_records,
    _offsets,
    _partition_reads,
    connector_records,
)
from changelake.lake.table import DEFAULT_BUCKETS, ProgressFn
from changelake.protocol import Antichain
from changelake.spark.kafka_set_aside import collect as collect_set_aside
from changelake.spark.kafka_set_aside import dead_letter_topic as make_dead_letter_topic
from changelake.spark.kafka_set_aside import send as send_dead_letters

SOURCES = ("debezium", "ydb")


def ingest_changefeed_topics(
    lake: Lake,
    table: str | TableIdentifier,
    bootstrap: str,
    topics: str | Sequence[str],
    *,
    source: str,
    key: Sequence[str] = (),
    table_schema: Path | None = None,
    close: bool = False,
    group: str | None = None,
    buckets: int = DEFAULT_BUCKETS,
    scd2: bool = False,
    progress: ProgressFn | None = None,
    config: Mapping[str, Any] | None = None,
    reader: str = "kafka-cdc",
    lenient: bool = False,
    dead_letter_topic: str | None = None,
) -> KafkaIngestReport:
    """Read the changefeed `topics` (`source`: debezium or ydb) at `bootstrap` from the offsets
    `table`'s last commit recorded, convert them on Spark and commit what is new with the
    offsets it covered: exactly once (see the module docstring). `key`, `table_schema` and
    `close` are `ingest --from`'s; `group` also commits the resume points to that consumer
    group after the lake commit (never read back); `config` adds librdkafka settings;
    `reader` (`kafka_ingest.READERS`): `kafka` reads with Spark's own connector where the
    session has it. `lenient` sets bad records aside (`pipeline.bad_lines`) and converts the
    rest; `dead_letter_topic` also produces them there before the commit, as
    `kafka_ingest.ingest_topics` does (each reported once: by the run that first reads it)."""
    from changelake.kafka.changefeed import topic_list
    from changelake.spark.errors import translate_errors

    if source not in SOURCES:
        raise LakeError(f"unknown changefeed {source!r}: debezium or ydb")
    if reader not in READERS:
        raise LakeError(f"ingest --kafka: unknown reader {reader!r} (one of "
                        f"{', '.join(READERS)})")
    names = topic_list(topics)
    _check_lenient(lenient, dead_letter_topic, names, reader)
    table_json = read_table_json(table_schema) if table_schema else None
    handle = lake.handle(table)
    for column in key:
        check_name(column, f"table {handle.name}: key column")
    step = progress or (lambda _d, _i, _n: None)
    step("waiting for the table's writer lock", 0, 4)
    with handle.writer() as writer, ExitStack() as cleanup:
        key = writer.changefeed_key(key, table_json)
        run = TopicsRun.begin(writer, cleanup, handle.name, bootstrap, names, format=source,
                              what=source, group=group, framed=False, config=config)
        state, committed, recorded, plans = run.state, run.committed, run.recorded, run.plans
        if committed is None:  # closed: no record can add anything
            return run.unchanged()
        step("reading topics", 1, 4)
        dead_letters = make_dead_letter_topic(bootstrap, dead_letter_topic, config)
        partitions = [(topic, r.partition) for topic, ranges in plans for r in ranges]
        lines = translate_errors(_read, lake.spark, bootstrap, plans, partitions, config,
                                 reader)
        records = translate_errors(lines.raw.count)
        step("converting", 2, 4)
        aside_count, aside = 0, []
        if lenient and records:
            lines, aside_count, aside = _set_aside(lines, source, table_json, key,
                                                   _new_records(plans, recorded),
                                                   everything=dead_letters is not None)
            if aside_count and translate_errors(lines.raw.count) == 0:
                # Nothing to convert (and no columns to create a table with): the records are
                # reported (and dead-lettered) again by the next run that reads them.
                sent = send_dead_letters(bootstrap, dead_letters, aside, config)
                return run.unchanged("every record read was set aside", records, aside,
                                     aside_count, sent)
        if records == 0 and close and state is not None:  # nothing new, but the end
            from pyspark.sql import functions as F

            empty = writer.current().limit(0).select(
                "*", F.lit(0).cast("long").alias("_time"), F.lit(0).cast("long").alias("_diff"))
            decoded = DecodedInput(empty, Antichain([committed]), Antichain(), None,
                                   one_row_per_key=True)
            return run.commit(writer, decoded, _partition_reads(plans, recorded, {}), recorded,
                              0, key=key, buckets=buckets, scd2=scd2)
        if records == 0:  # nothing new: no commit (and no columns to create a table with)
            return run.unchanged("the topics hold no records beyond the committed offsets")
        existing = state is not None
        converted = _convert(lake.spark, lines, source, key, table_json, close=close,
                             state=writer.current() if existing else None,
                             since=committed if existing else None)
        check_columns(converted.changes, existing, "--schema",
                      f"the records read from {', '.join(names)}")
        decoded = changefeed_input(converted, source, committed)
        absorbed = frontier_after(committed, decoded.upper)
        facts = translate_errors(_resume_facts, converted.marks, absorbed, partitions)
        reads = _partition_reads(plans, recorded, facts)
        offsets = replace(_offsets(bootstrap, recorded, reads), format=source)
        dead_lettered = send_dead_letters(bootstrap, dead_letters, aside, config)
        step("committing", 3, 4)
        report = run.commit(writer, decoded, reads, offsets, records, key=key, buckets=buckets,
                            scd2=scd2, set_aside=aside, set_aside_count=aside_count,
                            dead_lettered=dead_lettered)
    step("done", 4, 4)
    return report


def _set_aside(lines: Any, source: str, table_json: dict[str, Any] | None,
               key: Sequence[str], new: Any, *, everything: bool) -> tuple[Any, int, list]:
    """Lenient mode: the lines without the bad ones, and the bad ones no committed run read
    (how many, and all of them or a sample), as `kafka_set_aside.collect` reports them."""
    from pyspark.sql import functions as F

    from changelake.spark.changefeed.dispatch import Unsupported
    from changelake.spark.changefeed.pipeline import bad_lines
    from changelake.spark.changefeed.read import Lines
    from changelake.spark.errors import translate_errors

    try:
        bad = translate_errors(bad_lines, lines, source, table_json, key)
    except Unsupported as why:
        raise LakeError(f"ingest --kafka --from {source} --lenient: this read is not one the "
                        f"Spark conversion covers ({why}); nothing was committed") from None
    rest = lines.raw.join(bad.select("file_index", "row"), ["file_index", "row"], "left_anti")
    count, aside = collect_set_aside(bad.select(
        F.col("file").alias("_file"), F.col("row").alias("_offset"),
        F.col("reason").alias("_error")), new=new, everything=everything)
    return Lines(lines.spark, rest, lines.files, per_file=True), count, aside


def _read(spark: Any, bootstrap: str, plans: Sequence[tuple[str, Sequence[Any]]],
          partitions: Sequence[tuple[str, int]], config: Mapping[str, Any] | None,
          reader: str) -> Any:
    """The planned ranges' records as lines, read on the executors by `kafka-cdc`, or by
    Spark's own `kafka` connector (`reader="kafka"`), whose records have the same columns."""
    from changelake.spark import kafka_source
    from changelake.spark.changefeed.read import record_lines

    starting = {topic: {str(r.partition): r.start for r in ranges} for topic, ranges in plans}
    ending = {topic: {str(r.partition): r.end for r in ranges} for topic, ranges in plans}
    options = kafka_source.reader_options(bootstrap, [topic for topic, _ in plans],
                                          config=config)
    options.update(output="records", startingOffsets=orjson.dumps(starting).decode(),
                   endingOffsets=orjson.dumps(ending).decode())
    if reader == "kafka":
        records = connector_records(spark, options)
    else:
        kafka_source.register(spark)
        records = spark.read.format(kafka_source.NAME).options(**options).load()
    return record_lines(spark, records, partitions)


def _convert(spark: Any, lines: Any, source: str, key: Sequence[str],
             table_json: dict[str, Any] | None, **options: Any) -> Any:
    """The JVM conversion of the lines; a batch it does not cover is refused, its first bad
    record named by topic, partition and offset."""
    from changelake.spark.changefeed.dispatch import Unsupported
    from changelake.spark.changefeed.pipeline import convert_lines

    try:
        return convert_lines(spark, lines, source, key, table_json, python_fallback=False,
                             **options)
    except Unsupported as why:
        raise LakeError(f"ingest --kafka --from {source}: this read is not one the Spark "
                        f"conversion covers ({why}); nothing was committed. Convert the "
                        f"topics with `encode --from {source} --kafka`, or ingest files") \
            from None
    except ChangelakeError as error:
        raise _at_offset(error) from None


def _at_offset(error: ChangelakeError) -> ChangelakeError:
    """A record's error as the Kafka readers name it: topic, partition and offset (the lines
    of a partition are numbered by their offsets, `read.record_lines`)."""
    where = error.location
    if where is None or where.line is None:
        return error
    return type(error)(error.reason, Location(where.file, offset=where.line)) \
        if isinstance(error, ChangefeedError) else error


def _resume_facts(marks: Any, absorbed: int | None, partitions: Sequence[tuple[str, int]]
                  ) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """Per (topic, partition), in one aggregate on the executors: the least offset of a record
    the table still needs once committed through `absorbed` (None: closed, none is), and how
    far the partition reached (its highest change time, or its last barrier's step); see the
    module docstring."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from changelake.spark.settings import NOT_ADAPTIVE, settings

    change = F.col("kind") == "change"
    barrier = F.col("kind") == "resolved"
    reached = [F.max(F.when(change, F.col("time"))).alias("high"),
               F.max(F.when(barrier, F.col("time"))).alias("step")]

    def facts(row: Any, first: int | None) -> tuple[int | None, int | None]:
        return first, row["step"] if row["step"] is not None else row["high"]

    if absorbed is None:  # closed: no record is needed again
        with settings(marks.sparkSession, NOT_ADAPTIVE):  # one job, as below
            rows = marks.groupBy("file_index").agg(*reached).collect()
        return {partitions[r["file_index"]]: facts(r, None) for r in rows}
    done = marks.where(change & (F.col("time") < absorbed) & F.col("tx").isNotNull()) \
        .select("tx").distinct().withColumn("_done", F.lit(True))
    tx_event = F.col("kind").isin("BEGIN", "END")
    last_done = F.max(F.when(tx_event & F.col("_done"), F.col("row"))) \
        .over(Window.partitionBy("file_index"))
    after = tx_event & F.col("_done").isNull() & (F.col("row") > F.coalesce(last_done, F.lit(-1)))
    # One job: adaptive execution would run each of the query's stages as a job of its own,
    # five for a follow's round of a few thousand records (benchmarks/README.md).
    with settings(marks.sparkSession, NOT_ADAPTIVE):
        rows = (marks.join(done, "tx", "left")
                .select("file_index", "kind", "row", "time",
                        F.when(after, F.col("row")).alias("_tx"))
                .groupBy("file_index").agg(
                    F.min(F.when(change & (F.col("time") >= absorbed), F.col("row")))
                    .alias("needed"),
                    F.min("_tx").alias("tx"), F.max(F.when(barrier, F.col("row")))
                    .alias("barrier"), *reached).collect())
    out = {}
    for row in rows:
        firsts = [row[c] for c in ("needed", "tx", "barrier") if row[c] is not None]
        out[partitions[row["file_index"]]] = facts(row, min(firsts) if firsts else None)
    return out


__all__ = ["SOURCES", "ingest_changefeed_topics"]
