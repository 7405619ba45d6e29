"""Committed transactions out of a pgoutput message stream, whatever way they arrived.

The promise: `Assembler.push` takes every decoded message in stream order and hands back each
transaction when, and only when, it committed: its commit LSN (the CDCv2 time of all its
changes), the LSN just past its commit record (where a restart resumes), and its row changes
in the order the server made them. Aborted streamed transactions and aborted subtransactions
leave nothing behind.

Two shapes arrive:

* An ordinary transaction is `Begin`, changes, `Commit`, back to back: the server sends it
  only once it has committed, and nothing else interleaves with it.
* A streamed transaction (larger than the server's `logical_decoding_work_mem`) arrives in
  blocks between `StreamStart` and `StreamStop`, interleaved with ordinary transactions and
  other streamed ones, and ends with `StreamCommit` or `StreamAbort`. Its changes carry the id
  of the (sub)transaction that made them. A `StreamAbort` of a subtransaction discards its
  changes and everything the transaction recorded after the first of them: the server writes a
  subtransaction's changes, and its children's, after its start, and a later sibling can only
  start after the rollback that aborts it, so the tail is exactly what was rolled back (the
  rule PostgreSQL's own apply worker uses).

Neither shape is held in memory whole: a transaction's changes go to a `Spool`, which keeps
its first changes in a list and writes the rest to a temporary file, and reads them back in
order when the transaction commits. What is kept in memory is bounded in bytes, not changes,
and once for every spool together (`Budget`, `memory_limit` bytes: the open transactions,
however many are streamed at once, and the committed ones the caller has not yet read): a
change is kept while the budget has room for its size (`change_size`, its values' bytes and
a fixed cost per value), and from the first that does not fit, the spool's changes go to its
file. A spool gives its bytes back when it is closed (read with `changes()`, aborted). The
caller gets a `Transaction` whose `changes()` may be iterated once (`release=False`: again).

`Relation` and `Type` messages are not changes: relations are kept by OID (the latest
description wins, as the server sends a new one whenever a table's definition changed) and
each change is returned with the relation it was made under.
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from changelake.capture.postgres import pgoutput as po
from changelake.capture.postgres.pgoutput import PgOutputError, format_lsn


@dataclass(frozen=True, slots=True)
class RowChange:
    """One change to one table, with the table's description it was made under."""

    relation: po.Relation
    kind: str  # insert, update, delete, truncate, message
    old: po.Row | None = None
    old_is_key: bool = False
    new: po.Row | None = None
    truncated: tuple[po.Relation, ...] = ()  # for a truncate: every table it emptied
    message: po.Message | None = None


#: The bytes of changes an `Assembler`'s spools keep in memory together, by default.
MEMORY_BYTES = 64 << 20
#: What a change costs in memory besides its values' bytes (`change_size`): the objects.
CHANGE_BYTES = 200
VALUE_BYTES = 60


def change_size(change: RowChange) -> int:
    """The bytes a change holds in memory, estimated: its values' lengths and a fixed cost
    per value and per change (the Python objects that hold them)."""
    size = CHANGE_BYTES
    for row in (change.old, change.new):
        if row is not None:
            size += sum(VALUE_BYTES + (len(v) if isinstance(v, (str, bytes)) else 0)
                        for v in row)
    if change.message is not None:
        size += len(change.message.content)
    return size + VALUE_BYTES * len(change.truncated)


