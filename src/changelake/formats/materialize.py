"""Materialize CDC messages: the Avro schema, and the files and frames that carry them.

A Materialize CDC message is a value of an Avro union of two branches (seeds 000 and 002):

* an array of `com.materialize.cdc.update` records `{data, time, diff}`: an `Updates` message;
* a `com.materialize.cdc.progress` record `{lower, upper, counts}`: a `Progress` message.

Carriers supported here:

* Avro object container files (OCF), one message per Avro datum, through fastavro;
* Avro JSON, one message per line: `{"array": [...]}` and `{"com.materialize.cdc.progress": {...}}`
  (the union wrapped by branch name, as the docs show). With a schema, nested unions are
  unwrapped and every value is type-checked; without one, only primitive union wrappers such as
  `{"int": 10}` are unwrapped;
* single messages framed for Kafka: Confluent (magic byte 0, 4-byte schema id) and Avro
  single-object encoding (`C3 01`, 8-byte CRC-64-AVRO fingerprint).

Messages come out as protocol values (`Updates`, `Progress`) whose data rows are `Record`s in the
schema's field order (sorted field names without a schema), each carrying the `Location` it was
read from. Input that cannot be read is an `InputError` naming file and line or byte offset; in
lenient mode it is set aside (see `SetAside`) and reading goes on with the next line or block
(after corrupt container framing, with the next file). Input is read within the bounds of
`lines.py` (JSON lines) and `ocf.py` (container files): a hostile length is refused, not
allocated.

The writers keep the same bounds, so that what they write is always read back: no Avro block
over `ocf.MAX_BLOCK_BYTES` (datums framed by `ocf.write_container`), no JSON line over
`lines.MAX_LINE_BYTES`. A message too large for one datum or line is cut into several
(`avro_datums`, `json_lines`: the one place every writer of messages cuts them, the capture's
logs too), which the protocol allows; an update too large for any message is an
`UpdateTooLarge`, carrying the update for its caller to name.
"""

from __future__ import annotations

import io
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter
from pathlib import Path
from typing import IO, Any

import fastavro
import orjson
from fastavro.schema import fingerprint, to_parsing_canonical_form

from changelake.errors import InputError, Location, SchemaError
from changelake.formats import avro_bounds, ocf
from changelake.formats import avro_values as av
from changelake.formats import lines as jsonl
from changelake.protocol.antichain import Antichain
from changelake.protocol.messages import Message, Progress, Update, Updates
from changelake.protocol.time import check_time
from changelake.text import short
from changelake.values import Record, freeze, thaw

NAMESPACE = "com.materialize.cdc"
PROGRESS_BRANCH = f"{NAMESPACE}.progress"
OCF_MAGIC = ocf.MAGIC
CONFLUENT_MAGIC = b"\x00"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"


# ---------------------------------------------------------------------------------- schema


