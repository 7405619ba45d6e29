"""PostgreSQL's `pgoutput` logical replication messages, decoded from their bytes.

The built-in `pgoutput` plugin (no server extension to install) turns the write-ahead log
into a stream of messages, one per replication `XLogData` payload. This module reads protocol
versions 1-4 as PostgreSQL documents them ("Logical Replication Message Formats"):

* A transaction is `Begin`, then its changes (`Insert`, `Update`, `Delete`, `Truncate`,
  transactional logical `Message`s), then `Commit`. An `Origin` may follow `Begin` when the
  change came from another node. Before the first change of a table (and again whenever its
  definition changed) comes a `Relation` describing its columns, and before that a `Type` for
  each column whose type is not built in (enums, domains): both describe, neither changes data.
* A non-transactional logical `Message` stands alone, outside any transaction.
* From version 2, with `streaming` on, a transaction larger than the server's
  `logical_decoding_work_mem` arrives before it commits, in blocks: `StreamStart`, changes,
  `StreamStop`, repeated, interleaved with other transactions, then one `StreamCommit` (or a
  `StreamAbort` of the whole transaction or of a subtransaction). Inside a block every change,
  relation and type message carries the transaction id, which is how a reader keeps streamed
  transactions apart. The decoder therefore tracks one bit of state, whether it is inside a
  stream block, and refuses a block that is opened twice or closed when not open.
* Version 4 (`streaming = parallel`) adds the abort's LSN and time to `StreamAbort`.

A row travels as `TupleData`: per column `None` (SQL NULL), `UNCHANGED` (a TOASTed value the
update did not touch, which the server did not send: the reader must take it from the row's
previous state; the `UNCHANGED` marker the changefeed parsers use), text (the type's output
function, in the database encoding: UTF-8 is required), or bytes (binary mode).

Decoding is strict: a payload that ends early, has bytes left over, names an unknown message
type or tuple kind, or holds text that is not UTF-8 raises `PgOutputError` naming the WAL
position of the message and the rule broken, before anything of it is returned.
Two-phase commit messages (protocol 3 with `two_phase`) are refused: changelake never asks
for them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from changelake.errors import InputError
from changelake.formats.change import UNCHANGED, _Unchanged

#: A column's value on the wire: NULL, unchanged TOAST, text, or binary.
Value = None | _Unchanged | str | bytes
Row = tuple[Value, ...]


class PgOutputError(InputError):
    """A pgoutput message that cannot be decoded: the WAL position and the rule broken."""


def format_lsn(lsn: int) -> str:
    """An LSN as PostgreSQL prints it: two hexadecimal halves, `16/B374D848`."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


# -- the messages ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_time: int  # microseconds since 2000-01-01 UTC
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int  # the LSN just past the commit record: where a restart resumes
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int  # the commit's LSN on the origin server
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int  # -1: none; numeric(p, s) is ((p << 16) | s) + 4
    key: bool  # part of the replica identity


@dataclass(frozen=True, slots=True)
class Relation:
    xid: int | None  # the streamed transaction that sent it, inside a stream block
    oid: int
    namespace: str  # "" is pg_catalog
    name: str
    replica_identity: str  # d(efault), n(othing), f(ull), i(ndex)
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    xid: int | None
    relation: int
    new: Row


@dataclass(frozen=True, slots=True)
class Update:
    xid: int | None
    relation: int
    old: Row | None  # with REPLICA IDENTITY FULL ('O') or a changed key ('K'), else None
    old_is_key: bool  # `old` holds only the key columns (others None)
    new: Row


@dataclass(frozen=True, slots=True)
class Delete:
    xid: int | None
    relation: int
    old: Row
    old_is_key: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    xid: int | None
    relations: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first: bool  # the transaction's first block


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int  # the top-level transaction
    subxid: int  # the aborted (sub)transaction: equal to xid when the whole one aborts
    abort_lsn: int | None  # protocol 4 with streaming = parallel only
    abort_time: int | None


PgOutputMessage = (Begin | Commit | Origin | Relation | Type | Insert | Update | Delete
                   | Truncate | Message | StreamStart | StreamStop | StreamCommit | StreamAbort)

_TWO_PHASE = {b"b"[0]: "Begin Prepare", b"P"[0]: "Prepare", b"K"[0]: "Commit Prepared",
              b"r"[0]: "Rollback Prepared", b"p"[0]: "Stream Prepare"}


# -- the wire ----------------------------------------------------------------------------------


class _Cursor:
    """Big-endian fields read in order from one payload; running short is an error."""

    __slots__ = ("data", "pos", "where")

    def __init__(self, data: bytes, where: str) -> None:
        self.data = data
        self.pos = 0
        self.where = where

    def fail(self, rule: str) -> PgOutputError:
        return PgOutputError(f"{self.where}, byte {self.pos}: {rule}")

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"message ends early (needs {n} more bytes, "
                            f"{len(self.data) - self.pos} left)")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str) -> int:
        return int(struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0])

    def int8(self) -> int:
        return self.unpack(">b")

    def byte(self) -> int:
        return self.take(1)[0]

    def int16(self) -> int:
        return self.unpack(">h")

    def int32(self) -> int:
        return self.unpack(">i")

    def uint32(self) -> int:
        return self.unpack(">I")

    def int64(self) -> int:
        return self.unpack(">q")

    def uint64(self) -> int:
        return self.unpack(">Q")

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise self.fail("string without its terminating NUL")
        return self.text(self.take(end - self.pos + 1)[:-1])

    def text(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"text is not UTF-8 ({e.reason}); the database encoding must "
                            "be UTF8") from None

    def done(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} bytes left after the message")