class Budget:
    """The bytes of changes that spools sharing it keep in memory, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0  # the most ever used

    def take(self, size: int) -> bool:
        """Reserve `size` bytes if there is room for them."""
        if self.used + size > self.limit:
            return False
        self.used += size
        self.peak = max(self.peak, self.used)
        return True

    def give(self, size: int) -> None:
        self.used -= size


class Spool:
    """A transaction's changes in order: a list while `budget` has room for them, a temporary
    file after (see the module docstring). `memory_limit`: a budget of its own, in bytes."""

    def __init__(self, memory_limit: int = MEMORY_BYTES, budget: Budget | None = None) -> None:
        self.budget = budget if budget is not None else Budget(memory_limit)
        self.head: list[RowChange] = []
        self.sizes: list[int] = []  # each kept change's bytes, given back as it goes
        self.file: IO[bytes] | None = None
        self.spilled = 0  # changes in the file
        self.bytes = 0  # every change's, kept or in the file

    def __len__(self) -> int:
        return len(self.head) + self.spilled

    def append(self, change: RowChange) -> None:
        size = change_size(change)
        self.bytes += size
        if self.file is None and self.budget.take(size):  # once in the file, all after are
            self.head.append(change)
            self.sizes.append(size)
            return
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="changelake-tx-")  # noqa: SIM115 (closed by close())
        pickle.dump(change, self.file, protocol=pickle.HIGHEST_PROTOCOL)
        self.spilled += 1

    def truncate(self, length: int) -> None:
        """Keep only the first `length` changes."""
        if length >= len(self):
            return
        if length <= len(self.head):
            dropped = sum(self.sizes[length:])
            self.budget.give(dropped)
            del self.head[length:], self.sizes[length:]
            self._close_file()
            self.bytes = sum(self.sizes)
            return
        assert self.file is not None
        keep = length - len(self.head)
        self.file.seek(0)
        kept = 0
        for _ in range(keep):
            kept += change_size(pickle.load(self.file))
        self.file.truncate()
        self.spilled = keep
        self.bytes = sum(self.sizes) + kept

    def __iter__(self) -> Iterator[RowChange]:
        yield from self.head
        if self.file is not None:
            self.file.seek(0)
            for _ in range(self.spilled):
                yield pickle.load(self.file)

    def close(self) -> None:
        """Drop the changes: the file, and the kept ones' bytes back to the budget."""
        self._close_file()
        self.budget.give(sum(self.sizes))
        self.head, self.sizes = [], []

    def _close_file(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        self.spilled = 0


@dataclass
class Transaction:
    xid: int
    commit_lsn: int  # the CDCv2 time of every change in it
    end_lsn: int  # where the stream resumes after it
    commit_time: int  # microseconds since 2000-01-01 UTC
    origin: str | None
    spool: Spool = field(repr=False)
    streamed: bool = False

    def __len__(self) -> int:
        return len(self.spool)

    @property
    def bytes(self) -> int:
        """Its changes' size in memory, estimated (`change_size`), kept or spilled."""
        return self.spool.bytes

    def changes(self, *, release: bool = True) -> Iterator[RowChange]:
        """The changes in the order they were made; releases the spool when done, unless
        asked not to (a first pass that looks ahead)."""
        try:
            yield from self.spool
        finally:
            if release:
                self.spool.close()


@dataclass
class _Open:
    xid: int
    spool: Spool
    origin: str | None = None
    first_of: dict[int, int] = field(default_factory=dict)  # subxid -> index of its 1st change


class Assembler:
    """See the module docstring. `push` returns the transaction a message completes, if any;
    a message that breaks the stream's shape raises `PgOutputError` naming it."""

    def __init__(self, memory_limit: int = MEMORY_BYTES) -> None:
        self.memory_limit = memory_limit
        #: Shared by every spool it makes: the bytes kept in memory for all of them.
        self.budget = Budget(memory_limit)
        self.relations: dict[int, po.Relation] = {}
        self.current: _Open | None = None  # the ordinary transaction being received
        self.streamed: dict[int, _Open] = {}  # open streamed transactions by top-level xid
        self.block: int | None = None  # the streamed transaction whose block is open
        self.messages: list[po.Message] = []  # non-transactional messages since last asked

    def push(self, message: po.PgOutputMessage, lsn: int | None = None) -> Transaction | None:
        where = f"WAL {format_lsn(lsn)}" if lsn is not None else "pgoutput stream"
        match message:
            case po.Begin(xid=xid):
                if self.current is not None or self.block is not None:
                    raise PgOutputError(f"{where}: Begin inside another transaction")
                self.current = _Open(xid, Spool(budget=self.budget))
            case po.Commit():
                if self.current is None:
                    raise PgOutputError(f"{where}: Commit without a Begin")
                done, self.current = self.current, None
                return Transaction(done.xid, message.commit_lsn, message.end_lsn,
                                   message.commit_time, done.origin, done.spool)
            case po.Origin(name=name):
                if self.current is None:
                    raise PgOutputError(f"{where}: Origin outside a transaction")
                self.current.origin = name
            case po.Relation():
                self.relations[message.oid] = message
            case po.Type():
                pass
            case po.StreamStart(xid=xid, first=first):
                if self.current is not None:
                    raise PgOutputError(f"{where}: Stream Start inside a transaction")
                if first or xid not in self.streamed:
                    if xid in self.streamed:
                        raise PgOutputError(f"{where}: transaction {xid} streamed twice")
                    self.streamed[xid] = _Open(xid, Spool(budget=self.budget))
                self.block = xid
            case po.StreamStop():
                self.block = None
            case po.StreamCommit(xid=xid):
                done = self._streamed(xid, where)
                del self.streamed[xid]
                return Transaction(xid, message.commit_lsn, message.end_lsn,
                                   message.commit_time, done.origin, done.spool, streamed=True)
            case po.StreamAbort(xid=xid, subxid=subxid):
                done = self._streamed(xid, where)
                if subxid == xid:
                    done.spool.close()
                    del self.streamed[xid]
                elif subxid in done.first_of:
                    start = done.first_of[subxid]
                    done.spool.truncate(start)
                    done.first_of = {s: i for s, i in done.first_of.items() if i < start}
            case po.Message(transactional=False):
                self.messages.append(message)
            case _:
                self._change(message, where)
        return None

    def _streamed(self, xid: int, where: str) -> _Open:
        if xid not in self.streamed:
            raise PgOutputError(f"{where}: streamed transaction {xid} was never started")
        return self.streamed[xid]

    def _change(self, message: Any, where: str) -> None:
        if self.block is not None:
            target = self.streamed[self.block]
            target.first_of.setdefault(message.xid, len(target.spool))
        elif self.current is not None:
            target = self.current
        else:
            raise PgOutputError(f"{where}: {type(message).__name__} outside a transaction")
        target.spool.append(self._row_change(message, where))

    def _relation(self, oid: int, where: str) -> po.Relation:
        if oid not in self.relations:
            raise PgOutputError(f"{where}: change to relation {oid} before its Relation message")
        return self.relations[oid]

    def _row_change(self, message: Any, where: str) -> RowChange:
        match message:
            case po.Insert(relation=oid, new=new):
                return RowChange(self._relation(oid, where), "insert", new=new)
            case po.Update(relation=oid):
                return RowChange(self._relation(oid, where), "update", message.old,
                                 message.old_is_key, message.new)
            case po.Delete(relation=oid):
                return RowChange(self._relation(oid, where), "delete", message.old,
                                 message.old_is_key)
            case po.Truncate(relations=oids):
                tables = tuple(self._relation(o, where) for o in oids)
                return RowChange(tables[0], "truncate", truncated=tables)
            case po.Message():
                return RowChange(_NO_RELATION, "message", message=message)
        raise PgOutputError(f"{where}: unexpected {type(message).__name__}")


_NO_RELATION = po.Relation(None, 0, "", "", "n", ())