def cdc_schema(fields: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The Materialize CDC union schema for data records with these Avro fields.

    `fields` are Avro field definitions, e.g. `{"name": "price", "type": ["null", "int"]}`.
    """
    return cdc_schema_around({"type": "record", "name": "data",
                              "fields": [dict(f) for f in fields]})


def cdc_schema_around(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Materialize CDC union schema whose updates' `data` is the Avro record `data`, as it
    is (its name and namespace kept, so the names it refers to resolve as they did)."""
    return [
        {
            "type": "array",
            "items": {
                "type": "record",
                "name": "update",
                "namespace": NAMESPACE,
                "fields": [
                    {"name": "data", "type": dict(data)},
                    {"name": "time", "type": "long"},
                    {"name": "diff", "type": "long"},
                ],
            },
        },
        {
            "type": "record",
            "name": "progress",
            "namespace": NAMESPACE,
            "fields": [
                {"name": "lower", "type": {"type": "array", "items": "long"}},
                {"name": "upper", "type": {"type": "array", "items": "long"}},
                {"name": "counts", "type": {"type": "array", "items": {
                    "type": "record", "name": "counts",
                    "fields": [{"name": "time", "type": "long"}, {"name": "count", "type": "long"}],
                }}},
            ],
        },
    ]


@dataclass(frozen=True, slots=True)
class CdcSchema:
    """A validated Materialize CDC schema, with what the codecs need precomputed."""

    avro: Any  # the schema as JSON (list of the two branches)
    data_type: Any  # the `data` record's schema
    data_fields: tuple[str, ...]
    named: Mapping[str, Any]
    json_data: Any = None  # compiled Avro JSON -> frozen row converter
    python_data: Any = None  # compiled fastavro value -> frozen row converter
    parsed_avro: Any = None  # fastavro's parsed schema, parsed once: framed messages
    # (Kafka) are encoded and decoded one by one, and parsing per message would dominate
    plain_python: Any = None  # compiled plain row -> fastavro value converter
    updates_avro_json: Any = None  # compiled plain updates -> Avro JSON (raises av.Invalid)
    json_rows: Any = None  # compiled Avro JSON rows of a message -> frozen rows, at once
    cost: Any = None  # avro_bounds.Cost: what a block may decode to, and a budgeted reader

    @classmethod
    def from_json(cls, avro: Any, source: str = "schema") -> CdcSchema:
        if isinstance(avro, dict) and "schema" in avro and isinstance(avro["schema"], str):
            try:  # a schema-registry response
                avro = orjson.loads(avro["schema"])
            except orjson.JSONDecodeError as error:
                raise SchemaError(f"{source}: the registry's schema is not JSON: {error}") \
                    from None
        try:
            fastavro.parse_schema(avro)
        except Exception as error:  # fastavro raises several exception types
            # its message may quote the schema, newlines and all: keep the error one line
            raise SchemaError(f"{source}: not a valid Avro schema: {_flat(error)}") from None
        try:
            return cls._checked(avro, source)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            # fastavro lets some malformed schemas through (a record without fields, ...)
            raise SchemaError(f"{source}: not a valid Avro schema: {type(error).__name__}: "
                              f"{_flat(error)}") from None

    @classmethod
    def _checked(cls, avro: Any, source: str) -> CdcSchema:
        named = av.named_types(avro)
        if not isinstance(avro, list) or len(avro) != 2:
            raise SchemaError(f"{source}: a Materialize CDC schema is a union of two branches "
                              "(an array of updates and the progress record)")
        array = av._resolve(avro[0], named)
        progress = av._resolve(avro[1], named)
        if not (isinstance(array, dict) and array.get("type") == "array"):
            raise SchemaError(f"{source}: the first branch must be the array of updates")
        if av.type_name(progress, named) != PROGRESS_BRANCH:
            raise SchemaError(f"{source}: the second branch must be {PROGRESS_BRANCH}")
        update = av._resolve(array["items"], named)
        by_name = {f["name"]: f for f in update.get("fields", [])}
        if set(by_name) != {"data", "time", "diff"}:
            raise SchemaError(f"{source}: update records need exactly data, time and diff")
        data_type = av._resolve(by_name["data"]["type"], named)
        if not (isinstance(data_type, dict) and data_type.get("type") == "record"):
            raise SchemaError(f"{source}: the data field must be a record")
        loop = avro_bounds.recursive_type(avro, named)
        if loop is not None:
            raise SchemaError(f"{source}: type {loop} contains itself: recursive types are not "
                              "supported (a value of one may nest as deep as it has bytes)")
        found = avro_bounds.zero_width_array(array, named, "updates") \
            or avro_bounds.zero_width_array(progress, named, "progress")
        if found is not None:
            path, item = found
            raise SchemaError(f"{source}: {path} is an array of {item} items, which take no "
                              "bytes in Avro, so a few bytes could claim any number of them: "
                              "refused (rule: no zero-width array items; see avro_bounds.py)")
        fields = tuple(f["name"] for f in data_type["fields"])
        return cls(avro, data_type, fields, named, av.compile_avro_json(data_type, named),
                   av.compile_python(data_type, named), fastavro.parse_schema(avro),
                   av.compile_plain_python(data_type, named) or _same,
                   av.compile_to_avro_json(avro[0], named),
                   av.compile_avro_json_rows(data_type, named),
                   avro_bounds.Cost(avro, named))

    @classmethod
    def for_fields(cls, fields: Sequence[Mapping[str, Any]]) -> CdcSchema:
        return cls.from_json(cdc_schema(fields))

    @property
    def parsed(self) -> Any:
        if self.parsed_avro is not None:
            return self.parsed_avro
        return fastavro.parse_schema(self.avro)

    def fingerprint(self) -> bytes:
        """CRC-64-AVRO fingerprint (little-endian bytes), for single-object encoding."""
        canonical = to_parsing_canonical_form(self.avro)
        return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))  # hex of the LE bytes


