"""SCD type 2 history of a keyed table: one row per version of a key, with `valid_from` and
`valid_to` (null while the version is current), as `create_auto_cdc_flow(stored_as_scd_type=2)`
would keep it.

The history follows from the diffs: every insertion of a key's row starts a version at its time,
and the key's next update (a new row, or a retraction alone: a delete) ends it. It is computed
from the updates the table retains, so its resolution is the table's: versions from `since` on
are exact, while compaction folds what came before into the state at `since` (a version that
began earlier shows the time of the compaction that folded it as `valid_from`, and a version
that both began and ended before a compaction is gone). Keep `since` back (compact with
`--since`) for as much exact history as is needed.

With `scd2=True` at creation, the table also has a view `NAME_history` over this, replaced
after each of the table's commits (its own single metastore call, so it can trail the table by
one commit if a process dies between the two; the next commit catches up). This module is the
SQL only; `commit.py` replaces the view, and `Table.history` reads it for any keyed table.
"""

from __future__ import annotations

from pathlib import Path

from changelake.errors import LakeError
from changelake.lake.layout import TableState
from changelake.lake.schema import logical_schema
from changelake.lake.sql import quote, union_sql


def scd2_sql(state: TableState, table_dir: Path) -> str:
    """The SCD type 2 history of the committed `state` as one SELECT."""
    if not state.keyed:
        raise LakeError(f"table {state.name} has no key: SCD type 2 history needs one")
    logical = logical_schema(state.versions)
    key = [quote(k) for k in state.key]
    cols = ", ".join(f"u.{quote(n)}" for n in logical.fieldNames())
    on = " AND ".join(f"u.{k} <=> n.{k}" for k in key)
    return (
        f"WITH u AS (\n{union_sql(state, table_dir, logical=logical)}\n), "
        f"t AS (SELECT DISTINCT {', '.join(key)}, _time FROM u), "
        f"n AS (SELECT {', '.join(key)}, _time, lead(_time) OVER (PARTITION BY "
        f"{', '.join(key)} ORDER BY _time) AS _next FROM t) "
        f"SELECT /* changelake history version={state.version} */ "
        f"{cols}, u._time AS valid_from, n._next AS valid_to "
        f"FROM u JOIN n ON {on} AND u._time = n._time WHERE u._diff > 0"
    )
