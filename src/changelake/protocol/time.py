"""Logical times and their partial order.

A time is either a non-negative `int` (totally ordered, what travels on the wire) or a tuple of
ints ordered as a *product*: `(a1, b1) <= (a2, b2)` iff `a1 <= a2` and `b1 <= b2`. Two pair times
may be incomparable, which is why frontiers are antichains (see `antichain.py`) and not single
times. Both kinds are lattices: any two times have a least upper bound (`join`) and a greatest
lower bound (`meet`), taken coordinate-wise for tuples.

Python's own `<` on tuples is lexicographic. That is *not* the partial order, but it is a linear
extension of it (if `a <= b` in the product order then `a <= b` lexicographically), so it is
the right key for sorting updates "in time order": no update is listed before one at a time
that is less than its own.
"""

from __future__ import annotations

from typing import TypeAlias

Time: TypeAlias = int | tuple[int, ...]


def less_equal(a: Time, b: Time) -> bool:
    """The partial order: ints as usual, tuples coordinate-wise."""
    if type(a) is int:
        return a <= b  # type: ignore[operator]
    return all(x <= y for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]


def less_than(a: Time, b: Time) -> bool:
    return a != b and less_equal(a, b)


def join(a: Time, b: Time) -> Time:
    """Least upper bound."""
    if type(a) is int:
        return a if a >= b else b  # type: ignore[operator,return-value]
    return tuple(x if x >= y else y for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]


def meet(a: Time, b: Time) -> Time:
    """Greatest lower bound."""
    if type(a) is int:
        return a if a <= b else b  # type: ignore[operator,return-value]
    return tuple(x if x <= y else y for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]


def minimum_like(t: Time) -> Time:
    """The least time of the same kind as `t` (0, or a tuple of zeros)."""
    return 0 if type(t) is int else tuple(0 for _ in t)  # type: ignore[union-attr]


def check_time(value: object) -> Time:
    """Validate a time read from input; raises ValueError naming what is wrong."""
    if type(value) is int:
        if value < 0:
            raise ValueError(f"time {value} is negative")
        return value
    if isinstance(value, tuple | list) and value and all(type(v) is int for v in value):
        if any(v < 0 for v in value):
            raise ValueError(f"time {list(value)} has a negative coordinate")
        return tuple(value)
    raise ValueError(f"time must be a non-negative integer, got {value!r}")