def _same(value: Any) -> Any:
    return value


def load_schema(path: Path) -> CdcSchema:
    """The schema of a `--schema FILE`: the Materialize CDC union, or the Avro record of the
    rows alone (a record cannot be the union, so it is taken as its `data`: writing the union
    around one's rows by hand is the `encode` user's chore, not information). A schema from a
    registry or an Avro file's header is always the union (`CdcSchema.from_json`)."""
    try:
        text = Path(path).read_bytes()
    except OSError as error:
        raise SchemaError(f"{path}: cannot read schema: {error.strerror}") from None
    try:
        avro = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise SchemaError(f"{path}: not JSON: {error}") from None
    if isinstance(avro, dict) and avro.get("type") == "record":
        if not isinstance(avro.get("fields"), list):
            raise SchemaError(f"{path}: not a valid Avro schema: a record needs a list of fields")
        avro = cdc_schema_around(avro)
    return CdcSchema.from_json(avro, str(path))


def load_schema_text(path: Path | str) -> str:
    """`load_schema(path)` as the union's JSON text: what a Spark data source option carries
    (options are strings) for a schema given as a file."""
    return orjson.dumps(load_schema(Path(path)).avro).decode()


# ------------------------------------------------------------------- messages <-> values


@dataclass(frozen=True, slots=True)
class SetAside:
    """Input that lenient mode skipped: where, why, and the raw text (truncated)."""

    location: Location
    reason: str
    raw: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"set_aside": str(self.location), "reason": self.reason, "raw": self.raw}


Sink = Callable[[SetAside], None]


def _times(value: Any, what: str) -> list[int]:
    if not isinstance(value, list):
        raise ValueError(f"{what}: expected an array of times, got {short(value)}")
    try:
        return [check_time(t) for t in value]  # type: ignore[misc]
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


def progress_from_plain(value: Any, origin: Location) -> Progress:
    if not isinstance(value, dict) or set(value) != {"lower", "upper", "counts"}:
        raise ValueError("progress must have exactly lower, upper and counts")
    counts = value["counts"]
    if not isinstance(counts, list):
        raise ValueError("counts: expected an array")
    pairs = []
    for i, c in enumerate(counts):
        if not isinstance(c, dict) or set(c) != {"time", "count"}:
            raise ValueError(f"counts[{i}]: expected {{time, count}}, got {short(c)}")
        try:
            pairs.append((check_time(c["time"]), _long(c["count"], "count")))
        except ValueError as error:
            raise ValueError(f"counts[{i}]: {error}") from None
    return Progress(Antichain(_times(value["lower"], "lower")),
                    Antichain(_times(value["upper"], "upper")), tuple(pairs), origin)


def updates_from_plain(
    value: Any, origin: Location, freeze_data: Callable[[Any], Any]
) -> Updates:
    if not isinstance(value, list):
        raise ValueError("updates must be an array")
    out = []
    for i, u in enumerate(value):
        if not isinstance(u, dict) or set(u) != {"data", "time", "diff"}:
            raise ValueError(f"update {i}: expected {{data, time, diff}}, got {short(u)}")
        try:
            time = check_time(u["time"])
        except ValueError as error:
            raise ValueError(f"update {i}: {error}") from None
        try:
            diff = _long(u["diff"], "diff")
        except ValueError as error:
            raise ValueError(f"update {i}: {error}") from None
        if not isinstance(u["data"], dict):
            raise ValueError(f"update {i}: data must be a record, got {short(u['data'])}")
        out.append((freeze_data(u["data"]), time, diff))
    return Updates(out, origin)


