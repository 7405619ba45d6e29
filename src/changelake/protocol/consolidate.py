"""Consolidation: at most one diff per `(data, time)`, never zero.

CDCv2 requires consolidated updates, because a progress count is a count of *distinct*
`(data, time)` pairs: `(x, t, +1)` and `(x, t, -1)` must cancel before anything is written, and
two `(x, t, +1)` must become one `(x, t, +2)`.
"""

from __future__ import annotations

from collections.abc import Iterable

from changelake.protocol.messages import Data, Update
from changelake.protocol.time import Time


def consolidate(changes: Iterable[Update]) -> list[Update]:
    """Sum diffs per `(data, time)` and drop zeros; the result is sorted by time."""
    sums: dict[tuple[Data, Time], int] = {}
    for data, time, diff in changes:
        key = (data, time)
        sums[key] = sums.get(key, 0) + diff
    out = [(data, time, diff) for (data, time), diff in sums.items() if diff != 0]
    out.sort(key=lambda u: u[1])
    return out
