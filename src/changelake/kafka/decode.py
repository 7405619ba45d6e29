"""`changelake decode --kafka`: a bounded read of a topic through the reference Reader.

The output is `decode`'s (see `local.write_history`): the history in time order, frontier lines,
a final frontier. With a consumer group, the next run starts where this one ended; the Reader's
state must travel with those offsets (a fresh Reader given only the later messages could never
connect their progress statements to time 0), so `--group` needs `--state`, and the order of
the two writes makes a crash at any point harmless: the state is saved first, the offsets
committed after. A crash in between re-reads messages the state already holds: duplicates,
which the Reader absorbs, and nothing is printed twice (the state remembers its frontier).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from changelake.errors import InputError
from changelake.formats.materialize import CdcSchema, SetAside
from changelake.kafka.source import TopicReader
from changelake.local import DecodeReport, decode_messages, start_reader
from changelake.protocol import Antichain


def decode_topic(
    bootstrap: str,
    topic: str,
    out: IO[bytes],
    *,
    schema: CdcSchema | None = None,
    schema_registry: str | None = None,
    group: str | None = None,
    lenient: bool = False,
    since: Antichain | None = None,
    state: Path | None = None,
    config: Mapping[str, Any] | None = None,
) -> DecodeReport:
    """Decode the messages of `topic` (a bounded read: see `kafka.source`) and write the
    history to `out`. With `group`, start at the group's offsets and commit the ends read, after
    saving the reader to `state` (required with a group)."""
    if group is not None and state is None:
        raise InputError("--group resumes from the group's offsets, which needs the reader "
                         "state that goes with them: add --state FILE")
    reader = start_reader(since=since, state=state, lenient=lenient)
    set_aside: list[SetAside] = []
    with TopicReader(bootstrap, topic, group=group, schema=schema,
                     schema_registry=schema_registry, config=config) as source:
        source.plan()
        messages = source.messages(set_aside.append if lenient else None)
        report = decode_messages(reader, messages, out, state=state, set_aside=set_aside)
        if group is not None:
            source.commit()
    return report