def _long(value: Any, what: str) -> int:
    """A diff or count: an Avro long."""
    if type(value) is not int:
        raise ValueError(f"{what} must be an integer, got {short(value)}")
    low, high = av.LONG_RANGE
    if not low <= value <= high:
        raise ValueError(f"{what} {value} does not fit a 64-bit signed integer")
    return value


def _flat(error: Exception) -> str:
    """A library's error message as one line of reasonable length."""
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."



def _schemaless_row(data: Any) -> Record:
    """Without a schema, field order carries no meaning: rows are frozen in sorted order."""
    if type(data) is not dict:
        raise av.Invalid
    return Record(sorted([(k, av.freeze_unwrapped(v)) for k, v in data.items()]))


def _freezer(schema: CdcSchema | None) -> Callable[[Any], Any]:
    if schema is None:
        return lambda d: Record(sorted((k, freeze(v)) for k, v in d.items()))
    fields = schema.data_fields
    return lambda d: freeze(d, fields)


def message_from_avro_json(obj: Any, schema: CdcSchema | None, origin: Location) -> Message:
    """One line's JSON value (a wrapped union) to a protocol message."""
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError('expected {"array": [...]} or {"com.materialize.cdc.progress": {...}}')
    ((branch, value),) = obj.items()
    if schema is not None:
        if branch == "array":
            try:
                return _updates_fast(value, origin, schema.json_rows)
            except (av.Invalid, KeyError, TypeError):
                pass  # the generic path below says what is wrong (or accepts defaults)
        value = av.from_avro_json(obj, schema.avro, schema.named)
        if branch == "array":
            return updates_from_plain(value, origin, _freezer(schema))
        return progress_from_plain(value, origin)
    if branch == "array":
        try:
            return _updates_fast_schemaless(value, origin)
        except (av.Invalid, KeyError, TypeError):
            pass  # the generic path below says what is wrong
        return updates_from_plain(av.unwrap_unions_heuristically(value), origin, _freezer(None))
    if branch in (PROGRESS_BRANCH, "progress"):
        return progress_from_plain(value, origin)
    raise ValueError(f"unknown message branch {branch!r}")


def _updates_fast(value: Any, origin: Location, rows: Callable[[list], list]) -> Updates:
    """The common case, fast: every check of `updates_from_plain`, on the whole message at
    once (a few C-level passes over its times and diffs), its rows frozen by `rows` (a
    message's rows at once: `CdcSchema.json_rows`, `_schemaless_rows`). Raises `Invalid` (or
    KeyError, TypeError) on anything unusual, for the generic path to explain."""
    if type(value) is not list:
        raise av.Invalid
    if not value:
        return Updates([], origin)
    if set(map(type, value)) != {dict} or set(map(len, value)) != {3}:
        raise av.Invalid
    low, high = av.LONG_RANGE
    times = list(map(_TIME, value))
    diffs = list(map(_DIFF, value))
    if set(map(type, times)) != {int} or min(times) < 0 or max(times) > high \
            or set(map(type, diffs)) != {int} or min(diffs) < low or max(diffs) > high:
        raise av.Invalid
    return Updates(list(zip(rows(list(map(_DATA, value))), times, diffs, strict=True)), origin)


_DATA, _TIME, _DIFF = itemgetter("data"), itemgetter("time"), itemgetter("diff")

_FLAT = frozenset({str, int, float, bool, type(None)})
"""Types that `freeze_unwrapped` returns unchanged, as JSON parsing produces them (JSON has no
NaN, so a parsed float never needs the shared NaN)."""

_UNWRAPPED = av.PRIMITIVES - {"null"}
"""The union branch names `freeze_unwrapped` unwraps."""


def _updates_fast_schemaless(value: Any, origin: Location) -> Updates:
    """`_updates_fast` with rows frozen as `_schemaless_row` freezes each."""
    return _updates_fast(value, origin, _schemaless_rows)


