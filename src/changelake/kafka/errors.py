"""The errors of Kafka access that are not bad input: a broker, topic or registry that cannot
serve the request.

Bad records inside a topic are `InputError`s located at topic, partition and offset (they follow
the lenient / strict contract like a bad line in a file); these are different: nothing can be
set aside, the user has to fix an address, a topic or a registry.
"""

from __future__ import annotations

from changelake.errors import ChangelakeError


class TopicError(ChangelakeError):
    """A Kafka cluster or topic that cannot be used: unreachable, missing, or failing a write."""


class RegistryError(ChangelakeError):
    """A schema registry that cannot be reached or answers something other than the API's."""


class OffsetOutOfRange(TopicError):
    """A read asked a partition for an offset it does not hold (its records were deleted, or
    the topic was recreated), with `auto.offset.reset=error`: librdkafka reports that instead
    of silently going on from the partition's beginning or end. The reader decides."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        super().__init__(f"topic {topic!r} partition {partition}: offset {offset} is not held "
                         f"by the partition: {reason}")
        self.topic = topic
        self.partition = partition
        self.offset = offset
