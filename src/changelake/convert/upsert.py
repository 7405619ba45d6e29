"""Keyed (upsert) conversion: Changes that say what a row *became* into retractions and inserts.

Debezium on PostgreSQL with the default replica identity, YDB UPDATES / NEW_IMAGE, and every
snapshot row say only what a row became. To emit `(old, t, -1), (new, t, +1)` the previous row
of the key must come from state: this converter's own memory of every key it has touched, and
below it a pluggable `State` for keys it has not (the lake table's current state, later; a
`MemoryState` now). The options follow Spark's `create_auto_cdc_flow`:

* `keys`: the primary-key columns. Every output row carries every column, keys included.
* `sequence_by`: what orders the events of one key: the change's `position` by default, or a
  column of the row, or any function of the `Change`. An event whose sequence is below the
  key's is stale and ignored; so is everything below a truncate. A delete is remembered with
  its sequence, so a late older event never resurrects the key.
* Ties (same key, same sequence, different content) are broken by `(op rank, row text)`: the
  larger wins whatever the arrival order, and each tie is counted. The same sequence with the
  same content is a replay (a connector restart re-sending its tail) and produces nothing.
* `apply_as_deletes`: a predicate on the change that makes it a delete (default: op d).
* `column_list` / `except_column_list`: which columns the output rows carry.
* `ignore_null_updates`: a null in an update keeps the stored value, as UNCHANGED does.

Where the state has no row for a key, the conversion retracts nothing: a before-image in the
feed describes a row the output never held. Such a before-image still fills `UNCHANGED` columns
of the new row, and only if neither has a value does the column become null (counted in
`stats.unresolved`).

A key move (`key_moves`): PostgreSQL's `UPDATE ... SET id = 10 WHERE id = 3` reaches Debezium as
one WAL record, which it sends as a delete of 3 and a create of 10 at one position, the create's
unchanged TOAST columns `__debezium_unavailable_value`. A create that shares its time and
position with the delete of exactly one other key (and no other key created there) takes, as
its before-image, the row the delete removed: the old key's row as it stood just before, from
the events applied before it or from the state, as an update takes its own key's. Its
`UNCHANGED` columns then keep the old key's values; where the old key had no row either, they
stay unresolved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from changelake.convert.base import Pending, WindowedConverter
from changelake.errors import ChangefeedError
from changelake.formats.change import UNCHANGED, Change, Op
from changelake.protocol.messages import Update
from changelake.text import short
from changelake.values import Record, freeze

Key = tuple[Any, ...]


class State(Protocol):
    """The current rows of a keyed table, consulted for keys the converter has not seen."""

    def current(self, keys: Iterable[Key]) -> Mapping[Key, Record]:
        """The current row of each of `keys` that has one (absent keys: no row)."""
        ...

    def rows(self) -> Iterable[tuple[Key, Record]]:
        """Every current row, for a truncate."""
        ...


class MemoryState:
    """A `State` held in a dict: rows frozen in the output column order."""

    def __init__(self, rows: Mapping[Key, Record] | None = None) -> None:
        self._rows = dict(rows or {})

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], keys: Sequence[str],
                  columns: Sequence[str]) -> MemoryState:
        state = {}
        for row in rows:
            state[tuple(freeze(row.get(k)) for k in keys)] = freeze(dict(row), fields=columns)
        return cls(state)

    def current(self, keys: Iterable[Key]) -> dict[Key, Record]:
        return {k: self._rows[k] for k in keys if k in self._rows}

    def rows(self) -> Iterator[tuple[Key, Record]]:
        return iter(list(self._rows.items()))


@dataclass(frozen=True)
class UpsertOptions:
    keys: tuple[str, ...]
    sequence_by: str | Callable[[Change], Any] | None = None
    apply_as_deletes: Callable[[Change], bool] | None = None
    column_list: tuple[str, ...] | None = None
    except_column_list: tuple[str, ...] = ()
    ignore_null_updates: bool = False
    #: Kafka tombstones delete their key. Off by default: after a connector restart a replayed
    #: tombstone could delete a row re-created after it (the `d` event already deleted it).
    tombstones_delete: bool = False

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("keys must name at least one column")
        if self.column_list is not None and self.except_column_list:
            raise ValueError("give column_list or except_column_list, not both")


_OP_RANK = {Op.DELETE: 0, Op.TOMBSTONE: 0, Op.TRUNCATE: 0}


@dataclass(slots=True)
class _Entry:
    row: Record | None
    sequence: Any = None  # None: known from the State only, no event applied yet
    tiebreak: tuple[Any, ...] = ()


@dataclass(slots=True)
class _Effect:
    kind: str  # "write", "delete", "truncate", "ignore"
    key: Key | None = None
    after: dict[str, Any] | None = None
    before: Mapping[str, Any] | None = None
    nulls_keep: bool = field(default=False)


class KeyedConverter(WindowedConverter):
    """See the module docstring."""

    def __init__(self, options: UpsertOptions, *, columns: Sequence[str] | None = None,
                 state: State | None = None) -> None:
        super().__init__(columns)
        self.options = options
        self.state: State = state if state is not None else MemoryState()
        self._known: dict[Key, _Entry] = {}
        self._floor: Any = None  # sequence of the latest truncate
        self._last_position: tuple[int, ...] | None = None
        self._arrivals = 0
        #: Not None: every applied delete with a position keeps here, by its `(time,
        #: position)`, the row it removed (where its key had one). The Python path on Spark
        #: converts each key apart and hands a key move's to its create this way
        #: (`spark.changefeed.python_path.run_converters`), as `key_moves` does in one.
        self.removed: dict[tuple[int, tuple[int, ...]], Record] | None = None

    # ---------------------------------------------------------------------------- columns

    @property
    def output_columns(self) -> tuple[str, ...]:
        if self.columns is None:
            raise ChangefeedError("no row seen yet: the table's columns are unknown")
        o = self.options
        if o.column_list is not None:
            cols = tuple(c for c in self.columns if c in o.column_list)
        else:
            cols = tuple(c for c in self.columns if c not in o.except_column_list)
        missing = [k for k in o.keys if k not in cols]
        if missing:
            raise ChangefeedError(f"key columns {missing} are not among the output columns "
                                  f"{list(cols)}")
        return cols

    # -------------------------------------------------------------------------------- push

    def push(self, change: Change) -> None:
        moved = split_moved_key(change, self.options.keys)
        if moved is not None:
            self.push(moved[0])
            change = moved[1]
        effect = self._effect(change)
        if effect.kind == "ignore":
            self.stats.ignored += 1
            return
        if effect.kind != "truncate":
            self._check_columns(change)
            self.output_columns  # noqa: B018 - validates the key columns against the columns
        sequence = self._sequence(change)
        tiebreak = self._tiebreak(change, effect)
        time = self.time_of(change)
        if time < self.frontier:
            if self._is_old(effect.key, sequence, tiebreak):
                self.stats.late += 1
                return
            raise ChangefeedError(
                f"change at time {time} arrives after times below {self.frontier} were "
                "finished (out-of-order input, or a feed that broke its progress guarantee)",
                change.origin)
        self._enqueue(Pending(time, sequence, tiebreak, change, {"effect": effect}))

    def _effect(self, change: Change) -> _Effect:
        o = self.options
        op = change.op
        if op is Op.MESSAGE:
            return _Effect("ignore")
        if op is Op.TRUNCATE:
            return _Effect("truncate")
        if op is Op.TOMBSTONE:
            if not o.tombstones_delete or change.key is None:
                return _Effect("ignore")
            return _Effect("delete", self._key(change))
        deleting = o.apply_as_deletes(change) if o.apply_as_deletes else op is Op.DELETE
        key = self._key(change)
        if deleting:
            return _Effect("delete", key)
        if change.after is None:
            raise ChangefeedError(
                f"op {op.value} has no after-image: the feed does not say what the row became "
                "(YDB OLD_IMAGE or KEYS_ONLY DEBEZIUM_JSON cannot be converted)", change.origin)
        return _Effect("write", key, dict(change.after), change.before,
                       nulls_keep=o.ignore_null_updates)

    def _key(self, change: Change) -> Key:
        key = key_of(change, self.options.keys)
        if key is None:
            raise unkeyed(change, self.options.keys)
        return key

    def _sequence(self, change: Change) -> Any:
        """The order of events of one key. By default `(position, n)`: n is 0 for events with
        a position, and for events without one (incremental-snapshot rows, YDB records without
        virtual timestamps) it is their arrival number, after the latest position seen: the
        feed's order is then the only order there is."""
        by = self.options.sequence_by
        if by is None:
            if change.position is not None:
                if self._last_position is None or change.position > self._last_position:
                    self._last_position = change.position
                return (change.position, 0)
            self._arrivals += 1
            return (self._last_position or (), self._arrivals)
        if callable(by):
            value = by(change)
        else:
            image = change.after if change.after is not None else change.before
            value = image.get(by) if image is not None else None
        if value is None or value is UNCHANGED:
            raise ChangefeedError(f"sequence_by {by!r} gives no value for this event",
                                  change.origin)
        return value

    @staticmethod
    def _tiebreak(change: Change, effect: _Effect) -> tuple[Any, ...]:
        rank = _OP_RANK.get(change.op, 1)
        if effect.kind == "delete":
            rank = 0
        return (rank, repr(sorted(effect.after.items())) if effect.after else "")

    def is_replay(self, change: Change) -> bool:
        """Has this event, or a newer one for its key, already been applied?"""
        effect = self._effect(change)
        if effect.kind == "ignore":
            return False
        return self._is_old(effect.key, self._sequence(change), self._tiebreak(change, effect))

    def _is_old(self, key: Key | None, sequence: Any, tiebreak: tuple[Any, ...]) -> bool:
        if self._floor is not None and not _gt(sequence, self._floor):
            return True  # at or below the latest truncate (a replayed truncate included)
        entry = self._known.get(key) if key is not None else None
        if entry is None or entry.sequence is None:
            return False
        return not _gt((sequence, tiebreak), (entry.sequence, entry.tiebreak))

    # ------------------------------------------------------------------------------- apply

    def _apply(self, ready: list[Pending]) -> list[Update]:
        unknown = {p.extra["effect"].key for p in ready
                   if p.extra["effect"].key is not None and p.extra["effect"].key not in
                   self._known}
        if unknown:
            found = self.state.current(list(unknown))
            for key in unknown:
                self._known[key] = _Entry(found.get(key))
        out: list[Update] = []
        moves = key_moves((p.time, p.change.position, p.change.op, p.extra["effect"].kind,
                           p.extra["effect"].key) for p in ready)
        moved: dict[tuple[int, tuple[int, ...]], Record] = {}
        for p in ready:
            effect: _Effect = p.extra["effect"]
            if effect.kind == "truncate":
                out.extend(self._truncate(p))
            else:
                out.extend(self._apply_one(p, effect, moves, moved))
        return out

    def _apply_one(self, p: Pending, effect: _Effect,
                   moves: Mapping[tuple[int, tuple[int, ...]], tuple[Key, Key]] | None = None,
                   moved: dict[tuple[int, tuple[int, ...]], Record] | None = None
                   ) -> list[Update]:
        """One event applied. `moves` (`key_moves`) and `moved`, the rows the moves' deletes
        removed, by their `(time, position)`: an applied delete that is a move's keeps its
        key's row there, and the move's create takes it as its before-image (`_merge`)."""
        assert effect.key is not None
        entry = self._known[effect.key]
        if self._floor is not None and _gt(self._floor, p.sequence):
            self.stats.stale += 1
            return []
        if entry.sequence is not None:
            if (p.sequence, p.tiebreak) == (entry.sequence, entry.tiebreak):
                self.stats.duplicates += 1
                return []
            if p.sequence == entry.sequence:
                self.stats.ties += 1
            if not _gt((p.sequence, p.tiebreak), (entry.sequence, entry.tiebreak)):
                self.stats.stale += 1
                return []
        previous = entry.row
        at = (p.time, p.change.position)
        move = moves.get(at) if moves else None
        new: Record | None = None
        if effect.kind == "delete" and move is not None and move[0] == effect.key \
                and previous is not None and moved is not None:
            moved[at] = previous
        if effect.kind == "delete" and self.removed is not None and previous is not None \
                and p.change.position is not None:
            self.removed[at] = previous
        if effect.kind == "write":
            taken = None
            if move is not None and move[1] == effect.key and p.change.op is Op.CREATE \
                    and moved is not None:
                taken = moved.get(at)
            new = self._merge(effect, previous, taken)
        entry.row, entry.sequence, entry.tiebreak = new, p.sequence, p.tiebreak
        self.stats.applied += 1
        if new == previous:
            return []
        out: list[Update] = []
        if previous is not None:
            out.append((previous, p.time, -1))
        if new is not None:
            out.append((new, p.time, 1))
        return out

    def _merge(self, effect: _Effect, previous: Record | None,
               moved: Record | None = None) -> Record:
        """The row a write makes: the after-image, its `UNCHANGED` columns (and with
        `ignore_null_updates` its nulls) taken from the key's previous row, else from the
        before-image: the event's own, or for a key move's create (`moved`) the row its
        delete removed (`key_moves`)."""
        columns = self.output_columns
        after = effect.after or {}
        before: Mapping[str, Any] = dict(moved) if moved is not None else effect.before or {}
        row: dict[str, Any] = {}
        for c in columns:
            value = after.get(c)
            keep = value is UNCHANGED or (effect.nulls_keep and value is None
                                          and previous is not None)
            if keep:
                if previous is not None:
                    value = previous.get(c)
                elif before.get(c, UNCHANGED) is not UNCHANGED:
                    value = before[c]
                else:
                    value = None
                    self.stats.unresolved += 1
            row[c] = value
        return self.freeze_row(row, columns)

    def _truncate(self, p: Pending) -> list[Update]:
        if self._floor is not None and not _gt(p.sequence, self._floor):
            self.stats.duplicates += 1  # a replayed truncate
            return []
        out: list[Update] = []
        seen: set[Key] = set()
        for key, entry in self._known.items():
            seen.add(key)
            if entry.sequence is not None and not _gt(p.sequence, entry.sequence):
                continue  # written after the truncate
            if entry.row is not None:
                out.append((entry.row, p.time, -1))
            entry.row, entry.sequence, entry.tiebreak = None, p.sequence, p.tiebreak
        for key, row in self.state.rows():
            if key not in seen:
                out.append((row, p.time, -1))
                self._known[key] = _Entry(None, p.sequence, p.tiebreak)
        self._floor = p.sequence
        self.stats.applied += 1
        return out