def _schemaless_rows(rows: list) -> list[Record]:
    """`[_schemaless_row(row) for row in rows]` for the rows of one message (parsed JSON), a
    column at a time when every row has the same fields: a column of plain scalars is taken
    as it is, one of primitive union values (`{"int": 12}`, or null) is unwrapped with a few
    C-level passes; the rows are made from the columns at once. Other messages go row by
    row, and other columns value by value, through `freeze_unwrapped`."""
    if set(map(type, rows)) != {dict}:
        raise av.Invalid
    first = rows[0]
    names = sorted(first)
    if not names or set(map(len, rows)) != {len(names)}:
        return list(map(_schemaless_row, rows))
    try:
        columns = [list(map(itemgetter(name), rows)) for name in names]
    except KeyError:  # rows of other fields
        return list(map(_schemaless_row, rows))
    pairs = [zip(repeat(name), _unwrapped_column(column))
             for name, column in zip(names, columns, strict=True)]
    return list(map(Record, zip(*pairs, strict=True)))


def _unwrapped_column(column: list) -> list:
    kinds = set(map(type, column))
    if kinds <= _FLAT:
        return column
    if dict in kinds and kinds <= _FLAT | {dict}:
        wrapped = [v for v in column if type(v) is dict]
        if set(map(len, wrapped)) == {1} and set(chain.from_iterable(wrapped)) <= _UNWRAPPED:
            inner = list(chain.from_iterable(map(dict.values, wrapped)))
            if set(map(type, inner)) <= _FLAT:
                if len(inner) == len(column):
                    return inner
                values = iter(inner)
                return [next(values) if type(v) is dict else v for v in column]
    unwrapped = av.freeze_unwrapped
    return [v if type(v) in _FLAT else unwrapped(v) for v in column]


def message_to_plain(message: Message, *, json_safe: bool = False) -> Any:
    """A protocol message as the plain value of its union branch."""
    if isinstance(message, Updates):
        return [{"data": thaw(d, json_safe=json_safe), "time": t, "diff": r}
                for d, t, r in message.updates]
    return {
        "lower": list(message.lower),
        "upper": list(message.upper),
        "counts": [{"time": t, "count": c} for t, c in message.counts],
    }


def message_to_avro_json(message: Message, schema: CdcSchema | None) -> dict[str, Any]:
    branch = "array" if isinstance(message, Updates) else PROGRESS_BRANCH
    if schema is not None:  # the message's kind is its branch: a bad value is named as such
        plain = message_to_plain(message)
        if isinstance(message, Updates):
            try:
                return {branch: schema.updates_avro_json(plain)}
            except av.Invalid:
                pass  # the generic conversion below says what is wrong
        branch_schema = schema.avro[0 if isinstance(message, Updates) else 1]
        return {branch: av.to_avro_json(plain, branch_schema, schema.named)}
    return {branch: message_to_plain(message, json_safe=True)}


# --------------------------------------------------------------------------------- reading


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


# --------------------------------------------------------------------------------- writing


class UpdateTooLarge(InputError):
    """An update that no message can hold: alone in a message it takes `size` bytes as
    `carrier` ("an Avro datum", "a JSON line"), more than `bound`, the most the readers take
    (`ocf.MAX_BLOCK_BYTES`, `lines.MAX_LINE_BYTES`). It carries the update, so that a caller
    that knows where the update came from says so in its own words (`encode`: the input's
    file and line; the capture: the table, the row's key and its transaction); without one,
    it names the update's time, its size and the bound."""

    def __init__(self, update: Update, size: int, bound: int, carrier: str,
                 location: Location | None = None) -> None:
        self.update, self.size, self.bound, self.carrier = update, size, bound, carrier
        what = "an Avro block" if "Avro" in carrier else "a JSON line"
        limit = (f"the readers refuse a block that may decode to more than {bound >> 20} MiB"
                 if carrier.startswith("decoded") else
                 f"the readers refuse {what} over 16 MiB")
        super().__init__(
            f"an update at time {update[1]} takes {size} bytes as {carrier} of its own, more "
            f"than one message may hold ({bound} bytes: {limit})"
            "; nothing of the output is kept: make the row smaller", location)

    def at(self, location: Location | None) -> UpdateTooLarge:
        """The same refusal, said of where the update was read."""
        return UpdateTooLarge(self.update, self.size, self.bound, self.carrier, location)


