"""The Reader's update rules as plain functions, each next to its Spark SQL twin.

The `Reader` applies these rules one delivery at a time, in its hot loop. The Spark decoder
(`changelake.spark.decoder`) sees a whole log at once and must state the same rules as
expressions over the aggregate of every delivery of one `(data, time)`, or of one time. Each
rule is written here twice, side by side: a pure-Python function (the statement of the rule)
and its `*_sql` twin, the same rule as Spark SQL text over named columns.
`tests/protocol/test_protocol_rules.py` checks every pair on generated input, and the Python
functions against the Reader itself.

The twins are SQL text, not `pyspark.sql.Column` objects, because every Column operation is a
round trip from the Python driver to the JVM (a few milliseconds each on a loaded machine):
the decoder states a whole query as one string, one call. This module imports no Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from changelake.protocol.antichain import Antichain
from changelake.protocol.time import Time


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


def summarize_sql(diff: str = "diff") -> str:
    """`summarize` as the aggregate expressions `lo`, `hi`, `zero` (comma-separated, for the
    select list of a `GROUP BY` query) over the long column `diff`."""
    nonzero = f"CASE WHEN {diff} != 0 THEN {diff} END"
    return f"min({nonzero}) AS lo, max({nonzero}) AS hi, max({diff} = 0) AS zero"


def is_zero_diff(d: Diffs) -> bool:
    """Rule `zero-diff`: an update with diff 0 is an error."""
    return d.zero


def is_zero_diff_sql(zero: str = "zero") -> str:
    return zero


def is_conflicting(d: Diffs) -> bool:
    """Rule `conflicting-diff`: one `(data, time)` delivered with two different non-zero
    diffs is an error (a zero diff is `zero-diff`'s business, not a conflict)."""
    return d.lo is not None and d.lo != d.hi


def is_conflicting_sql(lo: str = "lo", hi: str = "hi") -> str:
    return f"({lo} IS NOT NULL AND {lo} != {hi})"


def settled_diff(d: Diffs) -> int | None:
    """The diff of a `(data, time)` whose non-zero deliveries all agree: one distinct update.
    None when there is none (all zero) or they conflict."""
    return d.lo if d.lo is not None and d.lo == d.hi else None


def is_settled_sql(lo: str = "lo", hi: str = "hi") -> str:
    """`settled_diff(d) is not None`; the diff itself is then `lo`."""
    return f"({lo} IS NOT NULL AND {lo} = {hi})"


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


def is_beyond_sql(frontier: Antichain, time: str = "time") -> str:
    """`is_beyond` for an integer `time` column: a frontier over integers has at most one
    element `f`, and `time` is beyond it iff `f <= time`; nothing is beyond `[]`."""
    if frontier.is_closed:
        return "false"
    (bound,) = frontier.elements
    if type(bound) is not int:
        raise TypeError(f"only integer times are supported on Spark, got {bound!r}")
    return f"({time} >= {bound})"
