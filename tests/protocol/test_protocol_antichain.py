"""Frontiers over integer and pair (product order) times."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from changelake.protocol import Antichain
from changelake.protocol.time import join, less_equal, meet

pairs = st.tuples(st.integers(0, 5), st.integers(0, 5))


def test_integer_frontier_is_one_element() -> None:
    f = Antichain([7, 3, 9])
    assert f.elements == (3,)
    assert f.beyond(3) and f.beyond(10) and not f.beyond(2)


def test_pair_frontier_keeps_incomparable_minima() -> None:
    f = Antichain([(1, 2), (2, 1), (2, 2), (3, 3)])
    assert f.elements == ((1, 2), (2, 1))
    assert f.beyond((1, 5)) and f.beyond((5, 1)) and not f.beyond((0, 9)) and not f.beyond((1, 1))


def test_empty_frontier_is_closed() -> None:
    closed = Antichain()
    assert closed.is_closed and not closed.beyond(0) and not closed.beyond((0, 0))
    assert closed.le(closed) and Antichain([5]).le(closed) and not closed.le(Antichain([5]))


def test_pair_join_and_meet() -> None:
    assert join((1, 4), (3, 2)) == (3, 4)
    assert meet((1, 4), (3, 2)) == (1, 2)
    a, b = Antichain([(0, 3)]), Antichain([(3, 0)])
    assert a.join(b) == Antichain([(3, 3)])
    assert a.meet(b) == Antichain([(0, 3), (3, 0)])


@given(st.lists(pairs, max_size=6), st.lists(pairs, max_size=6), pairs)
def test_join_and_meet_are_frontier_bounds(xs: list, ys: list, t: tuple) -> None:
    a, b = Antichain(xs), Antichain(ys)
    # t is beyond the meet iff beyond either; beyond the join iff beyond both.
    assert a.meet(b).beyond(t) == (a.beyond(t) or b.beyond(t))
    if a and b:
        assert a.join(b).beyond(t) == (a.beyond(t) and b.beyond(t))
    assert a.meet(b).le(a) and a.le(a.join(b))


@given(st.lists(pairs, max_size=8))
def test_antichain_elements_are_incomparable(xs: list) -> None:
    elements = Antichain(xs).elements
    for i, x in enumerate(elements):
        for y in elements[i + 1 :]:
            assert not less_equal(x, y) and not less_equal(y, x)
    for x in xs:
        assert Antichain(xs).beyond(x)


def test_as_frontier_takes_plain_values() -> None:
    from changelake.protocol.antichain import as_frontier

    assert as_frontier(4) == as_frontier([4]) == as_frontier(Antichain([4])) == Antichain([4])
    assert as_frontier([]) == Antichain()
    assert as_frontier((1, 2)) == Antichain([(1, 2)])
    assert as_frontier([(1, 2), (2, 1)]).elements == ((1, 2), (2, 1))
    for bad in (-1, [-1], "4", True, 4.0, None):
        with pytest.raises(ValueError):
            as_frontier(bad)  # type: ignore[arg-type]