#: Avro binary of an updates message: union branch 0, the array's blocks (a count, the items),
#: the array's end. fastavro writes an array as one block.
_BRANCH_0, _ARRAY_END = b"\x00", b"\x00"
#: Avro JSON of an updates message, around its updates (separated by commas).
_JSON_HEAD, _JSON_TAIL = b'{"array":[', b"]}"


def avro_datums(messages: Iterable[Message], schema: CdcSchema, *,
                bound: int = ocf.MAX_DATUM_BYTES,
                datum: Callable[[Message], Any] | None = None) -> Iterator[bytes]:
    """The messages as Avro datums (binary, the CDC union), each of at most `bound` bytes, so
    that `ocf.write_container` can put each in a block the readers take. A message that
    encodes to more is cut: the updates of one into as many datums as they need (a progress
    statement counts updates, not messages, so any cut of a batch says the same), a progress
    statement into statements over consecutive parts of its interval. An update that takes
    more than `bound` alone is an `UpdateTooLarge`, raised before any datum of its message.

    A message is encoded whole first, and only one over the bound is encoded again update by
    update: the common case costs one encoding. `datum` makes a message's fastavro value (an
    updates message's: a list aligned with its updates; default `_python_datum`). Values that
    do not fit the schema raise fastavro's `ValueError` or `TypeError`."""
    parsed = schema.parsed
    value_of = datum if datum is not None else (lambda m: _python_datum(m, schema))
    cost, budget = schema.cost, avro_bounds.BLOCK_BUDGET

    def encode(value: Any) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, value)
        return out.getvalue()

    for message in messages:
        value = value_of(message)
        encoded = encode(value)
        if len(encoded) <= bound and cost.weigh(encoded) <= budget:
            del value  # freed now, not while the caller writes the datum (cache-warm reuse)
            yield encoded
        elif isinstance(message, Updates):
            # Each update alone, `[item]`: branch 0, a block of 1 (zigzag 0x02), the item, the
            # end; the item's bytes are framed again with their neighbours.
            bodies = [encode([item])[2:-1] for item in value]
            for run in _runs(message.updates, bodies, bound, _avro_frame, "an Avro datum",
                             weigh=lambda n, size: cost.weigh_updates(n, size)):
                yield _BRANCH_0 + ocf.encode_long(len(run)) + b"".join(run) + _ARRAY_END
        else:
            yield from _progress_pieces(message, lambda m: encode(value_of(m)), bound,
                                        cost.weigh)


def _avro_frame(n: int) -> int:
    """The bytes of an Avro updates datum of `n` updates besides the updates' own."""
    return len(_BRANCH_0) + len(ocf.encode_long(n)) + len(_ARRAY_END)


def _json_frame(n: int) -> int:
    """The bytes of an Avro-JSON updates line of `n` updates besides the updates' own (the
    commas between them; not the newline)."""
    return len(_JSON_HEAD) + n - 1 + len(_JSON_TAIL)


def _runs(updates: Sequence[Update], bodies: list[bytes], bound: int,
          frame: Callable[[int], int], carrier: str,
          weigh: Callable[[int, int], float] | None = None) -> list[list[bytes]]:
    """The encoded updates of one message (`bodies`, aligned with `updates`) in consecutive
    runs, as many to a run as fit `bound` once framed (`frame(n)`: the bytes of a message of n
    besides theirs), and, with `weigh` (what a datum of n updates in so many bytes may decode
    to), whose weight is within `avro_bounds.BLOCK_BUDGET`. All are checked before any run is
    returned: an update that does not fit alone is an `UpdateTooLarge` with nothing of its
    message written."""
    budget = avro_bounds.BLOCK_BUDGET
    runs: list[list[bytes]] = []
    run: list[bytes] = []
    size = 0
    for update, body in zip(updates, bodies, strict=True):
        alone = frame(1) + len(body)
        if alone > bound:
            raise UpdateTooLarge(update, alone, bound, carrier)
        if weigh is not None and weigh(1, alone) > budget:
            raise UpdateTooLarge(update, int(weigh(1, alone)), budget,
                                 "decoded Python objects of an Avro datum")
        if run and (frame(len(run) + 1) + size + len(body) > bound or (
                weigh is not None
                and weigh(len(run) + 1, frame(len(run) + 1) + size + len(body)) > budget)):
            runs.append(run)
            run, size = [], 0
        run.append(body)
        size += len(body)
    if run:
        runs.append(run)
    return runs


