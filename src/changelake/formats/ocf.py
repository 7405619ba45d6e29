"""Avro object container files: the framing (header and blocks), read within fixed bounds.

An OCF is a header (magic, a metadata map holding the schema and codec, a 16-byte sync marker)
then blocks: a record count, a byte length, that many (possibly compressed) bytes, the sync
marker again. fastavro's own reader trusts every length a file states: a corrupt block length
of 2^62 makes it try to allocate 2^62 bytes, a deflate block may expand without limit, and a
corrupt header raises whatever its schema parser happens to raise. So the framing is read here,
and every length is checked against what the file holds and against the maxima below *before*
anything is allocated; fastavro then decodes only the datums of a block that passed (see
`materialize.read_ocf`). Anything wrong is one `InputError` naming the file and the byte offset
of the header or block.

Bounds (a block's bytes are also one message's bytes, so they match the JSON-lines bound):

* a block holds at most `MAX_BLOCK_BYTES` (16 MiB), before and after decompression;
* a block claims at most one record per byte: every Materialize CDC datum starts with its
  union branch index, so a block of n bytes holds at most n records;
* the header's metadata takes at most `MAX_HEADER_BYTES` (16 MiB).

The project's writers of container files keep the same bounds, so that what they write is
always read back: `write_container` frames datums already encoded into blocks of at most
`max_datum_bytes(codec)` before compression (`MAX_DATUM_BYTES`, less for bzip2), which leaves
room for the codec's worst case (data that does not compress grows a little), and one datum
over that is refused (`ValueError`) rather than written into a block no reader takes. A block
holds whole datums, so the caller must make each datum small enough (a Materialize CDC message
is as many updates as fit: `materialize.avro_datums`).
"""

from __future__ import annotations

import bz2
import lzma
import math
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from changelake.errors import InputError, Location

MAGIC = b"Obj\x01"
SYNC_SIZE = 16
MAX_BLOCK_BYTES = 16 * 2**20
MAX_HEADER_BYTES = 16 * 2**20
#: The most bytes of datums `write_container` puts in one block, before compression. zlib's
#: worst case for n bytes that do not compress is n + n/4096 + n/16384 + n/2^25 + 13 bytes
#: (`deflateBound`), about 5.1 KiB over n at 16 MiB: a 64 KiB margin keeps the compressed
#: block within `MAX_BLOCK_BYTES` too.
MAX_DATUM_BYTES = MAX_BLOCK_BYTES - 64 * 2**10
#: bzip2's worst case is 1.01 n + 600 bytes (its manual), about 166 KiB over n at 16 MiB (75 KiB
#: for random bytes, measured): beyond the margin above, so its blocks hold fewer bytes. xz's
#: worst case is a few bytes per 64 KiB chunk (under 1 KiB at 16 MiB): within the margin.
_BZIP2_DATUM_BYTES = (MAX_BLOCK_BYTES - 600) * 100 // 101 - 2**10
#: A block is closed once its datums reach this many bytes (fastavro's default interval).
SYNC_INTERVAL = 16_000
_LONG_BYTES = 10  # a zigzag varint of a 64-bit long takes at most 10 bytes


class _Corrupt(Exception):
    """Internal: what is wrong, raised where the offset is not yet attached."""


