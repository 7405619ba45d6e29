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
the first `memory_limit` changes in a list and writes the rest to a temporary file, and reads
them back in order when the transaction commits. The caller gets a `Transaction` whose
`changes()` may be iterated once.

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


class Spool:
    """A transaction's changes in order: a list up to `memory_limit`, a temporary file after."""

    def __init__(self, memory_limit: int) -> None:
        self.memory_limit = memory_limit
        self.head: list[RowChange] = []
        self.file: IO[bytes] | None = None
        self.spilled = 0  # changes in the file

    def __len__(self) -> int:
        return len(self.head) + self.spilled

    def append(self, change: RowChange) -> None:
        if len(self.head) < self.memory_limit:
            self.head.append(change)
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
            del self.head[length:]
            self.close()
            return
        assert self.file is not None
        keep = length - len(self.head)
        self.file.seek(0)
        for _ in range(keep):
            pickle.load(self.file)
        self.file.truncate()
        self.spilled = keep

    def __iter__(self) -> Iterator[RowChange]:
        yield from self.head
        if self.file is not None:
            self.file.seek(0)
            for _ in range(self.spilled):
                yield pickle.load(self.file)

    def close(self) -> None:
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

    def __init__(self, memory_limit: int = 10_000) -> None:
        self.memory_limit = memory_limit
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
                self.current = _Open(xid, Spool(self.memory_limit))
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
                    self.streamed[xid] = _Open(xid, Spool(self.memory_limit))
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
