"""The ways `ingest` reads, as a table (`SOURCES`): files, Kafka topics or changefeed topics,
once or followed. Each row lists, in the order they are checked, the usage errors of the
options it does not take; `ingest_source` finds a call's row and refuses what does not fit,
and `check_topics` asks the cluster for the topics a call names before Spark starts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import click

INPUT = "INPUT"
"""The call's fact for at least one INPUT argument (beside the options it gives)."""
SECOND_INPUT = "INPUT INPUT"
"""The call's fact for more than one INPUT argument."""


@dataclass(frozen=True)
class Refusal:
    """A usage error: the call gives one of `given` (or `given` is empty) and none of
    `missing`. `{source}` in the message stands for the --from."""

    message: str
    given: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    def applies(self, call: frozenset[str]) -> bool:
        return ((not self.given or any(fact in call for fact in self.given))
                and not any(fact in call for fact in self.missing))


@dataclass(frozen=True)
class Source:
    """A way `ingest` reads: a row of `SOURCES`, found by --follow, --kafka and --from."""

    name: str
    follow: bool
    kafka: bool | None  # None: the row of a call with --kafka or without (which it refuses)
    changefeed: bool  # --from debezium|ydb; else materialize
    refusals: tuple[Refusal, ...]  # the first that applies is the call's usage error


_TRIGGERS = ("--checkpoint", "--max-files-per-trigger", "--max-records-per-trigger")

NOT_FOLLOWING = Refusal("--checkpoint, --max-files-per-trigger, --max-records-per-trigger and "
                        "--until-idle go with --follow", given=(*_TRIGGERS, "--until-idle"))
CLOSES_ITSELF = Refusal("--close is for --from debezium|ydb: a Materialize CDC log closes "
                        "itself", given=("--close",))
KAFKA_OPTIONS = (
    Refusal("--topic, --schema-registry and --group go with --kafka",
            given=("--topic", "--schema-registry", "--group"), missing=("--kafka",)),
    Refusal("--kafka needs --topic T", given=("--kafka",), missing=("--topic",)),
    Refusal("--lenient and --dead-letter-topic go with --kafka (bad records of topics)",
            given=("--lenient", "--dead-letter-topic"), missing=("--kafka",)),
    Refusal("--dead-letter-topic takes the records --lenient sets aside: give --lenient too",
            given=("--dead-letter-topic",), missing=("--lenient",)),
)
AVRO_SCHEMA = Refusal("--kafka needs the messages' schema: --schema FILE or --schema-registry "
                      "URL", missing=("--schema", "--schema-registry"))
JSON_TOPICS = Refusal("--schema-registry is for Avro topics (--from materialize); {source} "
                      "topics are JSON", given=("--schema-registry",))
DATA_LOSS = Refusal("--no-fail-on-data-loss goes with --follow --kafka (--from materialize: "
                    "the streaming source's failOnDataLoss)", given=("--no-fail-on-data-loss",))
NO_INPUT = Refusal("no INPUT given (files or directories, or --kafka/--topic)",
                   missing=(INPUT,))
TOPICS_NOT_FILES = Refusal("--kafka reads the topics: no input files as well", given=(INPUT,))
_ONE_DIRECTORY = ("--follow follows one INPUT directory (no more than one INPUT as well), or "
                  "--kafka topics")
ONE_DIRECTORY = (Refusal(_ONE_DIRECTORY, missing=(INPUT,)),
                 Refusal(_ONE_DIRECTORY, given=(SECOND_INPUT, "--max-records-per-trigger")))
FOLLOWED_TOPICS = (
    Refusal("--follow --kafka follows the topics: no INPUT as well", given=(INPUT,)),
    Refusal("--group and --max-files-per-trigger do not go with --follow --kafka (the "
            "checkpoint keeps the offsets)", given=("--group", "--max-files-per-trigger")),
)
_NOT_FILES = "--follow --from {source} follows changefeed topics (--kafka --topic), not files"
ROUNDS = (
    Refusal(_NOT_FILES, missing=("--kafka",)),
    Refusal(_NOT_FILES, given=(INPUT,)),
    Refusal("--checkpoint, --max-files-per-trigger, --max-records-per-trigger and --close do "
            "not go with --follow --from {source}: each round reads from the offsets the "
            "table's last commit recorded, to the partitions' ends",
            given=(*_TRIGGERS, "--close")),
)

SOURCES = (
    Source("files", follow=False, kafka=False, changefeed=False,
           refusals=(NOT_FOLLOWING, CLOSES_ITSELF, *KAFKA_OPTIONS, DATA_LOSS, NO_INPUT)),
    Source("changefeed files", follow=False, kafka=False, changefeed=True,
           refusals=(NOT_FOLLOWING, *KAFKA_OPTIONS, DATA_LOSS, NO_INPUT)),
    Source("topics", follow=False, kafka=True, changefeed=False,
           refusals=(NOT_FOLLOWING, CLOSES_ITSELF, *KAFKA_OPTIONS, AVRO_SCHEMA, DATA_LOSS,
                     TOPICS_NOT_FILES)),
    Source("changefeed topics", follow=False, kafka=True, changefeed=True,
           refusals=(NOT_FOLLOWING, *KAFKA_OPTIONS, JSON_TOPICS, DATA_LOSS, TOPICS_NOT_FILES)),
    Source("followed directory", follow=True, kafka=False, changefeed=False,
           refusals=(CLOSES_ITSELF, *KAFKA_OPTIONS, DATA_LOSS, *ONE_DIRECTORY)),
    Source("followed topics", follow=True, kafka=True, changefeed=False,
           refusals=(CLOSES_ITSELF, *KAFKA_OPTIONS, AVRO_SCHEMA, *FOLLOWED_TOPICS)),
    Source("followed changefeed topics", follow=True, kafka=None, changefeed=True,
           refusals=(*KAFKA_OPTIONS, *ROUNDS, JSON_TOPICS, DATA_LOSS)),
)


def ingest_source(given: Iterable[str], inputs: int, *, source: str) -> Source:
    """The row of a call that gives the options named in `given` (--follow among them) and
    `inputs` INPUT arguments, with --from `source`; its first refusal that applies is raised
    as a `click.UsageError`."""
    call = set(given)
    if inputs:
        call.add(INPUT)
    if inputs > 1:
        call.add(SECOND_INPUT)
    facts = frozenset(call)
    follow, kafka, changefeed = "--follow" in facts, "--kafka" in facts, source != "materialize"
    row = next(s for s in SOURCES if s.follow == follow and s.kafka in (kafka, None)
               and s.changefeed == changefeed)
    for refusal in row.refusals:
        if refusal.applies(facts):
            raise click.UsageError(refusal.message.format(source=source))
    return row


def check_topics(bootstrap: str, topics: tuple[str, ...],
                 dead_letter_topic: str | None = None) -> None:
    """`ingest --kafka`'s topics (and dead-letter topic) checked on the driver before Spark
    and the lake's metastore start: a bootstrap no broker answers at, or a topic that does not
    exist, is the one line `decode --kafka` gives, in seconds, with no lake made. The reads
    in Spark check again (a topic may be deleted in between)."""
    from changelake.kafka import client
    from changelake.kafka.changefeed import topic_list
    from changelake.kafka.errors import TopicError

    client.check_topics(bootstrap, topic_list(topics))
    if dead_letter_topic is not None:
        try:
            client.check_topics(bootstrap, [dead_letter_topic])
        except TopicError as error:
            raise TopicError(f"dead-letter topic: {error}") from None

