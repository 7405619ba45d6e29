"""The Reader: each protocol rule, lenient mode, bounded memory, save and restore."""


import orjson
import pytest

from changelake.errors import Location, ProtocolError
from changelake.protocol import Antichain, Progress, Reader, Updates, Writer, collect
from changelake.simulate import mangle, random_history, write
from tests.support.seeding import seeded

P = Progress.make


def push_all(reader: Reader, messages: list) -> list:
    out = []
    for m in messages:
        out += reader.push(m)
    return out


def test_reorders_and_deduplicates() -> None:
    messages = [
        Updates([("x", 5, 1)]),
        P([3], [10], [(4, 1), (5, 2)]),
        Updates([("y", 5, 1), ("x", 5, 1)]),
        Updates([("z", 4, -1)]),
        P([0], [3]),
        Updates([("y", 5, 1)]),
    ]
    got = collect(messages)
    assert got.updates[0] == ("z", 4, -1)
    assert sorted(got.updates[1:]) == [("x", 5, 1), ("y", 5, 1)]
    assert got.frontier == Antichain([10])


def test_duplicates_inside_one_message_count_once() -> None:
    got = collect([Updates([("x", 1, 1), ("x", 1, 1)]), P([0], [2], [(1, 1)])])
    assert got.updates == [("x", 1, 1)] and got.frontier == Antichain([2])


def test_frontier_waits_for_missing_updates_and_gaps() -> None:
    r = Reader()
    assert r.push(P([0], [5], [(2, 1)])) == [([], Antichain([2]))]
    assert r.push(P([7], [9])) == []  # a gap [5, 7): not grafted
    assert "missing at time 2" in (r.waiting_for() or "")
    assert r.push(Updates([("a", 2, 1)])) == [([("a", 2, 1)], Antichain([5]))]
    assert r.push(P([5], [7])) == [([], Antichain([9]))]


@pytest.mark.parametrize(
    ("messages", "rule"),
    [
        ([Updates([("x", 1, 0)])], "zero-diff"),
        ([Updates([("x", 1, 1), ("x", 1, -1)])], "conflicting-diff"),
        ([Updates([("x", 1, 1)]), Updates([("x", 1, 2)])], "conflicting-diff"),
        ([P([0], [5], [(5, 1)])], "count-outside"),
        ([P([2], [5], [(1, 1)])], "count-outside"),
        ([P([0], [5], [(1, -1)])], "negative-count"),
        ([P([0], [5], [(1, 1), (1, 1)])], "duplicate-count"),
        ([P([5], [2])], "inverted-interval"),
        # more distinct updates than counted: detected when the count arrives ...
        ([Updates([("x", 1, 1), ("y", 1, 1)]), P([0], [5], [(1, 1)])], "excess-updates"),
        # ... or when the extra update arrives after the count
        ([P([0], [5], [(1, 1), (3, 1)]), Updates([("x", 1, 1), ("y", 1, 1)])], "excess-updates"),
        # an update at a covered time that the statement did not list
        ([P([0], [5], [(3, 1)]), Updates([("x", 4, 1)])], "excess-updates"),
    ],
)
def test_violations_raise_in_strict_mode(messages: list, rule: str) -> None:
    with pytest.raises(ProtocolError) as info:
        collect(messages)
    assert info.value.rule == rule


def test_error_names_the_message_and_item() -> None:
    where = Location("log.jsonl", 12)
    with pytest.raises(ProtocolError) as info:
        Reader().push(Updates([("a", 1, 1), ("b", 1, 0)], origin=where))
    assert "log.jsonl, line 12, item 1" in str(info.value)
    assert "zero-diff" in str(info.value)


def test_lenient_sets_aside_and_loses_nothing_accepted() -> None:
    r = Reader(strict=False)
    good = Updates([("a", 1, 1)])
    bad = Updates([("b", 1, 1), ("a", 1, -1)])  # conflicting diff for "a": whole message out
    out = push_all(r, [good, bad, P([0], [2], [(1, 1)])])
    assert out == [([("a", 1, 1)], Antichain([2]))]
    assert [x.error.rule for x in r.rejected] == ["conflicting-diff"]
    assert r.rejected[0].message is bad


def test_lenient_rejects_a_statement_that_undercounts() -> None:
    r = Reader(strict=False)
    push_all(r, [Updates([("a", 1, 1), ("b", 1, 1)]), P([0], [2], [(1, 1)])])
    assert r.frontier == Antichain([0]) and r.rejected[0].error.rule == "excess-updates"
    assert push_all(r, [P([0], [2], [(1, 2)])])[0][1] == Antichain([2])


def test_state_is_empty_after_a_closed_stream() -> None:
    rng = seeded(3)
    history = random_history(rng, updates=300)
    log = mangle([write(history), write(history, batch_size=3, finish_every=2)], rng)
    r = Reader()
    push_all(r, log)
    assert r.is_closed and r.state_size() == 0
    r.push(log[0])  # late duplicates after the close change nothing
    assert r.state_size() == 0


def test_memory_is_bounded_by_what_is_unfinished() -> None:
    writer = Writer(batch_size=10)
    r = Reader()
    peak = 0
    for t in range(200):
        writer.extend((f"row{i}", t, 1) for i in range(10))
        for m in writer.finish_through(t):
            r.push(m)
            r.push(m)  # every message delivered twice
            peak = max(peak, r.state_size())
    assert r.frontier == Antichain([200])
    assert peak <= 12  # one time's updates and its count, never the whole history


def test_save_and_restore_resumes_exactly() -> None:
    rng = seeded(7)
    history = random_history(rng, updates=200)
    log = mangle([write(history)], rng)
    whole = collect(log)
    first = Reader()
    out = push_all(first, log[: len(log) // 2])
    state = orjson.loads(orjson.dumps(first.save(data_to_json=list)))
    second = Reader.restore(state, data_from_json=lambda d: type(history.changes[0][0])(
        tuple(tuple(x) for x in d)))
    out += push_all(second, log[len(log) // 2 :])
    assert [u for batch, _ in out for u in batch] == whole.updates
    assert second.frontier == whole.frontier


def test_reader_can_start_from_a_saved_frontier() -> None:
    messages = [P([0], [5], [(1, 1)]), Updates([("a", 1, 1)]), P([5], [9], [(6, 1)]),
                Updates([("b", 6, 1)])]
    got = collect(messages, since=Antichain([5]))
    assert got.updates == [("b", 6, 1)] and got.frontier == Antichain([9])


def test_pair_times_with_incomparable_frontier() -> None:
    r = Reader(Antichain([(0, 0)]))
    messages = [
        P([(0, 0)], [(0, 2), (2, 0)], [((0, 1), 1), ((1, 0), 1)]),
        Updates([("a", (0, 1), 1)]),
    ]
    push_all(r, messages)
    # (1, 0) still misses its update; (0, 1) is done, but (1, 0) holds the frontier.
    assert r.frontier == Antichain([(0, 2), (1, 0)])
    out = push_all(r, [Updates([("b", (1, 0), 1)])])
    assert out == [([("b", (1, 0), 1)], Antichain([(0, 2), (2, 0)]))]
    out = push_all(r, [P([(0, 2), (2, 0)], [], [((2, 2), 1)]), Updates([("c", (2, 2), 1)])])
    assert out[-1] == ([("c", (2, 2), 1)], Antichain())