def _progress_pieces(message: Progress, encode: Callable[[Progress], bytes],
                     bound: int, weigh: Callable[[bytes], float] | None = None
                     ) -> Iterator[bytes]:
    """A progress statement encoded (`encode`) in pieces of at most `bound` bytes: halves of
    its counts, in time order, over `[lower, t)` and `[t, upper)` for the first time t of the
    second half (times are integers: each half's interval holds exactly its counts' times, and
    the two tile the statement's). Needed only for one of a million or so distinct times."""
    encoded = encode(message)
    if len(encoded) <= bound and (weigh is None or weigh(encoded) <= avro_bounds.BLOCK_BUDGET):
        yield encoded
        return
    counts = sorted(message.counts)
    half = len(counts) // 2
    if half == 0:  # one count: a few dozen bytes, within any bound a reader keeps
        raise ValueError(f"a progress statement of one count takes {len(encoded)} bytes, more "
                         f"than the bound of {bound}")
    middle = Antichain([counts[half][0]])
    yield from _progress_pieces(
        Progress(message.lower, middle, tuple(counts[:half]), message.origin), encode, bound,
        weigh)
    yield from _progress_pieces(
        Progress(middle, message.upper, tuple(counts[half:]), message.origin), encode, bound,
        weigh)


def json_lines(messages: Iterable[Message], schema: CdcSchema | None = None, *,
               bound: int = jsonl.MAX_LINE_BYTES) -> Iterator[bytes]:
    """The messages as Avro-JSON lines (newline included), each of at most `bound` bytes, the
    most the readers take (`lines.MAX_LINE_BYTES`): a message longer than that is cut as
    `avro_datums` cuts it, and an update too long for a line alone is an `UpdateTooLarge`,
    raised before any line of its message."""
    for message in messages:
        value = message_to_avro_json(message, schema)
        line = orjson.dumps(value)
        if len(line) < bound:
            del value  # freed now, not while the caller writes the line (cache-warm reuse)
            yield line + b"\n"
        elif isinstance(message, Updates):
            bodies = [orjson.dumps(item) for item in value["array"]]
            for run in _runs(message.updates, bodies, bound - 1, _json_frame, "a JSON line"):
                yield _JSON_HEAD + b",".join(run) + _JSON_TAIL + b"\n"
        else:
            for piece in _progress_pieces(
                    message, lambda m: orjson.dumps(message_to_avro_json(m, schema)), bound - 1):
                yield piece + b"\n"


def write_json_lines(
    fo: IO[bytes], messages: Iterable[Message], schema: CdcSchema | None = None
) -> int:
    """Write messages as Avro-JSON lines, each within the readers' bound (`json_lines`: a
    message over it is cut into several); returns how many lines (messages) were written.
    An update too large for any line is an `UpdateTooLarge`."""
    n = 0
    for line in json_lines(messages, schema):
        fo.write(line)
        n += 1
    return n


def _python_datum(message: Message, schema: CdcSchema) -> Any:
    plain = message_to_plain(message)
    if isinstance(message, Updates):
        convert = schema.plain_python
        return [{"data": convert(u["data"]), "time": u["time"], "diff": u["diff"]}
                for u in plain]
    return plain


