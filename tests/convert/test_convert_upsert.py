"""Keyed upsert conversion and image conversion, change by change."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from changelake.convert import ImageConverter, KeyedConverter, MemoryState, UpsertOptions
from changelake.errors import ChangefeedError, Location
from changelake.formats.change import UNCHANGED, Change, Op
from changelake.values import freeze, thaw

COLUMNS = ("id", "name", "note")


def ch(op: Op, *, after: dict[str, Any] | None = None, before: dict[str, Any] | None = None,
       pos: int | None = None, time: int | None = 1, line: int = 1) -> Change:
    return Change(op, None, before, after, (pos,) if pos is not None else None, time,
                  origin=Location("f", line))


def row(id: int, name: Any = None, note: Any = None) -> dict[str, Any]:
    return {"id": id, "name": name, "note": note}


def keyed(**options: Any) -> KeyedConverter:
    return KeyedConverter(UpsertOptions(keys=("id",), **options), columns=COLUMNS)


def state_of(updates: list[Any], initial: dict[Any, int] | None = None) -> dict[Any, int]:
    total: Counter[Any] = Counter(initial or {})
    for data, _, diff in updates:
        total[data] += diff
    assert all(n >= 0 for n in total.values()), total
    return {tuple(thaw(d).values()): n for d, n in total.items() if n}


def run(converter: Any, changes: list[Change], frontier: int | None = None) -> list[Any]:
    for c in changes:
        converter.push(c)
    return converter.advance(frontier)


def test_upserts_retract_the_previous_row() -> None:
    out = run(keyed(), [ch(Op.READ, after=row(1, "a"), pos=1, time=0),
                        ch(Op.UPDATE, after=row(1, "b"), pos=2, time=5)])
    assert [(thaw(d)["name"], t, r) for d, t, r in out] == [("a", 0, 1), ("a", 5, -1),
                                                            ("b", 5, 1)]


def test_late_older_event_never_resurrects_a_deleted_key() -> None:
    conv = keyed(sequence_by="version")
    columns = ("id", "name", "note", "version")
    conv.columns = columns
    first = run(conv, [ch(Op.CREATE, after={**row(1, "a"), "version": 1}, time=1),
                       ch(Op.DELETE, before={**row(1), "version": 5}, time=1)], frontier=2)
    assert state_of(first) == {}
    later = run(conv, [ch(Op.UPDATE, after={**row(1, "zombie"), "version": 3}, time=2)],
                frontier=3)
    assert later == [] and conv.stats.stale == 1


@pytest.mark.parametrize("flip", [False, True])
def test_ties_are_broken_by_content_whatever_the_arrival_order(flip: bool) -> None:
    a = ch(Op.UPDATE, after=row(1, "a"), pos=7)
    b = ch(Op.UPDATE, after=row(1, "b"), pos=7)
    conv = keyed()
    out = run(conv, [b, a] if flip else [a, b])
    assert state_of(out) == {(1, "b", None): 1}
    assert conv.stats.ties == 1


def test_ties_across_windows_agree_with_ties_inside_one() -> None:
    conv = keyed()
    out = run(conv, [ch(Op.UPDATE, after=row(1, "b"), pos=7)], frontier=2)
    out += run(conv, [ch(Op.UPDATE, after=row(1, "a"), pos=7, time=2)], frontier=3)
    assert state_of(out) == {(1, "b", None): 1} and conv.stats.ties == 1


def test_a_replayed_tail_produces_nothing() -> None:
    events = [ch(Op.CREATE, after=row(i, "x"), pos=i, time=i) for i in range(1, 6)]
    events.append(ch(Op.UPDATE, after=row(2, "y"), pos=6, time=6))
    once = keyed()
    expected = run(once, events)
    twice = keyed()
    got = run(twice, events[:4], frontier=4)
    got += run(twice, events[2:], frontier=None)  # restart: 3 and 4 again, then the rest
    assert sorted(map(repr, got)) == sorted(map(repr, expected))
    assert twice.stats.late == 1 and twice.stats.duplicates == 1


def test_unchanged_keeps_the_stored_value_and_is_never_written() -> None:
    conv = keyed()
    out = run(conv, [ch(Op.CREATE, after=row(1, "a", "long text"), pos=1),
                     ch(Op.UPDATE, after=row(1, "b", UNCHANGED), pos=2)])
    assert state_of(out) == {(1, "b", "long text"): 1}
    # Unknown key: the before-image fills in, else null (counted).
    conv = keyed()
    out = run(conv, [ch(Op.UPDATE, before=row(2, "o", "kept"), after=row(2, "n", UNCHANGED),
                        pos=1),
                     ch(Op.UPDATE, after=row(3, "n", UNCHANGED), pos=2)])
    assert state_of(out) == {(2, "n", "kept"): 1, (3, "n", None): 1}
    assert conv.stats.unresolved == 1


def test_a_moved_key_takes_the_unchanged_values_of_the_row_its_delete_removed() -> None:
    """`UPDATE ... SET id = 10 WHERE id = 3` with `note` unchanged: Debezium's delete of 3
    and create of 10 at one position (one WAL record). 10's `note` is 3's as it stood just
    before: from an earlier event of 3 in the same transaction, or from the state."""
    conv = keyed()
    out = run(conv, [ch(Op.CREATE, after=row(3, "a", "long"), pos=1, time=1),
                     ch(Op.UPDATE, after=row(3, "b", "longer"), pos=2, time=2),
                     ch(Op.DELETE, before=row(3), pos=3, time=2),
                     ch(Op.CREATE, after=row(10, "b", UNCHANGED), pos=3, time=2)])
    assert state_of(out) == {(10, "b", "longer"): 1}
    assert conv.stats.unresolved == 0
    state = MemoryState.from_rows([row(3, "a", "stored")], ("id",), COLUMNS)
    conv = KeyedConverter(UpsertOptions(keys=("id",)), columns=COLUMNS, state=state)
    out = run(conv, [ch(Op.DELETE, before=row(3), pos=3, time=2),
                     ch(Op.CREATE, after=row(10, "a", UNCHANGED), pos=3, time=2)])
    assert state_of(out, {freeze(row(3, "a", "stored"), COLUMNS): 1}) == {(10, "a", "stored"): 1}


def test_key_moves_apart_and_in_a_row_each_take_their_own_row() -> None:
    """Two moves in one transaction, each at its own position, then 10 moved again to 20 in
    a later one: each create takes the row its own delete removed; a replay changes
    nothing."""
    events = [ch(Op.CREATE, after=row(3, "c", "three"), pos=1, time=1),
              ch(Op.CREATE, after=row(4, "d", "four"), pos=2, time=1),
              ch(Op.DELETE, before=row(3), pos=5, time=5),
              ch(Op.CREATE, after=row(10, "c", UNCHANGED), pos=5, time=5),
              ch(Op.DELETE, before=row(4), pos=6, time=5),
              ch(Op.CREATE, after=row(11, "d", UNCHANGED), pos=6, time=5),
              ch(Op.DELETE, before=row(10), pos=8, time=8),
              ch(Op.CREATE, after=row(20, "c", UNCHANGED), pos=8, time=8)]
    conv = keyed()
    out = run(conv, events + events[2:])
    assert state_of(out) == {(20, "c", "three"): 1, (11, "d", "four"): 1}
    assert conv.stats.unresolved == 0


def test_what_is_not_a_key_move_keeps_its_unresolved_values() -> None:
    """A move whose old key has no row (nothing before, no state) leaves the values
    unresolved; a create beside deletes of two keys at its position is no move; a move
    without a placeholder is as without the rule."""
    conv = keyed()
    out = run(conv, [ch(Op.DELETE, before=row(3), pos=3, time=2),
                     ch(Op.CREATE, after=row(10, "a", UNCHANGED), pos=3, time=2)])
    assert state_of(out) == {(10, "a", None): 1}
    assert conv.stats.unresolved == 1
    conv = keyed()
    out = run(conv, [ch(Op.CREATE, after=row(3, "c", "three"), pos=1, time=1),
                     ch(Op.CREATE, after=row(4, "d", "four"), pos=2, time=1),
                     ch(Op.DELETE, before=row(3), pos=3, time=2),
                     ch(Op.DELETE, before=row(4), pos=3, time=2),
                     ch(Op.CREATE, after=row(10, "a", UNCHANGED), pos=3, time=2)])
    assert state_of(out) == {(10, "a", None): 1}
    conv = keyed()
    out = run(conv, [ch(Op.CREATE, after=row(3, "c", "three"), pos=1, time=1),
                     ch(Op.DELETE, before=row(3), pos=3, time=2),
                     ch(Op.CREATE, after=row(10, "c", "new"), pos=3, time=2)])
    assert state_of(out) == {(10, "c", "new"): 1}


def test_ignore_null_updates() -> None:
    events = [ch(Op.CREATE, after=row(1, "a", "n"), pos=1), ch(Op.UPDATE, after=row(1, "b"),
                                                              pos=2)]
    assert state_of(run(keyed(ignore_null_updates=True), events)) == {(1, "b", "n"): 1}
    assert state_of(run(keyed(), events)) == {(1, "b", None): 1}


def test_column_lists() -> None:
    events = [ch(Op.CREATE, after=row(1, "a", "n"), pos=1)]
    out = run(keyed(column_list=("id", "note")), events)
    assert [thaw(d) for d, _, _ in out] == [{"id": 1, "note": "n"}]
    out = run(keyed(except_column_list=("note",)), events)
    assert [thaw(d) for d, _, _ in out] == [{"id": 1, "name": "a"}]
    with pytest.raises(ChangefeedError, match="key columns"):
        run(keyed(column_list=("name",)), events)
    with pytest.raises(ValueError):
        UpsertOptions(keys=("id",), column_list=("id",), except_column_list=("x",))


def test_apply_as_deletes() -> None:
    conv = keyed(apply_as_deletes=lambda c: c.after is not None and c.after["note"] == "gone")
    out = run(conv, [ch(Op.CREATE, after=row(1, "a"), pos=1),
                     ch(Op.UPDATE, after=row(1, "a", "gone"), pos=2)])
    assert state_of(out) == {}


def test_previous_rows_come_from_the_state() -> None:
    state = MemoryState.from_rows([row(1, "old"), row(2, "other")], ("id",), COLUMNS)
    conv = KeyedConverter(UpsertOptions(keys=("id",)), columns=COLUMNS, state=state)
    out = run(conv, [ch(Op.UPDATE, after=row(1, "new"), pos=1),
                     ch(Op.TRUNCATE, pos=2, time=2),
                     ch(Op.CREATE, after=row(3, "c"), pos=3, time=2),
                     ch(Op.CREATE, after=row(4, "early"), pos=1, time=2)], frontier=3)
    # Key 4 was written before the truncate (pos 1 < 2): the truncate takes it too. A later
    # arrival from before the truncate is stale.
    out += run(conv, [ch(Op.CREATE, after=row(5, "stale"), pos=1, time=3)], frontier=None)
    initial = {freeze(row(1, "old"), COLUMNS): 1, freeze(row(2, "other"), COLUMNS): 1}
    assert state_of(out, initial) == {(3, "c", None): 1}
    assert conv.stats.stale == 1


def test_a_late_new_change_is_an_error_naming_its_line() -> None:
    conv = keyed()
    run(conv, [ch(Op.CREATE, after=row(1, "a"), pos=1, time=5)], frontier=6)
    with pytest.raises(ChangefeedError, match=r"^f, line 9: change at time 3 arrives after"):
        conv.push(ch(Op.CREATE, after=row(2, "b"), pos=2, time=3, line=9))


def test_snapshot_rows_take_the_current_time() -> None:
    conv = keyed()
    out = run(conv, [ch(Op.READ, after=row(1), pos=1, time=None)], frontier=10)
    out += run(conv, [ch(Op.UPDATE, after=row(1, "x"), pos=2, time=12),
                      ch(Op.READ, after=row(2), pos=3, time=None)], frontier=None)
    assert [(thaw(d)["id"], t, r) for d, t, r in out] == [(1, 0, 1), (1, 12, -1), (1, 12, 1),
                                                          (2, 12, 1)]


# -------------------------------------------------------------------------------- images


def test_images_give_diffs_directly() -> None:
    conv = ImageConverter()
    out = run(conv, [ch(Op.CREATE, after=row(1, "a"), pos=1),
                     ch(Op.UPDATE, before=row(1, "a"), after=row(1, "b"), pos=2),
                     ch(Op.CREATE, after=row(2, "c"), pos=3),
                     ch(Op.UPDATE, before=row(1, "a"), after=row(1, "b"), pos=2),  # replay
                     ch(Op.TRUNCATE, pos=4, time=2),
                     ch(Op.CREATE, after=row(5, "e"), pos=5, time=2),
                     ch(Op.DELETE, before=row(5, "e"), pos=6, time=2)])
    assert state_of(out) == {}
    assert conv.stats.duplicates == 1


@pytest.mark.parametrize(("change", "message"), [
    (ch(Op.UPDATE, after=row(1)), "without a before-image"),
    (ch(Op.DELETE), "without a before-image"),
    (ch(Op.UPDATE, before=row(1), after=row(1, UNCHANGED)), "unavailable"),
    (ch(Op.UPSERT, after=row(1)), "does not say the row's previous value"),
])
def test_images_refuse_what_needs_keys(change: Change, message: str) -> None:
    with pytest.raises(ChangefeedError, match=message):
        ImageConverter().push(change)