def _row(c: _Cursor) -> Row:
    values: list[Value] = []
    for _ in range(c.int16()):
        kind = c.byte()
        if kind == 0x6E:  # 'n'
            values.append(None)
        elif kind == 0x75:  # 'u'
            values.append(UNCHANGED)
        elif kind == 0x74:  # 't'
            values.append(c.text(c.take(c.int32())))
        elif kind == 0x62:  # 'b'
            values.append(c.take(c.int32()))
        else:
            raise c.fail(f"unknown column kind {chr(kind)!r} in tuple data")
    return tuple(values)


def _expect(c: _Cursor, allowed: bytes, what: str) -> int:
    kind = c.byte()
    if kind not in allowed:
        raise c.fail(f"{what}: expected one of {sorted(chr(b) for b in allowed)}, "
                     f"got {chr(kind)!r}")
    return kind


class Decoder:
    """Decodes one replication stream's payloads in order.

    `streaming_parallel` must say whether the stream was started with `streaming = parallel`
    (protocol 4): only then does a `StreamAbort` carry its LSN and time.
    """

    def __init__(self, *, streaming_parallel: bool = False) -> None:
        self.streaming_parallel = streaming_parallel
        self.in_stream = False

    def decode(self, payload: bytes, lsn: int | None = None) -> PgOutputMessage:
        """One message. `lsn` (the XLogData's start) only serves to name it in errors; the
        decoder's state changes only when the whole message decoded."""
        where = f"pgoutput message at WAL {format_lsn(lsn)}" if lsn is not None else \
            "pgoutput message"
        c = _Cursor(bytes(payload), where)
        if not c.data:
            raise c.fail("empty message")
        kind = c.byte()
        xid = c.uint32() if self.in_stream and kind in b"RYIUDTM" else None
        message: PgOutputMessage
        if kind == 0x42:  # 'B'
            message = Begin(c.uint64(), c.int64(), c.uint32())
        elif kind == 0x43:  # 'C'
            message = Commit(c.int8(), c.uint64(), c.uint64(), c.int64())
        elif kind == 0x4F:  # 'O'
            message = Origin(c.uint64(), c.string())
        elif kind == 0x52:  # 'R'
            oid, namespace, name = c.uint32(), c.string(), c.string()
            identity = chr(c.byte())
            columns = []
            for _ in range(c.int16()):
                flags = c.int8()
                columns.append(Column(c.string(), c.uint32(), c.int32(), bool(flags & 1)))
            message = Relation(xid, oid, namespace, name, identity, tuple(columns))
        elif kind == 0x59:  # 'Y'
            message = Type(xid, c.uint32(), c.string(), c.string())
        elif kind == 0x49:  # 'I'
            relation = c.uint32()
            _expect(c, b"N", "insert")
            message = Insert(xid, relation, _row(c))
        elif kind == 0x55:  # 'U'
            relation = c.uint32()
            tag = _expect(c, b"KON", "update")
            old = None
            if tag != 0x4E:
                old = _row(c)
                _expect(c, b"N", "update's new row")
            message = Update(xid, relation, old, tag == 0x4B, _row(c))
        elif kind == 0x44:  # 'D'
            relation = c.uint32()
            tag = _expect(c, b"KO", "delete")
            message = Delete(xid, relation, _row(c), tag == 0x4B)
        elif kind == 0x54:  # 'T'
            count, options = c.int32(), c.int8()
            message = Truncate(xid, tuple(c.uint32() for _ in range(count)),
                               bool(options & 1), bool(options & 2))
        elif kind == 0x4D:  # 'M'
            flags, at, prefix = c.int8(), c.uint64(), c.string()
            message = Message(xid, bool(flags & 1), at, prefix, c.take(c.int32()))
        elif kind == 0x53:  # 'S'
            if self.in_stream:
                raise c.fail("Stream Start inside an open stream block")
            message = StreamStart(c.uint32(), c.int8() == 1)
        elif kind == 0x45:  # 'E'
            if not self.in_stream:
                raise c.fail("Stream Stop without a Stream Start")
            message = StreamStop()
        elif kind == 0x63:  # 'c'
            message = StreamCommit(c.uint32(), c.int8(), c.uint64(), c.uint64(), c.int64())
        elif kind == 0x41:  # 'A'
            top, sub = c.uint32(), c.uint32()
            if self.streaming_parallel:
                message = StreamAbort(top, sub, c.uint64(), c.int64())
            else:
                message = StreamAbort(top, sub, None, None)
        elif kind in _TWO_PHASE:
            raise c.fail(f"two-phase message {_TWO_PHASE[kind]!r}: changelake does not ask "
                         "for two_phase")
        else:
            raise c.fail(f"unknown message type {chr(kind)!r}")
        c.done()
        if isinstance(message, StreamStart):
            self.in_stream = True
        elif isinstance(message, StreamStop):
            self.in_stream = False
        return message
