"""The CDCv2 reader: recovers an exactly-once, time-ordered history from a mangled log.

Why one module of over 500 lines: the reader's rules, the bounds it tracks and the validation
of a whole message before any of it applies are one argument, read top to bottom; the JSON form
of progress and `collect` are its own entry points.

The log may duplicate, reorder and re-batch both kinds of statement (see `messages.py`). The
reader collects them and reports, whenever it can, a *frontier*: every update at a time not
beyond it is known, exactly once, and has been handed out in time order.

Two bounds limit what can be reported, and the frontier is their meet:

* `progress_frontier`: the statements grafted on so far cover exactly the times not beyond it.
  A statement is grafted only once `progress_frontier` is beyond its `lower` (the interval
  `[0, lower)` is already covered), so no gap is ever papered over; out-of-order statements
  wait in `queue`. Grafting adds the statement's counts for times not yet covered, and moves
  `progress_frontier` to the join of itself and the statement's `upper`.
* the outstanding counts: `counts[t]` is (updates announced at `t`) minus (distinct updates
  received at `t`). A covered time is finished when its count reaches zero; `incomplete` holds
  the covered times still waiting for updates. Counts at times beyond `progress_frontier` may be
  negative for a while: updates may arrive before the statement that counts them.

This is differential-dataflow's `capture.rs` iterator (seed 001) with these corrections:

* duplicates inside one message count once (the reference decrements once per occurrence);
* a count for a time outside its statement's `[lower, upper)` is an error (`count-outside`);
* two different diffs for one `(data, time)` is an error (`conflicting-diff`);
* a zero diff is an error (`zero-diff`);
* a covered time that receives more distinct updates than its count is an error
  (`excess-updates`), where the reference would silently stall forever.

Each message is validated completely before any of it is applied, so a rejected message leaves
the state exactly as it was. In strict mode the error is raised; in lenient mode the message is
set aside in `rejected` with its error, and reading goes on.

Memory is bounded by what is unfinished: updates at finished times are handed out and dropped,
updates arriving later at finished times are discarded on sight (they can only be duplicates of
what a consistent log already delivered), and statements wholly behind the progress frontier
are dropped. After a closed stream the state is empty.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from changelake.errors import Location, ProtocolError
from changelake.protocol.antichain import Antichain, FrontierLike, as_frontier
from changelake.protocol.messages import Data, Message, Progress, Update, Updates
from changelake.protocol.time import MAX_TIME, Time
from changelake.text import short

Batch = tuple[list[Update], Antichain]
"""A finished batch: the updates (in time order) at times that just became finished, and the
new frontier."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message set aside in lenient mode, with the rule it broke."""

    message: Message
    error: ProtocolError


def _beyond_test(frontier: Antichain) -> Callable[[Time], bool]:
    """A fast `frontier.beyond` for the hot loop: a C-level `int.__le__` for integer times."""
    elements = frontier.elements
    if not elements:
        return lambda _t: False
    if len(elements) == 1 and type(elements[0]) is int:
        return elements[0].__le__  # f <= t
    return frontier.beyond


