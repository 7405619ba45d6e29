"""The Reader's update rules as plain functions, each next to its Spark column twin.

The `Reader` applies these rules one delivery at a time, in its hot loop. The Spark decoder
(`changelake.spark.decoder`) sees a whole log at once and must state the same rules as column
expressions over the aggregate of every delivery of one `(data, time)`, or of one time. Each
rule is written here twice, side by side: a pure-Python function (the statement of the rule)
and its `*_column` twin that Spark evaluates. `tests/test_protocol_rules.py` checks every pair
on generated input, and the Python functions against the Reader itself.

pyspark is imported only inside the `*_column` functions: importing this module needs no Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from changelake.protocol.antichain import Antichain
from changelake.protocol.time import Time

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass(frozen=True, slots=True)
class Diffs:
    """What every delivery of one `(data, time)` said about its diff, summarized."""

    lo: int | None
    """The least non-zero diff delivered (None: no non-zero diff)."""
    hi: int | None
    """The greatest non-zero diff delivered."""
    zero: bool
    """Some delivery had diff 0."""


def summarize(diffs: Iterable[int]) -> Diffs:
    """The summary of the diffs delivered for one `(data, time)`: an aggregate, so it does
    not depend on delivery order or repetition."""
    given = list(diffs)
    nonzero = [d for d in given if d != 0]
    return Diffs(min(nonzero, default=None), max(nonzero, default=None), 0 in given)


def summarize_columns(diff: Column) -> list[Column]:
    """`summarize` as aggregate expressions (named `lo`, `hi`, `zero`) for a `groupBy`."""
    from pyspark.sql import functions as F

    nonzero = F.when(diff != 0, diff)
    return [
        F.min(nonzero).alias("lo"),
        F.max(nonzero).alias("hi"),
        F.max(diff == 0).alias("zero"),
    ]


def is_zero_diff(d: Diffs) -> bool:
    """Rule `zero-diff`: an update with diff 0 is an error."""
    return d.zero


def is_zero_diff_column(zero: Column) -> Column:
    return zero


def is_conflicting(d: Diffs) -> bool:
    """Rule `conflicting-diff`: one `(data, time)` delivered with two different non-zero
    diffs is an error (a zero diff is `zero-diff`'s business, not a conflict)."""
    return d.lo is not None and d.lo != d.hi


def is_conflicting_column(lo: Column, hi: Column) -> Column:
    return lo.isNotNull() & (lo != hi)


def settled_diff(d: Diffs) -> int | None:
    """The diff of a `(data, time)` whose non-zero deliveries all agree: one distinct update.
    None when there is none (all zero) or they conflict."""
    return d.lo if d.lo is not None and d.lo == d.hi else None


def is_settled_column(lo: Column, hi: Column) -> Column:
    """`settled_diff(d) is not None`; the diff itself is then `lo`."""
    return lo.isNotNull() & (lo == hi)


def is_excess(distinct: int, expected: int) -> bool:
    """Rule `excess-updates`: a covered time with more distinct updates than its statements
    counted is an error. `expected` is 0 for a covered time no statement lists."""
    return distinct > expected


def is_unfinished(distinct: int, expected: int) -> bool:
    """A covered time with fewer distinct updates than counted holds the frontier back."""
    return distinct < expected


def frontier(progress_frontier: Antichain, expected: Mapping[Time, int],
             distinct: Mapping[Time, int]) -> Antichain:
    """The Reader's frontier once every update is in: the progress frontier, held back by
    covered times still missing updates and by times with excess updates (lenient mode)."""
    held = [t for t, c in expected.items() if is_unfinished(distinct.get(t, 0), c)]
    held += [t for t, n in distinct.items() if is_excess(n, expected.get(t, 0))]
    return progress_frontier.meet(Antichain(held))


def is_beyond(frontier: Antichain, time: int) -> bool:
    """Is `time` at or beyond `frontier` (not yet finished)? Integer times only."""
    return frontier.beyond(time)


def is_beyond_column(frontier: Antichain, time: Column) -> Column:
    """`is_beyond` for an integer `time` column: a frontier over integers has at most one
    element `f`, and `time` is beyond it iff `f <= time`; nothing is beyond `[]`."""
    from pyspark.sql import functions as F

    if frontier.is_closed:
        return F.lit(False)
    (bound,) = frontier.elements
    if type(bound) is not int:
        raise TypeError(f"only integer times are supported on Spark, got {bound!r}")
    return time >= F.lit(bound)