def key_of(change: Change, keys: Sequence[str]) -> Key | None:
    """The key of an event: from its key, else its after-image, else its before-image, the
    first that has every key column with a value other than UNCHANGED; None if none has.
    Public because keyed conversion on Spark groups each key's events before converting."""
    for source in (change.key, change.after, change.before):
        if source is not None and all(k in source for k in keys):
            values = tuple(source[k] for k in keys)
            if any(v is UNCHANGED for v in values):
                continue
            return tuple(freeze(v) for v in values)
    return None


def unkeyed(change: Change, keys: Sequence[str]) -> ChangefeedError:
    """The error for an event whose key `key_of` cannot tell; where an image has a key column
    spelled in another case, it says so (the images' names are matched exactly)."""
    names = {n for image in (change.key, change.after, change.before) if image is not None
             for n in (image.names() if hasattr(image, "names") else image)}
    spelled = {k: n for k in keys for n in sorted(names) if n != k and n.lower() == k.lower()}
    hint = "" if not spelled else " (key columns are matched in the feed's spelling: " + \
        ", ".join(f"{k!r} is {n!r} there" for k, n in spelled.items()) + ")"
    return ChangefeedError(f"cannot tell the key {list(keys)} of this {change.op.value} "
                           f"event: neither its key, after nor before image has it{hint}",
                           change.origin)


