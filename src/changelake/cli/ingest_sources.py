"""What `ingest` checks before Spark starts beside its options: the topics a call names, asked
of their cluster."""

from __future__ import annotations


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