class Reader:
    """Push messages in, get finished batches out. See the module docstring for the protocol."""

    def __init__(self, since: FrontierLike | None = None, *, strict: bool = True) -> None:
        start = as_frontier(since) if since is not None else Antichain([0])
        self.strict = strict
        self._reported: Antichain = start
        self._progress: Antichain = start
        self._pending: dict[Time, dict[Data, int]] = {}  # by time: finishing pops a bucket
        self._counts: dict[Time, int] = {}
        self._incomplete: set[Time] = set()
        self._queue: list[Progress] = []
        self.rejected: list[Rejected] = []

    # ----------------------------------------------------------------------------- observers

    @property
    def frontier(self) -> Antichain:
        """Every update at a time not beyond this frontier has been handed out."""
        return self._reported

    @property
    def progress_frontier(self) -> Antichain:
        return self._progress

    @property
    def is_closed(self) -> bool:
        return self._reported.is_closed

    def state_size(self) -> int:
        """How many items the reader holds: pending updates, counts and queued statements."""
        held = sum(map(len, self._pending.values()))
        return held + len(self._counts) + len(self._queue) + len(self._incomplete)

    def waiting_for(self) -> str | None:
        """Why the frontier is not further along, in words; None if the stream is closed."""
        if self._reported.is_closed:
            return None
        missing = {t: self._counts[t] for t in self._incomplete}
        lowers = sorted({str(p.lower.to_json()) for p in self._queue})
        return waiting_reason(missing, self._progress, lowers)

    # ------------------------------------------------------------------------------- input

    def push(self, message: Message) -> list[Batch]:
        """Take one message; return the batches it finished (zero or one)."""
        try:
            if isinstance(message, Updates):
                self._accept_updates(message)
            elif isinstance(message, Progress):
                self._accept_progress(message)
                self._drain_queue()  # only a new statement can make the queue actionable
            else:
                raise TypeError(f"not a CDCv2 message: {message!r}")
        except ProtocolError as error:
            if self.strict:
                raise
            self.rejected.append(Rejected(message, error))
        return self._advance()

    def _accept_updates(self, message: Updates) -> None:
        # The hot loop: kept lean on purpose (no enumerate, no per-update tuple keys). The
        # index of an offending update is recovered on the error path only.
        beyond = _beyond_test(self._reported)
        pending = self._pending
        fresh: dict[Time, dict[Data, int]] = {}
        for data, time, diff in message.updates:
            if not diff:
                raise self._update_error(message, "zero-diff", data, time, diff, None)
            if not beyond(time):
                continue  # at a finished time: a duplicate of what was already handed out
            bucket = pending.get(time)
            known = None if bucket is None else bucket.get(data)
            if known is None:
                new = fresh.get(time)
                if new is None:
                    new = fresh[time] = {}
                known = new.get(data)
                if known is None:
                    new[data] = diff
                    continue
            if known != diff:
                raise self._update_error(message, "conflicting-diff", data, time, diff, known)
        covered = _beyond_test(self._progress)
        counts = self._counts
        for time, new in fresh.items():
            if not covered(time) and counts.get(time, 0) - len(new) < 0:
                raise ProtocolError(
                    "excess-updates",
                    f"time {time!r} would have {len(new) - counts.get(time, 0)} more distinct "
                    "updates than its progress statement counted",
                    message.origin or Location(),
                )
        # Validated: apply.
        incomplete = self._incomplete
        for time, new in fresh.items():
            bucket = pending.get(time)
            if bucket is None:
                pending[time] = new
            else:
                bucket.update(new)
            left = counts.get(time, 0) - len(new)
            if left:
                counts[time] = left
            else:
                counts.pop(time, None)
                incomplete.discard(time)

    @staticmethod
    def _update_error(
        message: Updates, rule: str, data: Data, time: Time, diff: int, known: int | None
    ) -> ProtocolError:
        index = next(i for i, u in enumerate(message.updates) if u[0] == data and u[1] == time
                     and u[2] == diff)
        where = (message.origin or Location()).with_index(index)
        if rule == "zero-diff":
            return ProtocolError(rule, f"update of {data!r} at time {time!r} has diff 0", where)
        return ProtocolError(
            rule, f"{data!r} at time {time!r} has diff {diff}, but diff {known} was seen", where
        )

    def _accept_progress(self, message: Progress) -> None:
        origin = message.origin or Location()
        if not message.lower.le(message.upper):
            raise ProtocolError(
                "inverted-interval",
                f"upper {message.upper.to_json()} is not at or after lower "
                f"{message.lower.to_json()}",
                origin,
            )
        seen: set[Time] = set()
        for index, (time, count) in enumerate(message.counts):
            if not message.contains(time):
                raise ProtocolError(
                    "count-outside",
                    f"count for time {time!r} lies outside [{message.lower.to_json()}, "
                    f"{message.upper.to_json()})",
                    origin.with_index(index),
                )
            if count < 0:
                raise ProtocolError(
                    "negative-count", f"count {count} for time {time!r}", origin.with_index(index)
                )
            if time in seen:
                raise ProtocolError(
                    "duplicate-count", f"time {time!r} is counted twice", origin.with_index(index)
                )
            seen.add(time)
        if not message.upper.le(self._progress):  # else: wholly covered already, adds nothing
            self._queue.append(message)

    def _drain_queue(self) -> None:
        """Graft every statement that connects to the covered prefix, until none does."""
        queue = self._queue
        while True:
            position = next((i for i, p in enumerate(queue) if p.lower.le(self._progress)), None)
            if position is None:
                return
            statement = queue.pop(position)
            try:
                self._progress = self._graft(statement, self._progress)
            except ProtocolError as error:
                if self.strict:
                    raise
                self.rejected.append(Rejected(statement, error))
                continue
            # Statements now wholly behind the covered prefix can only repeat what is known.
            queue[:] = [p for p in queue if not p.upper.le(self._progress)]

    def _graft(self, statement: Progress, progress: Antichain) -> Antichain:
        new_progress = progress.join(statement.upper)
        counts = self._counts
        open_before, open_after = _beyond_test(progress), _beyond_test(new_progress)
        added = {t: c for t, c in statement.counts if open_before(t)}
        # Times that this statement newly covers, whose expected count is now final.
        newly = {t for t in added if not open_after(t)}
        newly.update(t for t in counts if open_before(t) and not open_after(t))
        for time in newly:
            final = counts.get(time, 0) + added.get(time, 0)
            if final < 0:
                raise ProtocolError(
                    "excess-updates",
                    f"time {time!r} has {-final} more distinct updates than the "
                    f"{added.get(time, 0)} this statement counts",
                    statement.origin,
                )
        # Validated: apply.
        for time, c in added.items():
            left = counts.get(time, 0) + c
            if left:
                counts[time] = left
            else:
                counts.pop(time, None)
        for time in newly:
            if counts.get(time, 0) > 0:
                self._incomplete.add(time)
        return new_progress

    def _advance(self) -> list[Batch]:
        lower_bound = self._progress.meet(Antichain(self._incomplete)) if self._incomplete \
            else self._progress
        if lower_bound == self._reported:
            return []
        still_open = _beyond_test(lower_bound)
        pending = self._pending
        done = sorted(t for t in pending if not still_open(t))
        finished: list[Update] = []
        for time in done:
            bucket = pending.pop(time)
            finished.extend(zip(bucket, repeat(time, len(bucket)), bucket.values(), strict=True))
        # Counts at finished times are zero by construction (an incomplete time holds the
        # frontier back), so no count is dropped here.
        self._reported = lower_bound
        return [(finished, lower_bound)]

    # ------------------------------------------------------------------------- persistence

    def save(self, data_to_json: Callable[[Data], Any] = lambda d: d) -> dict[str, Any]:
        """The reader's state as plain JSON, to resume after a restart without re-reading."""
        def time_json(t: Time) -> Any:
            return list(t) if isinstance(t, tuple) else t

        return {
            "version": 1,
            "strict": self.strict,
            "reported": self._reported.to_json(),
            "progress": self._progress.to_json(),
            "pending": [[data_to_json(d), time_json(t), r]
                        for t, bucket in self._pending.items() for d, r in bucket.items()],
            "counts": [[time_json(t), c] for t, c in self._counts.items()],
            "incomplete": [time_json(t) for t in self._incomplete],
            "queue": [progress_to_json(p) for p in self._queue],
        }

    @classmethod
    def restore(
        cls, state: Any, data_from_json: Callable[[Any], Data] = lambda d: d
    ) -> Reader:
        """The reader `save` described. A state is input (a file that may be damaged or
        edited), so it is checked whole before use, like a message: every time, count and
        diff well-formed, and the invariants the reader keeps between messages true (see
        `_check_restored`). Anything else raises ValueError naming the first field wrong,
        rather than making a reader that fails later, far from the cause."""
        if not isinstance(state, dict) or state.get("version") != 1:
            version = state.get("version") if isinstance(state, dict) else None
            raise ValueError(f"unknown reader state version {version!r}")
        fields = {"version", "strict", "reported", "progress", "pending", "counts",
                  "incomplete", "queue"}
        if set(state) != fields:
            raise ValueError(f"a reader state has exactly the fields {sorted(fields)}")
        if type(state["strict"]) is not bool:
            raise ValueError("strict must be true or false")
        times = _TimeKind()
        reader = cls(times.antichain(state["reported"], "reported"), strict=state["strict"])
        reader._progress = times.antichain(state["progress"], "progress")
        for i, entry in enumerate(_array(state["pending"], "pending")):
            what = f"pending[{i}]"
            if not isinstance(entry, list) or len(entry) != 3:
                raise ValueError(f"{what}: expected [data, time, diff]")
            time = times.time(entry[1], what)
            data = data_from_json(entry[0])
            try:
                hash(data)
            except TypeError:
                raise ValueError(f"{what}: data is not a row") from None
            bucket = reader._pending.setdefault(time, {})
            if data in bucket:
                raise ValueError(f"{what}: the same data and time twice")
            bucket[data] = _nonzero(entry[2], f"{what} diff")
        for i, entry in enumerate(_array(state["counts"], "counts")):
            what = f"counts[{i}]"
            if not isinstance(entry, list) or len(entry) != 2:
                raise ValueError(f"{what}: expected [time, count]")
            time = times.time(entry[0], what)
            if time in reader._counts:
                raise ValueError(f"{what}: time {time!r} counted twice")
            reader._counts[time] = _nonzero(entry[1], f"{what} count")
        reader._incomplete = {times.time(t, f"incomplete[{i}]")
                              for i, t in enumerate(_array(state["incomplete"], "incomplete"))}
        for i, p in enumerate(_array(state["queue"], "queue")):
            what = f"queue[{i}]"
            if not isinstance(p, dict) or set(p) != {"lower", "upper", "counts"}:
                raise ValueError(f"{what}: expected a statement {{lower, upper, counts}}")
            counts = []
            for j, c in enumerate(_array(p["counts"], f"{what}.counts")):
                if not isinstance(c, dict) or set(c) != {"time", "count"}:
                    raise ValueError(f"{what}.counts[{j}]: expected {{time, count}}")
                counts.append((times.time(c["time"], f"{what}.counts[{j}]"),
                               _integer(c["count"], f"{what}.counts[{j}] count")))
            statement = Progress(times.antichain(p["lower"], f"{what}.lower"),
                                 times.antichain(p["upper"], f"{what}.upper"), tuple(counts))
            try:
                reader._accept_progress(statement)  # the rules of a statement read as input
            except ProtocolError as error:
                raise ValueError(f"{what}: {error.reason}") from None
        reader._check_restored()
        return reader

    def _check_restored(self) -> None:
        """The invariants between messages: the progress frontier is not behind the reported
        one; the covered times with outstanding counts are exactly `incomplete`, each
        expecting more updates; the reported frontier is the meet of both bounds; no update
        waits at a time already reported finished."""
        if not self._reported.le(self._progress):
            raise ValueError("reported is beyond progress")
        covered = {t: c for t, c in self._counts.items() if not self._progress.beyond(t)}
        if set(covered) != self._incomplete or any(c < 0 for c in covered.values()):
            raise ValueError("incomplete must list the covered times that still expect updates")
        bound = self._progress.meet(Antichain(self._incomplete)) if self._incomplete \
            else self._progress
        if bound != self._reported:
            raise ValueError(f"reported must be {bound.to_json()}, the meet of progress and "
                             "incomplete")
        late = [t for t in self._pending if not self._reported.beyond(t)]
        if late:
            raise ValueError(f"updates pending at time {late[0]!r}, already reported finished")


