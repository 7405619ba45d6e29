"""Conversion without keys, for feeds that carry complete before-images.

Debezium on MySQL (`binlog_row_image=FULL`) or PostgreSQL with `REPLICA IDENTITY FULL` says
both what a row was and what it became, so the diffs follow directly: `(before, t, -1)` and
`(after, t, +1)`, with no state and no key. A connector restart re-sends a tail of events;
those are recognised by their identity (position, op and images) and produce nothing.

What this cannot do, and says so with a `ChangefeedError` naming the line: an update or delete
without a before-image (PostgreSQL's default replica identity), an `UNCHANGED` value (TOAST), a
row whose previous value is not said (YDB UPSERT). Those feeds need keys (`KeyedConverter`).
Snapshot rows are inserts here, so a repeated snapshot doubles rows: use keys for such feeds.
A truncate retracts every row this converter has inserted and not yet retracted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from changelake.convert.base import Pending, WindowedConverter
from changelake.errors import ChangefeedError
from changelake.formats.change import UNCHANGED, Change, Op
from changelake.protocol.messages import Update
from changelake.values import freeze

_HINT = "give the key columns so that the previous row comes from state"


def event_identity(change: Change) -> tuple[Any, ...]:
    """What makes two events one (a replay): position, op and images. Public because Spark
    drops replays by it before converting."""
    return (change.position, change.op, freeze(change.key), freeze(change.before),
            freeze(change.after))


class ImageConverter(WindowedConverter):
    def __init__(self, columns: Sequence[str] | None = None) -> None:
        super().__init__(columns)
        self._seen: set[Any] = set()
        self._live: Counter[Any] = Counter()

    def push(self, change: Change) -> None:
        op = change.op
        if op in (Op.MESSAGE, Op.TOMBSTONE):
            self.stats.ignored += 1
            return
        if op is not Op.TRUNCATE:
            self._check(change)
            self._check_columns(change)
        identity = event_identity(change)
        if identity in self._seen:
            if self.time_of(change) < self.frontier:
                self.stats.late += 1
            else:
                self.stats.duplicates += 1
            return
        time = self.time_of(change)
        if time < self.frontier:
            raise ChangefeedError(
                f"change at time {time} arrives after times below {self.frontier} were "
                "finished", change.origin)
        self._seen.add(identity)
        self._enqueue(Pending(time, change.position or (), (), change))

    def is_replay(self, change: Change) -> bool:
        return event_identity(change) in self._seen

    def _check(self, change: Change) -> None:
        op = change.op
        if op is Op.UPSERT:
            raise ChangefeedError(f"this event does not say the row's previous value: {_HINT}",
                                  change.origin)
        if op in (Op.UPDATE, Op.DELETE) and change.before is None:
            raise ChangefeedError(
                f"op {op.value} without a before-image (PostgreSQL REPLICA IDENTITY DEFAULT?): "
                f"{_HINT}", change.origin)
        if op in (Op.CREATE, Op.READ, Op.UPDATE) and change.after is None:
            raise ChangefeedError(f"op {op.value} without an after-image", change.origin)
        for name, image in (("before", change.before), ("after", change.after)):
            if image is not None and any(v is UNCHANGED for v in image.values()):
                raise ChangefeedError(f"{name} holds an unavailable (unchanged) value: {_HINT}",
                                      change.origin)

    def _apply(self, ready: list[Pending]) -> list[Update]:
        columns = self.columns or ()
        out: list[Update] = []
        for p in ready:
            change = p.change
            if change.op is Op.TRUNCATE:
                for row, n in self._live.items():
                    if n:
                        out.append((row, p.time, -n))
                self._live.clear()
                continue
            if change.op in (Op.UPDATE, Op.DELETE):
                old = self.freeze_row(dict(change.before or {}), columns)
                self._live[old] -= 1
                out.append((old, p.time, -1))
            if change.after is not None:
                new = self.freeze_row(dict(change.after), columns)
                self._live[new] += 1
                out.append((new, p.time, 1))
            self.stats.applied += 1
        return out
