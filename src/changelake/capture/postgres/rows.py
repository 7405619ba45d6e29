"""A committed transaction's row changes as CDCv2 updates, one table's rows keyed by its key.

The promise: `Tables.updates(tx)` gives, for every table the transaction touched, the
consolidated updates `(row, diff)` at the transaction's time (its commit LSN) that take the
table's current rows to the rows the transaction left, and applies them to the current rows it
keeps. Applying the same transaction twice is refused by the caller (times only increase), so
this module never sees a replay.

pgoutput says less than the updates need, and the current rows fill the gaps:

* With `REPLICA IDENTITY DEFAULT` (or `USING INDEX`) an update carries no old row unless its
  key changed, and then only the key; a delete carries only the key. The row to retract is the
  current row of that key.
* A TOASTed column an update did not touch arrives as `UNCHANGED`: its value is the current
  row's (or the old row's, with `REPLICA IDENTITY FULL`).
* A truncate retracts every current row of each table it names.

So the current rows are the state of the capture. `Tables` keeps the rows it has seen, keyed by
the replica-identity columns (the primary key, or the whole row with `FULL` and no key), and
asks a `Fetch` for the rest before a batch of transactions is applied (`prefetch`): the keys
the batch updates or deletes. Rows come from wherever the capture's output keeps them (the lake
table's current rows, or the log's: `Sink.fetch`), so memory here follows the batch, not the
table; `forget` drops what is cached once it is durable there.

A truncate is the one change whose updates follow the table, not the batch: with a `fetch`,
its rows are never asked for. The first truncate of a table in a batch (since `forget`) is
recorded in `emptied` (table -> the transaction's commit LSN) and the transaction's updates
before it are dropped: the output retracts, at that time, its own committed rows (the state
the batch started from, where it keeps them: a Spark job for a lake table) and the batch's
earlier updates of the table (`capture.Capture`, which holds them). From there the table's
every current row is known here (none, then the batch's own), so a later truncate in the
batch retracts them here, as without a `fetch`.

Changes of tables the capture leaves out (`captured`: a publication's other tables,
`--tables`) are skipped unread. A table with no key and no full identity is refused by name
when its `Relation` arrives: its updates and deletes could not be applied. A change whose key
has no current row where one is needed (an update without the old row, a delete) is an error
naming the table and key: the capture started from a state that is not the table's (a missed
snapshot).

A table's columns may change (ALTER TABLE): each change is read in the shape of the relation
it carries, and the current rows and the transaction's updates so far take a new shape at the
change that brings it (`shapes`, `reshape`), after `check_change` (the output's rule) let it
through; `prefetch` follows the shapes too, so a change the output refuses is refused before
any of the batch is applied, and fetches rows in the shape `updates` will find them in.

Rows are Python tuples, compared as Python compares them, and `-0.0 == 0.0`: a row holding
`-0` (a real, a double; PostgreSQL prints it so) is kept and written with its sign, but an
UPDATE that changes nothing but a zero's sign (`0` to `-0` or back, every other column the
same) makes a retraction and an insertion of one row, which consolidate to nothing: the
capture's output keeps the zero it had. Telling them apart would need rows whose equality is
not Python's (a float type of its own, through every writer and reader of rows), so it is a
limit of this version, (`tests/capture/test_capture_pg_lake.py` pins it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from changelake.capture.postgres import pgoutput as po
from changelake.capture.postgres.transactions import RowChange, Transaction
from changelake.capture.postgres.types import (
    RELATION_OID,
    Lookup,
    PgType,
    PgValueError,
    relation_args,
    resolve,
)
from changelake.errors import InputError, SchemaError

Key = tuple[Any, ...]
Values = tuple[Any, ...]
#: The current rows of `keys` of a table, typed, in column order (never all of its rows: a
#: truncate's are retracted by the output, see `Tables.emptied`).
Fetch = Callable[["Table", "set[Key]"], Iterable[Values]]
#: Refuses (raises) a change of a table's columns its output cannot follow: (old, new).
CheckChange = Callable[["Table", "Table"], None]


class CaptureError(InputError):
    """A change the capture cannot apply: names the table, the key or column, and the rule."""


@dataclass(frozen=True, slots=True)
class Table:
    """A captured table as its latest `Relation` describes it."""

    schema: str
    name: str
    columns: tuple[str, ...]
    types: tuple[PgType, ...]
    key: tuple[int, ...]  # positions of the replica-identity columns

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(self.columns[i] for i in self.key)

    @property
    def shape(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
        """What its rows' layout depends on: column names, types (as PostgreSQL spells them:
        `PgType` compares its reader too), key positions."""
        return self.columns, tuple(t.name for t in self.types), self.key

    def describe(self) -> str:
        return "(" + ", ".join(f"{c} {t.name}" for c, t in
                               zip(self.columns, self.types, strict=True)) + ")"

    @classmethod
    def from_catalog(cls, cursor: Any, qualified: str, lookup: Lookup) -> Table:
        """The table as `pg_attribute` describes it now, with the key pgoutput would mark:
        the replica identity index's columns (the primary key by default), or every column
        with `REPLICA IDENTITY FULL` and no such index."""
        cursor.execute(
            "SELECT a.attname, a.atttypid, a.atttypmod, coalesce(a.attnum = ANY(i.indkey), "
            "false), c.relreplident FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
            "LEFT JOIN pg_index i ON i.indrelid = c.oid AND CASE c.relreplident WHEN 'i' THEN "
            "i.indisreplident WHEN 'd' THEN i.indisprimary AND i.indimmediate ELSE false END "
            f"WHERE c.oid = {RELATION_OID} AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum", relation_args(qualified))
        rows = cursor.fetchall()
        schema, name = qualified.split(".", 1)
        columns = tuple(po.Column(r[0], int(r[1]), int(r[2]), bool(r[3])) for r in rows)
        identity = rows[0][4] if rows else "d"
        return cls.from_relation(po.Relation(None, 0, schema, name, identity, columns), lookup)

    @classmethod
    def from_relation(cls, relation: po.Relation, lookup: Lookup) -> Table:
        name = f"{relation.namespace or 'pg_catalog'}.{relation.name}"
        key = tuple(i for i, c in enumerate(relation.columns) if c.key)
        if not key:
            if relation.replica_identity != "f":
                raise SchemaError(f"table {name} has no primary key or replica identity: its "
                                  "updates and deletes cannot be captured (add a primary key, "
                                  "or ALTER TABLE ... REPLICA IDENTITY FULL)")
            key = tuple(range(len(relation.columns)))
        types = []
        for c in relation.columns:
            try:
                types.append(resolve(c.type_oid, c.type_modifier, lookup))
            except SchemaError as e:
                raise SchemaError(f"table {name}, column {c.name}: {e.reason}") from None
        return cls(relation.namespace or "pg_catalog", relation.name,
                   tuple(c.name for c in relation.columns), tuple(types), key)


class Tables:
    """The captured tables' current rows, and the rule that turns changes into updates."""

    def __init__(self, lookup: Lookup, fetch: Fetch | None = None,
                 captured: Iterable[str] | None = None,
                 check_change: CheckChange | None = None) -> None:
        self.lookup = lookup
        self.fetch = fetch
        #: Only these tables' changes are applied (None: all): a publication may hold tables
        #: the capture leaves out (`--tables`), whose changes still arrive.
        self.captured = None if captured is None else frozenset(captured)
        self.rows: dict[str, dict[Key, Values]] = {}
        self.complete: set[str] = set()  # tables whose every current row is in `rows`
        #: Per table, the time its output is already durable through: changes of earlier
        #: transactions are in its rows already and are skipped (a restart after a crash that
        #: committed some tables of a batch and not others).
        self.floor: dict[str, int] = {}
        self.looked: dict[str, set[Key]] = {}  # keys asked of `fetch` (found or not)
        #: Per table, the commit LSN of its first truncate since `forget`, whose updates are
        #: not all here: the output's committed rows are retracted there (module docstring).
        self.emptied: dict[str, int] = {}
        #: Per table, the shape its current rows (in `rows`, and in the updates `updates`
        #: returns) have: the one of the last change applied. It moves only forward, change
        #: by change, so a batch with transactions from before and after an ALTER TABLE
        #: re-shapes each row once, at the change that brings the new shape.
        self.shapes: dict[str, Table] = {}
        #: Called with (old, new) at a change of a table's shape, before any row takes it.
        self.check_change = check_change
        self._defined: dict[po.Relation, Table] = {}
        self._last: tuple[po.Relation | None, Table | None] = (None, None)

    def table(self, relation: po.Relation) -> Table:
        """The table as `relation` describes it (each change carries the relation that was
        current when it was made: a batch may hold several of one table)."""
        if relation is self._last[0]:  # a transaction's changes share their relation
            return self._last[1]
        definition = replace(relation, xid=None)  # one per definition, not per transaction
        known = self._defined.get(definition)
        if known is None:
            known = self._defined[definition] = Table.from_relation(relation, self.lookup)
        self._last = (relation, known)
        return known

    def _advance(self, table: Table, pending: Counter[Values] | None = None) -> None:
        """Make `table` the shape of its current rows and of the transaction's `pending`
        updates, re-shaping them if it changed (a column added, dropped, renamed, retyped)."""
        name = table.qualified
        old = self.shapes.get(name)
        if old is not None and old is not table and old.shape != table.shape:
            if self.check_change is not None:
                self.check_change(old, table)
            self.rows[name] = {self._key(table, new): new for new in
                               (reshape(old, table, row) for row in self.rows.get(name, {})
                                .values())}
            if pending:
                moved = Counter({reshape(old, table, row): d for row, d in pending.items()})
                pending.clear()
                pending.update(moved)
        self.shapes[name] = table
        self.rows.setdefault(name, {})

    def load(self, table: Table, rows: Iterable[Values]) -> None:
        """Current rows read elsewhere (a snapshot, the lake): typed values in column order,
        in `table`'s shape (kept in the shape the table's rows have here)."""
        target = self.shapes.setdefault(table.qualified, table)
        current = self.rows.setdefault(table.qualified, {})
        for row in rows:
            values = reshape(table, target, tuple(row))
            current[self._key(target, values)] = values

    def prefetch(self, transactions: Sequence[Transaction]) -> None:
        """Ask `fetch`, once per table, for the current rows the transactions will need."""
        if self.fetch is None:
            return
        wanted: dict[str, tuple[Table, set[Key]]] = {}
        shapes = dict(self.shapes)  # followed here, not applied: `updates` applies them
        first: dict[str, Table] = {}  # each table's first shape in the batch
        emptied = set(self.emptied)  # from a truncate on, a table's rows are all here
        for tx in transactions:
            for change in tx.changes(release=False):
                for relation in (change.truncated or (change.relation,)):
                    if change.kind == "message":
                        continue
                    if not self._captures(relation):
                        continue
                    table = self.table(relation)
                    name = table.qualified
                    if tx.commit_lsn < self.floor.get(name, 0):
                        continue
                    self._follow(shapes, table)
                    first.setdefault(name, table)
                    if name in self.complete or name in emptied:
                        continue
                    if change.kind == "truncate":
                        emptied.add(name)  # its rows are retracted by the output, not read
                        continue
                    if change.kind == "insert":
                        continue
                    image = change.old if change.old is not None else change.new
                    key = self._key(table, self._typed(table, image))
                    if key in self.rows.get(name, {}) or key in self.looked.get(name, ()):
                        continue
                    wanted.setdefault(name, (table, set()))[1].add(key)
        for name, (_, keys) in wanted.items():
            # In the shape `updates` will find them in: the rows' now, else the batch's first.
            table = self.shapes.get(name, first[name])
            self.load(table, self.fetch(table, keys))
            self.looked.setdefault(name, set()).update(keys)

    def _follow(self, shapes: dict[str, Table], table: Table) -> None:
        """Check a change of shape when the batch is first read, so a refused one is refused
        before any of the batch is applied or written."""
        old = shapes.get(table.qualified)
        if old is not None and old is not table and old.shape != table.shape \
                and self.check_change is not None:
            self.check_change(old, table)
        shapes[table.qualified] = table

    def forget(self) -> None:
        """Drop the cached rows: they are durable where `fetch` reads them."""
        if self.fetch is None:
            return
        for name in self.rows:
            self.rows[name] = {}
        self.complete.clear()
        self.looked.clear()
        self.emptied.clear()

    def updates(self, tx: Transaction) -> dict[str, Counter[Values]]:
        """The transaction's consolidated updates by table (row -> diff, no zero diffs)."""
        out: dict[str, Counter[Values]] = {}
        for change in tx.changes():
            if change.kind == "message":
                continue
            if change.kind == "truncate":
                for relation in change.truncated:
                    if not self._captures(relation):
                        continue
                    table = self.table(relation)
                    if tx.commit_lsn < self.floor.get(table.qualified, 0):
                        continue
                    diffs = out.setdefault(table.qualified, Counter())
                    self._advance(table, diffs)
                    if self.fetch is not None and table.qualified not in self.complete:
                        # Not all its rows are here: the output retracts its own and the
                        # batch's earlier ones at this time (`emptied`), so the updates before
                        # it in this transaction are gone with them.
                        self.emptied[table.qualified] = tx.commit_lsn
                        diffs.clear()
                    else:
                        for row in self.rows[table.qualified].values():
                            diffs[row] -= 1
                    self.rows[table.qualified] = {}
                    self.complete.add(table.qualified)
                continue
            if not self._captures(change.relation):
                continue
            table = self.table(change.relation)
            if tx.commit_lsn < self.floor.get(table.qualified, 0):
                continue
            diffs = out.setdefault(table.qualified, Counter())
            self._advance(table, diffs)
            self._apply(table, change, diffs)
        return {name: Counter({r: d for r, d in diffs.items() if d})
                for name, diffs in out.items()}

    def _captures(self, relation: po.Relation) -> bool:
        return self.captured is None or \
            f"{relation.namespace or 'pg_catalog'}.{relation.name}" in self.captured

    # -- one change ----------------------------------------------------------------------------

    def _apply(self, table: Table, change: RowChange, diffs: Counter[Values]) -> None:
        current = self.rows[table.qualified]
        old = self._typed(table, change.old) if change.old is not None else None
        if change.kind == "insert":
            new = self._typed(table, change.new)
            key = self._key(table, new)
            if key in current:
                raise CaptureError(f"table {table.qualified}: insert of key "
                                   f"{self._show(table, key)}, which already has a row (a "
                                   "table without a key holds two identical rows, or the "
                                   "capture's state is not the table's)")
            current[key] = self._filled(table, new, None)
            diffs[current[key]] += 1
            return
        key = self._key(table, old if old is not None else self._typed(table, change.new))
        previous = current.get(key)
        if previous is None and (old is None or change.old_is_key):
            raise CaptureError(f"table {table.qualified}: {change.kind} of key "
                               f"{self._show(table, key)}, which has no current row (the "
                               "capture's state is not the table's: was the snapshot skipped?)")
        if previous is not None:
            diffs[previous] -= 1
            del current[key]
        elif old is not None:
            previous = old  # FULL identity: the old row is the whole row
        if change.kind == "update":
            base = previous if previous is not None else old
            new = self._filled(table, self._typed(table, change.new), base)
            current[self._key(table, new)] = new
            diffs[new] += 1

    def _typed(self, table: Table, row: po.Row | None) -> tuple[Any, ...]:
        assert row is not None
        out = []
        for name, kind, value in zip(table.columns, table.types, row, strict=True):
            if value is None or value is po.UNCHANGED:
                out.append(value)
                continue
            try:
                out.append(kind.read(value))  # type: ignore[arg-type]
            except (PgValueError, ValueError) as e:
                raise CaptureError(f"table {table.qualified}, column {name} ({kind.name}): "
                                   f"{e}") from None
        return tuple(out)

    def _filled(self, table: Table, row: tuple[Any, ...], base: Values | None) -> Values:
        """`UNCHANGED` columns take the base row's value."""
        if po.UNCHANGED not in row:
            return row
        if base is None:
            missing = [c for c, v in zip(table.columns, row, strict=True) if v is po.UNCHANGED]
            raise CaptureError(f"table {table.qualified}: unchanged TOAST columns {missing} "
                               "with no current row to take them from")
        return tuple(b if v is po.UNCHANGED else v for v, b in zip(row, base, strict=True))

    @staticmethod
    def _key(table: Table, row: tuple[Any, ...]) -> Key:
        return tuple(row[i] for i in table.key)

    @staticmethod
    def _show(table: Table, key: Key) -> str:
        names = [table.columns[i] for i in table.key]
        return "(" + ", ".join(f"{n}={v!r}" for n, v in zip(names, key, strict=True)) + ")"

    def current(self, table: str) -> Mapping[Key, Values]:
        return self.rows.get(table, {})

    def __iter__(self) -> Iterator[Table]:
        return iter(self.shapes.values())


def reshape(old: Table, new: Table, row: Values) -> Values:
    """A row of `old`'s shape in `new`'s, column by name: an added column is null (what
    PostgreSQL says of the rows it had when ADD COLUMN has no default), a dropped one is
    gone. (A rename reads as a drop and an add: pgoutput's relation names the columns only,
    so a sink that cannot follow that refuses it, `CheckChange`.)"""
    if old.columns == new.columns:
        return row
    at = {c: i for i, c in enumerate(old.columns)}
    return tuple(row[at[c]] if c in at else None for c in new.columns)