class _Counted:
    """A binary stream that counts the bytes read (pipes cannot `tell`) and never reads more
    than it is asked for in one call."""

    def __init__(self, fo: IO[bytes]) -> None:
        self._fo = fo
        self.position = 0

    def read(self, n: int) -> bytes:
        data = self._fo.read(n)
        self.position += len(data)
        return data

    def exact(self, n: int, what: str) -> bytes:
        data = self.read(n)
        if len(data) != n:
            raise _Corrupt(f"truncated: {what} needs {n} bytes, the file has {len(data)} left")
        return data

    def long(self, what: str) -> int:
        """A zigzag varint long."""
        value = self.long_or_end(what)
        if value is None:
            raise _Corrupt(f"truncated: the file ends where {what} should be")
        return value

    def long_or_end(self, what: str) -> int | None:
        """A zigzag varint long, or None at the end of the input."""
        shift = value = 0
        for i in range(_LONG_BYTES):
            byte = self.read(1)
            if not byte:
                if i == 0:
                    return None
                raise _Corrupt(f"truncated: {what} ends in the middle of a number")
            b = byte[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7
        raise _Corrupt(f"{what} is not a valid Avro long (more than {_LONG_BYTES} bytes)")

    def length(self, what: str, limit: int) -> int:
        n = self.long(what)
        if n < 0:
            raise _Corrupt(f"{what} is negative ({n})")
        if n > limit:
            raise _Corrupt(f"{what} is {n} bytes, more than the maximum of {limit}")
        return n


@dataclass(frozen=True, slots=True)
class Header:
    metadata: dict[str, bytes]
    sync: bytes
    size: int  # bytes from the start of the file to the first block

    @property
    def codec(self) -> str:
        return self.metadata.get("avro.codec", b"null").decode("utf-8", "replace")

    def with_null_codec(self) -> bytes:
        """This header re-encoded with codec `null`: a decompressed block framed after it is a
        container file fastavro reads without trusting any length it has not been given."""
        return header_bytes({**self.metadata, "avro.codec": b"null"}, self.sync)


def header_bytes(metadata: dict[str, bytes], sync: bytes) -> bytes:
    """A container file's header: magic, the metadata map (one block), the sync marker."""
    out = bytearray(MAGIC)
    out += _long(len(metadata))
    for key, value in metadata.items():
        name = key.encode()
        out += _long(len(name)) + name + _long(len(value)) + value
    out += _long(0) + sync
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Block:
    offset: int  # of the block's record count, from the start of the file
    count: int
    data: bytes  # decompressed

    def framed(self, sync: bytes) -> bytes:
        """The block as codec `null` frames it (see `Header.with_null_codec`)."""
        return _long(self.count) + _long(len(self.data)) + self.data + sync


def encode_long(n: int) -> bytes:
    """An Avro long: zigzag varint."""
    return _long(n)


def _long(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def read_header(fo: IO[bytes], name: str) -> tuple[Header, _Counted]:
    """The header, and the counted stream positioned at the first block."""
    stream = _Counted(fo)
    try:
        if stream.read(4) != MAGIC:
            raise _Corrupt("not an Avro object container file (no Obj\\x01 magic)")
        metadata: dict[str, bytes] = {}
        while True:
            count = stream.long("the metadata map's block count")
            if count == 0:
                break
            if count < 0:  # a negative count is followed by the block's size in bytes
                count = -count
                stream.long("the metadata map's block size")
            for _ in range(count):
                left = MAX_HEADER_BYTES - stream.position
                key = stream.exact(stream.length("a metadata key's length", left), "a key")
                left = MAX_HEADER_BYTES - stream.position
                value = stream.exact(stream.length("a metadata value's length", left),
                                     "a value")
                try:
                    metadata[key.decode("utf-8")] = value
                except UnicodeDecodeError:
                    raise _Corrupt(f"metadata key {key[:40]!r} is not UTF-8") from None
        sync = stream.exact(SYNC_SIZE, "the sync marker")
    except _Corrupt as error:
        raise InputError(f"not a readable Avro container file: {error}",
                         Location(name, offset=0)) from None
    header = Header(metadata, sync, stream.position)
    if "avro.schema" not in metadata:
        raise InputError("not a readable Avro container file: no avro.schema in its metadata",
                         Location(name, offset=0))
    if header.codec not in _DECOMPRESS:
        raise InputError(f"not a readable Avro container file: codec {header.codec!r} is not "
                         f"supported (only {', '.join(sorted(_DECOMPRESS))})",
                         Location(name, offset=0))
    return header, stream


def read_blocks(stream: _Counted, header: Header, name: str) -> Iterator[Block]:
    """The blocks after the header, each checked against the bounds of the module docstring.
    A block that breaks one is an `InputError` at its offset, and ends the file: its length
    cannot be trusted to find the next one."""
    decompress = _DECOMPRESS[header.codec]
    while True:
        offset = stream.position
        try:
            count = stream.long_or_end("the block's record count")
            if count is None:
                return
            if count < 0:
                raise _Corrupt(f"the block's record count is negative ({count})")
            size = stream.length("the block's length", MAX_BLOCK_BYTES)
            if count > size and header.codec == "null":
                raise _Corrupt(f"the block claims {count} records in {size} bytes (each record "
                               "takes at least one byte)")
            raw = stream.exact(size, "the block")
            if stream.exact(SYNC_SIZE, "the sync marker") != header.sync:
                raise _Corrupt("the sync marker after the block does not match the header's")
            data = decompress(raw)
            if count > len(data):
                raise _Corrupt(f"the block claims {count} records in {len(data)} bytes (each "
                               "record takes at least one byte)")
        except _Corrupt as error:
            raise InputError(f"truncated or corrupt Avro block: {error}",
                             Location(name, offset=offset)) from None
        yield Block(offset, count, data)


def _bounded(make: Callable[[], object], what: str) -> Callable[[bytes], bytes]:
    """A decompressor that refuses output beyond `MAX_BLOCK_BYTES` instead of producing it."""

    def decompress(raw: bytes) -> bytes:
        engine = make()
        try:
            out = engine.decompress(raw, MAX_BLOCK_BYTES + 1)  # type: ignore[attr-defined]
        except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError) as error:
            raise _Corrupt(f"{what} data does not decompress: {error}") from None
        if len(out) > MAX_BLOCK_BYTES:
            raise _Corrupt(f"the block decompresses to more than the maximum of "
                           f"{MAX_BLOCK_BYTES} bytes")
        if not engine.eof:  # type: ignore[attr-defined]
            raise _Corrupt(f"{what} data is truncated")
        return out

    return decompress


_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "null": lambda raw: raw,
    "deflate": _bounded(lambda: zlib.decompressobj(-15), "deflate"),
    "bzip2": _bounded(bz2.BZ2Decompressor, "bzip2"),
    "xz": _bounded(lzma.LZMADecompressor, "xz"),
}


