"""The two CDCv2 statements, as values.

`Updates` carries a batch of `(data, time, diff)` triples, each asserting that the multiplicity
of `data` changes at `time` by exactly `diff`. There is at most one triple per `(data, time)`
in the whole stream, and `diff` is never zero; a stream may repeat a triple any number of times.

`Progress` says how many distinct updates exist at each time of the interval `[lower, upper)`:
the times beyond some element of `lower` and beyond no element of `upper`. Times in the interval
that `counts` does not list have no updates. `upper = ()` means the interval reaches to the end
of time: the stream is closed once this statement is grafted on.

Both are statements about the *final* history, true whenever they are made, which is what lets
a reader accept them duplicated, reordered and re-batched.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from changelake.errors import Location
from changelake.protocol.antichain import Antichain
from changelake.protocol.time import Time

Data: TypeAlias = Hashable
Update: TypeAlias = tuple[Data, Time, int]


@dataclass(frozen=True, slots=True)
class Updates:
    """A batch of update statements."""

    updates: Sequence[Update]
    origin: Location | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress statement about the interval `[lower, upper)`."""

    lower: Antichain
    upper: Antichain
    counts: tuple[tuple[Time, int], ...] = ()
    origin: Location | None = field(default=None, compare=False)

    @classmethod
    def make(
        cls,
        lower: Iterable[Time],
        upper: Iterable[Time],
        counts: Iterable[tuple[Time, int]] = (),
        origin: Location | None = None,
    ) -> Progress:
        return cls(Antichain(lower), Antichain(upper), tuple(counts), origin)

    def contains(self, time: Time) -> bool:
        """Is `time` inside `[lower, upper)`?"""
        return self.lower.beyond(time) and not self.upper.beyond(time)


Message: TypeAlias = Updates | Progress