def write_ocf(
    fo: IO[bytes], messages: Iterable[Message], schema: CdcSchema, *, codec: str = "null"
) -> int:
    """Write messages to an Avro object container file in blocks the readers take
    (`ocf.write_container`, within `ocf.MAX_BLOCK_BYTES` before and after compression): a
    message too large for one block is cut into several datums (`avro_datums`), and an update
    too large for any is an `UpdateTooLarge`. Returns how many datums (messages) were written.
    """
    count = 0

    def counted() -> Iterator[Message]:
        nonlocal count
        for message in messages:
            count += 1
            yield message

    written = 0
    bound = ocf.max_datum_bytes(codec)  # a ValueError for a codec the readers do not take

    def datums() -> Iterator[bytes]:
        nonlocal written
        for datum in avro_datums(counted(), schema, bound=bound):
            written += 1
            yield datum

    try:
        ocf.write_container(fo, orjson.dumps(schema.avro), datums(), codec=codec,
                            weigh=schema.cost.weigh, budget=avro_bounds.BLOCK_BUDGET)
    except (ValueError, TypeError) as error:
        text = str(error)  # fastavro's names the whole datum and schema: the start says why
        raise SchemaError(f"message {count} does not fit the schema: "
                          f"{text if len(text) <= 300 else text[:300] + ' ...'}") from None
    return written


# ------------------------------------------------------------------------ framed messages


def confluent_header(schema_id: int) -> bytes:
    """What a Confluent-framed value starts with: 0x00, the schema id (4 bytes, big-endian)."""
    return CONFLUENT_MAGIC + struct.pack(">I", schema_id)


def encode_confluent(message: Message, schema: CdcSchema, schema_id: int) -> bytes:
    """A Kafka message value in Confluent wire format: 0x00, schema id (big-endian), Avro."""
    out = io.BytesIO()
    out.write(confluent_header(schema_id))
    fastavro.schemaless_writer(out, schema.parsed, _python_datum(message, schema))
    return out.getvalue()


def encode_single_object(message: Message, schema: CdcSchema) -> bytes:
    """Avro single-object encoding: C3 01, CRC-64-AVRO fingerprint, Avro binary."""
    out = io.BytesIO()
    out.write(SINGLE_OBJECT_MAGIC + schema.fingerprint())
    fastavro.schemaless_writer(out, schema.parsed, _python_datum(message, schema))
    return out.getvalue()


def decode_framed(
    payload: bytes, schemas: Mapping[int | bytes, CdcSchema], origin: Location
) -> Message:
    """A Confluent-framed or single-object message. `schemas` maps schema ids (Confluent) or
    fingerprints (single-object) to schemas."""
    if payload[:1] == CONFLUENT_MAGIC and len(payload) >= 5:
        (key,) = struct.unpack(">I", payload[1:5])
        body = payload[5:]
        what: Any = f"schema id {key}"
    elif payload[:2] == SINGLE_OBJECT_MAGIC and len(payload) >= 10:
        key = payload[2:10]
        body = payload[10:]
        what = f"fingerprint {key.hex()}"
    else:
        raise InputError("not a Confluent-framed or single-object Avro message "
                         f"(starts with {payload[:2].hex() or 'nothing'})", origin)
    schema = schemas.get(key)
    if schema is None:
        raise InputError(f"unknown {what}", origin)
    fo = io.BytesIO(body)
    try:
        if schema.cost.static(len(body), 1) <= avro_bounds.BLOCK_BUDGET:
            datum = fastavro.schemaless_reader(fo, schema.parsed)
        else:  # it might not fit: decoded value by value, its cost counted
            datum = schema.cost.read(fo, [float(avro_bounds.BLOCK_BUDGET)])
    except avro_bounds.OverBudget as over:
        raise InputError(_over_budget("the message", over, 0), origin) from None
    except Exception as error:  # fastavro raises several types, as for a container's block
        # (an OverflowError for a date beyond year 9999 or an int beyond 32 bits, ...). The
        # reader's own text says little ("list index out of range": a union branch or enum
        # index beyond the schema's; nothing at all for EOF): say what broke, and where.
        reason = ("it ends before the datum does" if isinstance(error, EOFError)
                  else "an index beyond the schema's union branches or enum symbols"
                  if isinstance(error, IndexError)
                  else f"{type(error).__name__}: {_flat(error)}")
        raise InputError(f"truncated or corrupt Avro message ({len(body)} bytes after the "
                         f"{what}): {reason}", origin) from None
    if fo.tell() != len(body):
        raise InputError(f"{len(body) - fo.tell()} bytes left over after the message", origin)
    try:
        return message_from_python(datum, schema, origin)
    except ValueError as error:
        raise InputError(f"not a Materialize CDC message: {error}", origin) from None