# --------------------------------------------------------------------------------- writing


def max_datum_bytes(codec: str) -> int:
    """The most bytes of datums `write_container` puts in one block of `codec` (so the most
    one datum may take): `MAX_DATUM_BYTES`, less for bzip2 (see there)."""
    if codec not in _COMPRESS:
        raise ValueError(f"codec {codec!r} is not supported (only "
                         f"{', '.join(sorted(_COMPRESS))})")
    return _BZIP2_DATUM_BYTES if codec == "bzip2" else MAX_DATUM_BYTES


def write_container(fo: IO[bytes], schema_json: bytes, datums: Iterable[bytes], *,
                    codec: str = "deflate", weigh: Callable[[bytes], float] | None = None,
                    budget: float = math.inf) -> None:
    """Write a container file of `datums` (each one datum's Avro binary encoding, in order)
    whose every block is within `MAX_BLOCK_BYTES` before and after decompression (see the
    module docstring): a block is closed once it reaches `SYNC_INTERVAL` bytes, or before a
    datum that would take it beyond `max_datum_bytes(codec)`, or (with `weigh`, what a datum
    may decode to: `avro_bounds.Cost.weigh`) before one that would take the block's weight
    beyond `budget` (`avro_bounds.BLOCK_BUDGET`, which the readers hold a block to). A
    datum over either alone is a `ValueError`, raised before its block is written."""
    bound = max_datum_bytes(codec)
    compress = _COMPRESS[codec]
    sync = os.urandom(SYNC_SIZE)
    fo.write(header_bytes({"avro.schema": schema_json, "avro.codec": codec.encode()}, sync))
    block: list[bytes] = []
    size = 0
    weight = 0.0

    def flush() -> None:
        data = compress(b"".join(block))
        if len(data) > MAX_BLOCK_BYTES:  # cannot happen: the margin of MAX_DATUM_BYTES
            raise AssertionError(f"a {codec} block of {size} bytes compressed to {len(data)}, "
                                 f"beyond the maximum of {MAX_BLOCK_BYTES}")
        fo.write(_long(len(block)) + _long(len(data)) + data + sync)

    for datum in datums:
        if len(datum) > bound:
            raise ValueError(f"a datum of {len(datum)} bytes, more than a block may hold "
                             f"({bound} bytes)")
        heavy = weigh(datum) if weigh is not None else 0.0
        if heavy > budget:
            raise ValueError(f"a datum that may decode to {heavy:.0f} bytes of Python objects, "
                             f"more than a block may ({budget:.0f})")
        if block and (size + len(datum) > bound or weight + heavy > budget):
            flush()
            block, size, weight = [], 0, 0.0
        block.append(datum)
        size += len(datum)
        weight += heavy
        if size >= SYNC_INTERVAL:
            flush()
            block, size, weight = [], 0, 0.0
    if block:
        flush()


def _deflate(data: bytes) -> bytes:
    engine = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)  # raw, as Avro's
    return engine.compress(data) + engine.flush()


_COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "null": lambda data: data,
    "deflate": _deflate,
    "bzip2": bz2.compress,  # as fastavro's writer compresses: one bzip2 stream per block
    "xz": lzma.compress,  # the xz format, its default check (CRC-64), as fastavro's
}
