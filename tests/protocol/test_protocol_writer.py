"""The Writer: consolidated batches and exact progress statements."""

import pytest

from changelake.errors import ProtocolError
from changelake.protocol import Antichain, Progress, Updates, Writer, consolidate


def test_consolidate_sums_and_drops_zeros() -> None:
    assert consolidate([("a", 1, 1), ("a", 1, 1), ("b", 1, 1), ("b", 1, -1), ("a", 0, 3)]) == [
        ("a", 0, 3),
        ("a", 1, 2),
    ]


def test_writer_emits_consolidated_batches_and_exact_counts() -> None:
    w = Writer(batch_size=2)
    w.extend([("a", 1, 1), ("b", 1, 1), ("a", 1, 1), ("c", 2, 1), ("c", 2, -1), ("d", 5, 1)])
    messages = w.finish_through(3)
    updates = [u for m in messages if isinstance(m, Updates) for u in m.updates]
    assert sorted(updates) == [("a", 1, 2), ("b", 1, 1)]
    assert all(len(m.updates) <= 2 for m in messages if isinstance(m, Updates))
    assert messages[-1] == Progress.make([0], [4], [(1, 2)])
    closing = w.close()
    assert closing[-1] == Progress.make([4], [], [(5, 1)])


def test_writer_rejects_late_changes_and_regressions() -> None:
    w = Writer()
    w.finish_through(10)
    with pytest.raises(ProtocolError, match="late-change"):
        w.push("x", 10, 1)
    with pytest.raises(ProtocolError, match="frontier-regressed"):
        w.advance_to(Antichain([5]))
    assert w.advance_to(Antichain([11])) == []  # nothing new: nothing to say


def test_writer_with_pair_times() -> None:
    w = Writer(since=Antichain([(0, 0)]))
    w.extend([("a", (0, 1), 1), ("b", (1, 0), 1), ("c", (2, 2), 1)])
    messages = w.advance_to(Antichain([(0, 2), (2, 0)]))
    statement = messages[-1]
    assert isinstance(statement, Progress)
    assert dict(statement.counts) == {(0, 1): 1, (1, 0): 1}
