"""The CDCv2 writer: changes and "input finished through T" in, messages out.

A writer buffers changes until their time is finished, then emits them consolidated (at most
one diff per `(data, time)`, zeros dropped: see `consolidate.py`) in batches of `batch_size`,
followed by one progress statement for the interval it just finished with the exact number of
distinct updates at each time. A statement's `lower` is where the previous one ended, so the
statements tile time without gaps, and any reader can graft them in any order.

Every message the writer emits is true of the final history, so writing the same input twice
(say, a second writer for availability) yields messages that a reader deduplicates.
"""

from __future__ import annotations

from collections.abc import Iterable

from changelake.errors import Location, ProtocolError
from changelake.protocol.antichain import Antichain, FrontierLike, as_frontier
from changelake.protocol.messages import Data, Message, Progress, Update, Updates
from changelake.protocol.time import Time

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1  # diffs travel as Avro longs


class Writer:
    """Turns changes into CDCv2 messages. Changes need not be consolidated or ordered."""

    def __init__(self, *, batch_size: int = 1024, since: FrontierLike | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.batch_size = batch_size
        self._lower = as_frontier(since) if since is not None else Antichain([0])
        self._buffer: dict[tuple[Data, Time], int] = {}

    @property
    def frontier(self) -> Antichain:
        """Times not beyond this are finished: a change at such a time is an error."""
        return self._lower

    @property
    def unfinished(self) -> int:
        """How many `(data, time)` pairs wait for their time to be finished."""
        return len(self._buffer)

    def push(self, data: Data, time: Time, diff: int, origin: Location | None = None) -> None:
        if not self._lower.beyond(time):
            raise ProtocolError(
                "late-change",
                f"change at time {time!r} arrives after the input was finished through "
                f"{self._lower.to_json()}",
                origin,
            )
        key = (data, time)
        total = self._buffer.get(key, 0) + diff
        if not _LONG_MIN <= total <= _LONG_MAX:
            raise ProtocolError(
                "diff-overflow",
                f"the diffs of {data!r} at time {time!r} add up to {total}, beyond a 64-bit "
                "integer",
                origin,
            )
        self._buffer[key] = total

    def extend(self, changes: Iterable[Update]) -> None:
        for data, time, diff in changes:
            self.push(data, time, diff)

    def advance_to(self, frontier: Antichain, origin: Location | None = None) -> list[Message]:
        """Declare every time not beyond `frontier` finished; return the messages for them."""
        if not self._lower.le(frontier):
            raise ProtocolError(
                "frontier-regressed",
                f"cannot finish through {frontier.to_json()}: already finished through "
                f"{self._lower.to_json()}",
                origin,
            )
        if frontier == self._lower:
            return []
        done: list[Update] = []
        keep: dict[tuple[Data, Time], int] = {}
        for (data, time), diff in self._buffer.items():
            if frontier.beyond(time):
                keep[(data, time)] = diff
            elif diff != 0:
                done.append((data, time, diff))
        self._buffer = keep
        done.sort(key=lambda u: u[1])
        counts: dict[Time, int] = {}
        for _, time, _ in done:
            counts[time] = counts.get(time, 0) + 1
        size = self.batch_size
        messages: list[Message] = [
            Updates(done[i : i + size]) for i in range(0, len(done), size)
        ]
        messages.append(Progress(self._lower, frontier, tuple(sorted(counts.items()))))
        self._lower = frontier
        return messages

    def finish_through(self, time: int, origin: Location | None = None) -> list[Message]:
        """Integer times: every time up to and including `time` is finished."""
        return self.advance_to(Antichain([time + 1]), origin)

    def close(self) -> list[Message]:
        """No more changes at any time: emit the rest and the closing statement."""
        return self.advance_to(Antichain())
