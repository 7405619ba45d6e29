"""Reading Materialize CDC files: Avro object container files and Avro-JSON lines, within the
bounds of `formats.lines` and `formats.ocf`, with bad input set aside in lenient mode."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import fastavro
import orjson

from changelake.errors import InputError, Location, SchemaError
from changelake.formats import avro_bounds, ocf
from changelake.formats import avro_values as av
from changelake.formats import lines as jsonl
from changelake.formats.materialize.schema import OCF_MAGIC, CdcSchema, _flat
from changelake.formats.materialize.values import (
    SetAside,
    Sink,
    _freezer,
    message_from_avro_json,
    progress_from_plain,
    updates_from_plain,
)
from changelake.protocol.messages import Message, Updates


def _emit_or_raise(error: InputError, sink: Sink | None, raw: str) -> None:
    if sink is None:
        raise error
    sink(SetAside(error.location or Location(), error.reason, raw[:200]))


def read_json_lines(
    lines: IO[bytes] | Iterable[bytes],
    *,
    name: str,
    schema: CdcSchema | None = None,
    set_aside: Sink | None = None,
) -> Iterator[Message]:
    """Messages from Avro-JSON lines (a binary stream, or lines), within the bounds of
    `lines.py`. With `set_aside`, bad lines go there instead of raising."""
    for number, line in jsonl.numbered_lines(lines):
        origin = Location(name, number)
        if line is None:
            _emit_or_raise(InputError(jsonl.TOO_LONG, origin), set_aside, "")
            continue
        try:
            obj = jsonl.loads(line)
        except jsonl.JsonError as error:
            _emit_or_raise(InputError(str(error), origin), set_aside,
                           line.decode("utf-8", "replace"))
            continue
        try:
            yield message_from_avro_json(obj, schema, origin)
        except ValueError as error:
            _emit_or_raise(InputError(f"not a Materialize CDC message: {error}", origin),
                           set_aside, line.decode("utf-8", "replace"))


def message_from_python(datum: Any, schema: CdcSchema, origin: Location) -> Message:
    """A datum as fastavro reads it (list of updates, or the progress dict) to a message."""
    if isinstance(datum, list):
        convert = schema.python_data
        out = [(convert(u["data"]), u["time"], u["diff"]) for u in datum]
        if any(t < 0 for _, t, _ in out):
            return updates_from_plain(av.python_to_plain(datum), origin, _freezer(schema))
        return Updates(out, origin)
    return progress_from_plain(av.python_to_plain(datum), origin)


def read_ocf(fo: IO[bytes], *, name: str, set_aside: Sink | None = None) -> Iterator[Message]:
    """Messages from an Avro object container file; the schema is the file's own.

    The framing is read and bounded by `ocf` (a corrupt header or block length is refused
    before anything is allocated); fastavro decodes the datums of each checked block. In
    lenient mode a block whose datums do not decode is set aside and reading goes on with the
    next block; corrupt framing sets aside the rest of the file (no length can be trusted to
    find the next block).
    """
    try:
        header, stream = ocf.read_header(fo, name)
        schema = _ocf_schema(header, name)
    except InputError as error:
        _emit_or_raise(error, set_aside, "")
        return
    prefix = header.with_null_codec()
    blocks = ocf.read_blocks(stream, header, name)
    while True:
        try:
            block = next(blocks)
        except StopIteration:
            return
        except InputError as error:
            _emit_or_raise(error, set_aside, "")
            return
        try:
            datums = _datums(prefix, header.sync, block, name, schema.cost)
        except InputError as error:
            _emit_or_raise(error, set_aside, "")
            continue
        for index, datum in enumerate(datums):
            origin = Location(name, offset=block.offset, index=index)
            try:
                yield message_from_python(datum, schema, origin)
            except ValueError as error:
                _emit_or_raise(InputError(f"not a Materialize CDC message: {error}", origin),
                               set_aside, "")


def read_ocf_schema(fo: IO[bytes], *, name: str) -> CdcSchema:
    """The Materialize CDC schema of an Avro container file, from its checked header: for
    readers that need the schema before the messages (an `InputError` at offset 0 if the
    header is corrupt, where fastavro's own reader raises whatever its parser does)."""
    header, _ = ocf.read_header(fo, name)
    return _ocf_schema(header, name)


def _ocf_schema(header: ocf.Header, name: str) -> CdcSchema:
    where = Location(name, offset=0)
    try:
        avro = orjson.loads(header.metadata["avro.schema"])
    except orjson.JSONDecodeError as error:
        raise InputError(f"the container's schema is not JSON: {error}", where) from None
    try:
        return CdcSchema.from_json(avro, name)
    except SchemaError as error:
        raise InputError(f"the container's schema: {error.reason}", where) from None


def _over_budget(what: str, over: avro_bounds.OverBudget, index: int) -> str:
    return (f"{what} decodes to more than {avro_bounds.BLOCK_BUDGET >> 20} MiB of Python "
            f"objects ({over.spent:.0f} bytes by avro_bounds' cost model when datum {index} "
            "reached it): refused (rule: a decoded-size budget per block or message; write "
            "smaller blocks or messages)")


def _datums(prefix: bytes, sync: bytes, block: ocf.Block, name: str,
            cost: avro_bounds.Cost) -> list[Any]:
    """The datums of one checked block, all or none: a datum that does not decode, or bytes
    left over after the last one, is an `InputError` at the block's offset; so is a block
    that decodes to more than `avro_bounds.BLOCK_BUDGET` (counted as it is decoded)."""
    datums: list[Any] = []
    try:
        if cost.static(len(block.data), block.count) <= avro_bounds.BLOCK_BUDGET:
            (reader,) = fastavro.block_reader(io.BytesIO(prefix + block.framed(sync)))
            datums.extend(reader)
            left = len(block.data) - reader.bytes_.tell()
        else:  # it might not fit: decoded value by value, its cost counted
            fo = io.BytesIO(block.data)
            budget = [float(avro_bounds.BLOCK_BUDGET)]
            for _ in range(block.count):
                datums.append(cost.read(fo, budget))
            left = len(block.data) - fo.tell()
    except avro_bounds.OverBudget as over:
        raise InputError(_over_budget("the block", over, len(datums)),
                         Location(name, offset=block.offset, index=len(datums))) from None
    except Exception as error:  # fastavro raises several types (EOFError, IndexError, ...)
        raise InputError(f"corrupt Avro datum {len(datums)} of the block: "
                         f"{type(error).__name__}: {_flat(error)}",
                         Location(name, offset=block.offset, index=len(datums))) from None
    if left:
        raise InputError(f"{left} bytes left over after the block's {block.count} records",
                         Location(name, offset=block.offset))
    return datums


def read_stream(
    fo: IO[bytes],
    *,
    name: str,
    schema: CdcSchema | None = None,
    set_aside: Sink | None = None,
) -> Iterator[Message]:
    """Messages from a binary stream, OCF or JSON lines, told apart by the first bytes."""
    head = fo.peek(4)[:4] if hasattr(fo, "peek") else b""
    if not head:
        data = fo.read()
        fo = io.BytesIO(data)
        head = data[:4]
    if head == OCF_MAGIC:
        yield from read_ocf(fo, name=name, set_aside=set_aside)
    else:
        yield from read_json_lines(fo, name=name, schema=schema, set_aside=set_aside)


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Files named, and the files below directories named (sorted; hidden and `_` files skipped,
    as Spark does)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(
                f for f in p.rglob("*")
                if f.is_file() and not any(part.startswith((".", "_"))
                                           for part in f.relative_to(p).parts)
            ))
        elif p.exists():
            out.append(p)
        else:
            raise InputError(f"{p}: no such file or directory")
    return out


def read_messages(
    path: str | Path,
    *,
    schema: CdcSchema | None = None,
    set_aside: Sink | None = None,
) -> Iterator[Message]:
    """Messages from one file ("-" is standard input)."""
    if str(path) == "-":
        yield from read_stream(sys.stdin.buffer, name="<stdin>", schema=schema,
                               set_aside=set_aside)
        return
    with open(path, "rb") as fo:
        yield from read_stream(fo, name=str(path), schema=schema, set_aside=set_aside)


def read_all(
    paths: Sequence[str | Path],
    *,
    schema: CdcSchema | None = None,
    set_aside: Sink | None = None,
) -> Iterator[Message]:
    """Messages from files and directories in order; standard input when `paths` is empty."""
    if not paths:
        yield from read_messages("-", schema=schema, set_aside=set_aside)
        return
    for path in expand_paths(paths):
        yield from read_messages(path, schema=schema, set_aside=set_aside)