def key_moves(events: Iterable[tuple[int, tuple[int, ...] | None, Op, str, Key | None]]
              ) -> dict[tuple[int, tuple[int, ...]], tuple[Key, Key]]:
    """The key moves among `events`, each `(time, position, op, effect kind, key)`: by
    `(time, position)`, `(old key, new key)` where exactly one key is deleted there (any
    delete: op d, or the delete half of `split_moved_key`) and exactly one other key is
    created (op c). PostgreSQL writes one WAL record for an `UPDATE` of a row's key, which
    Debezium sends as that delete and that create at the record's position (its LSN, in the
    transaction of `sequence[0]`, the time): nothing else is at that position, a replay of it
    aside (the same keys again). Events without a position are never a move.

    Public because keyed conversion on Spark finds the same moves (`spark.changefeed.
    moves`) and hands the old key's row to the create as its before-image."""
    deleted: dict[tuple[int, tuple[int, ...]], set[Key]] = {}
    created: dict[tuple[int, tuple[int, ...]], set[Key]] = {}
    for time, position, op, kind, key in events:
        if position is None or key is None:
            continue
        if kind == "delete":
            deleted.setdefault((time, position), set()).add(key)
        elif kind == "write" and op is Op.CREATE:
            created.setdefault((time, position), set()).add(key)
    moves: dict[tuple[int, tuple[int, ...]], tuple[Key, Key]] = {}
    for at, new in created.items():
        old = deleted.get(at)
        if old is not None and len(old) == 1 and len(new) == 1 and old != new:
            moves[at] = (next(iter(old)), next(iter(new)))
    return moves


def split_moved_key(change: Change, keys: Sequence[str]) -> tuple[Change, Change] | None:
    """An update that changes the primary key, as (delete of the old key, write of the new
    one): what Debezium itself emits as d + c at one position. Public because keyed conversion
    on Spark groups by key and must split before grouping (the two halves belong to two
    groups). None for any other change."""
    if change.op is not Op.UPDATE or change.before is None or change.after is None:
        return None
    before, after = change.before, change.after
    if not all(k in before and k in after for k in keys):
        return None
    old = tuple(before[k] for k in keys)
    if any(v is UNCHANGED or v is None for v in old) or old == tuple(after[k] for k in keys):
        return None
    return (replace(change, op=Op.DELETE, key=None, after=None),
            replace(change, key=None, before=None))


def _gt(a: Any, b: Any) -> bool:
    """a > b for sequences; a TypeError (mixed kinds of sequence) becomes a clear error."""
    try:
        return bool(a > b)
    except TypeError:
        raise ChangefeedError(f"sequences {short(a)} and {short(b)} cannot be compared") \
            from None