class _TimeKind:
    """Times read from a saved state: well-formed, and all of one kind (integers, or tuples
    of one length), since times of different kinds do not compare."""

    def __init__(self) -> None:
        self.kind: int | None = None  # 0 for integers, else the tuple length

    def time(self, value: Any, what: str) -> Time:
        if type(value) is int:
            kind, time = 0, value
            if not 0 <= value <= MAX_TIME:
                raise ValueError(f"{what}: time {value} is not a 64-bit non-negative integer")
        elif isinstance(value, list) and value and all(type(v) is int and 0 <= v <= MAX_TIME
                                                         for v in value):
            kind, time = len(value), tuple(value)
        else:
            raise ValueError(f"{what}: not a time: {short(value)}")
        if self.kind is None:
            self.kind = kind
        elif kind != self.kind:
            raise ValueError(f"{what}: time {short(value)} is not of the kind of the others")
        return time

    def antichain(self, value: Any, what: str) -> Antichain:
        return Antichain(self.time(t, what) for t in _array(value, what))


def _array(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{what}: expected an array, got {short(value)}")
    return value


def _integer(value: Any, what: str) -> int:
    if type(value) is not int or not -(2**63) <= value < 2**63:
        raise ValueError(f"{what} must be a 64-bit integer, got {short(value)}")
    return value


def _nonzero(value: Any, what: str) -> int:
    if not _integer(value, what):
        raise ValueError(f"{what} must not be zero")
    return value



def waiting_reason(
    missing: dict[Time, int], progress: Antichain, queued_lowers: Iterable[str] = ()
) -> str | None:
    """Why a frontier is held back, in words, for both engines: covered times still missing
    updates (with how many), and the first time no grafted statement covers."""
    reasons: list[str] = []
    if missing:
        times = sorted(missing)
        shown = ", ".join(f"{t!r} ({missing[t]} missing)" for t in times[:5])
        more = f" and {len(times) - 5} more" if len(times) > 5 else ""
        reasons.append(f"updates missing at time {shown}{more}")
    if not progress.is_closed:
        gap = f"no progress statement covers times from {progress.to_json()}"
        lowers = list(queued_lowers)[:3]
        if lowers:
            gap += f" (queued statements start at {', '.join(lowers)})"
        reasons.append(gap)
    return "; ".join(reasons) or None


def progress_to_json(p: Progress) -> dict[str, Any]:
    def time_json(t: Time) -> Any:
        return list(t) if isinstance(t, tuple) else t

    return {
        "lower": p.lower.to_json(),
        "upper": p.upper.to_json(),
        "counts": [{"time": time_json(t), "count": c} for t, c in p.counts],
    }


def progress_from_json(value: dict[str, Any], origin: Location | None = None) -> Progress:
    def time_of(t: Any) -> Time:
        return tuple(t) if isinstance(t, list) else t

    return Progress.make(
        (time_of(t) for t in value["lower"]),
        (time_of(t) for t in value["upper"]),
        ((time_of(c["time"]), c["count"]) for c in value["counts"]),
        origin,
    )


def read(
    messages: Iterable[Message], since: FrontierLike | None = None, *, strict: bool = True
) -> Iterator[Batch]:
    """Pull wrapper: the finished batches of a message stream, in order."""
    reader = Reader(since, strict=strict)
    for message in messages:
        yield from reader.push(message)


@dataclass(slots=True)
class Collected:
    """Everything a reader recovered from a stream: the history and the final frontier."""

    updates: list[Update] = field(default_factory=list)
    frontier: Antichain = field(default_factory=lambda: Antichain([0]))
    rejected: list[Rejected] = field(default_factory=list)


def collect(
    messages: Iterable[Message], since: FrontierLike | None = None, *, strict: bool = True
) -> Collected:
    """Read a whole stream and return its recovered history."""
    reader = Reader(since, strict=strict)
    out = Collected(frontier=reader.frontier)
    for message in messages:
        for updates, frontier in reader.push(message):
            out.updates.extend(updates)
            out.frontier = frontier
    out.rejected = reader.rejected
    return out
