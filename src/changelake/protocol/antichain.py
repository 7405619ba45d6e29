"""Antichains: frontiers over partially ordered times.

A frontier is a set of mutually incomparable times (an antichain). It stands for the set of all
times greater than or equal to *some* element: the times "beyond" the frontier, which may still
change. Times not beyond it are finished. The empty antichain is beyond nothing: every time is
finished and the stream is closed. With integer times an antichain has at most one element and
`Antichain([t])` is simply "everything before t is done".

This mirrors timely dataflow's `Antichain` (differential-dataflow's `capture.rs` uses the same
vocabulary), restricted to what the CDCv2 reader and writer need.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeAlias

from changelake.protocol.time import Time, check_time, join, less_equal


def _minimal(times: Iterable[Time]) -> tuple[Time, ...]:
    """The minimal elements of `times`, deduplicated, sorted for a canonical form."""
    times = times if isinstance(times, list | tuple | set | frozenset) else list(times)
    if times and all(type(t) is int for t in times):
        return (min(times),)  # totally ordered: the least is the one minimal element
    elements: list[Time] = []
    for t in times:
        if any(less_equal(e, t) for e in elements):
            continue
        elements = [e for e in elements if not less_equal(t, e)]
        elements.append(t)
    return tuple(sorted(elements))


@dataclass(frozen=True, slots=True)
class Antichain:
    """An immutable antichain in canonical (minimal, sorted) form, so `==` is set equality."""

    elements: tuple[Time, ...] = ()

    def __init__(self, times: Iterable[Time] = ()) -> None:
        object.__setattr__(self, "elements", _minimal(times))

    @classmethod
    def of(cls, *times: Time) -> Antichain:
        return cls(times)

    def __iter__(self) -> Iterator[Time]:
        return iter(self.elements)

    def __len__(self) -> int:
        return len(self.elements)

    def __bool__(self) -> bool:
        return bool(self.elements)

    def __repr__(self) -> str:
        return f"Antichain({list(self.elements)!r})"

    @property
    def is_closed(self) -> bool:
        """The empty frontier: nothing remains open."""
        return not self.elements

    def beyond(self, time: Time) -> bool:
        """Is `time` at or beyond the frontier (i.e. not yet finished)?"""
        return any(less_equal(e, time) for e in self.elements)

    def le(self, other: Antichain) -> bool:
        """Frontier order: every time beyond `other` is also beyond `self`."""
        return all(self.beyond(t) for t in other.elements)

    def join(self, other: Antichain) -> Antichain:
        """The least frontier beyond both (the later of two frontiers)."""
        return Antichain(join(a, b) for a in self.elements for b in other.elements)

    def meet(self, other: Antichain) -> Antichain:
        """The greatest frontier not beyond either (the earlier of two frontiers)."""
        return Antichain((*self.elements, *other.elements))

    def to_json(self) -> list:
        return [list(t) if isinstance(t, tuple) else t for t in self.elements]

    @classmethod
    def from_json(cls, value: list) -> Antichain:
        return cls(tuple(t) if isinstance(t, list) else t for t in value)


FrontierLike: TypeAlias = "Antichain | Time | Iterable[Time]"
"""What a `since`, `lower` or `upper` argument takes: an `Antichain`, one time, or a list of
times (`[]`: closed). `as_frontier` turns it into an `Antichain`."""


def as_frontier(value: FrontierLike) -> Antichain:
    """A frontier from a plain Python value, for arguments such as `since`.

    An `Antichain` is returned as is; one time (an `int`, or a tuple for a product time) is
    the frontier `[time]`; any other iterable (`[4]`, `[]` for closed) lists the elements.
    Each time, or each coordinate of a product time, is checked as an input time is (a
    non-negative 64-bit integer): `ValueError` otherwise.
    """
    if isinstance(value, Antichain):
        return value
    if type(value) is int or isinstance(value, tuple):
        return Antichain([_checked(value)])
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError(f"not a frontier: {value!r} (an Antichain, a time or a list of times)")
    return Antichain(_checked(t) for t in value)


def _checked(time: object) -> Time:
    """An integer time, or a product time of integer coordinates, each one checked."""
    if isinstance(time, tuple):
        if len(time) < 2:
            raise ValueError(f"a product time has at least two coordinates, got {time!r}")
        return tuple(check_time(t) for t in time)
    return check_time(time)
