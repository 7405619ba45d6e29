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

from changelake.text import short

Time: TypeAlias = int | tuple[int, ...]


def less_equal(a: Time, b: Time) -> bool:
    """The partial order: ints as usual, tuples coordinate-wise."""
    if type(a) is int:
        return a <= b  # type: ignore[operator]
    return all(x <= y for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]


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


MAX_TIME = 2**63 - 1
"""Times travel as Avro longs: a time on the wire is an integer in `[0, MAX_TIME]`."""


def check_time(value: object) -> int:
    """Validate a time read from input (an integer, as on the wire); raises ValueError naming
    what is wrong. Pair times are for the protocol's own use, never read from input: a stream
    that mixed both kinds would have incomparable times."""
    if type(value) is int:
        if value < 0:
            raise ValueError(f"time {value} is negative")
        if value > MAX_TIME:
            raise ValueError(f"time {value} does not fit a 64-bit signed integer")
        return value
    raise ValueError(f"time must be a non-negative 64-bit integer, got {short(value)}")

