"""What one Avro datum may become in memory: every count it carries is paid for in its bytes.

`ocf.py` bounds the bytes (a block, and so a message, holds at most `ocf.MAX_BLOCK_BYTES`);
this module bounds what those bytes may decode to. Every Avro value takes at least one byte,
except values of a *zero-width* type: `null`, a `fixed` of size 0, and a record whose fields
are all zero-width (a record of no fields too). An array's block says how many items follow;
if its items take no bytes, nothing stops the count: `{"type": "array", "items": "null"}`
with a block count of 2^40 is a datum of a dozen bytes that fastavro decodes into a list of
2^40 `None`s (terabytes, and hours, before anything fails). So a schema with an array of
zero-width items is refused (`zero_width_array`) wherever a Materialize CDC schema is taken:
the `--schema` file, a container file's header, a schema registry's answer (`CdcSchema`).

With that refused, every item of every array takes at least one byte, so an array decodes
into at most as many items as its datum has bytes left (fastavro reads items one by one and
stops at the end of the bytes: it allocates nothing for a count it has not read). Other
counts need no rule:

* a map's entries: each key is a string, at least one byte (its length);
* an enum, even of one symbol, and a union: each value is an index, at least one byte;
* bytes, string and fixed: their length is read from the datum, never allocated beyond it.

Hence the invariant: **the number of Avro values a datum of n bytes decodes into is at most
n, plus the zero-width values (records, nulls) nested in those, a number fixed by the
schema.**

What that costs as Python objects is bounded by the bytes, and held to a budget of its own:
`BLOCK_BUDGET` (256 MiB) a block or framed message, by the cost model of `cost` (an affine
bound a type, CPython's object sizes rounded up; the worst case of a schema is `Cost.static`
per byte: for rows of three nullable longs about 380 bytes a byte, for a row of 300 nulls
about 17,000). A block that may exceed the budget is decoded value by value with its cost
counted, and refused in one line as it reaches it (`Cost.read`); the writers cut messages
and close blocks to stay within it (`Cost.weigh`). Measured on CPython 3.11 (tracemalloc
peak while `read_all` decodes one block, fastavro's values and the frozen rows both alive):
about 190 bytes a byte for updates of one boolean or none (an update of 2 bytes becomes a
dict, a tuple and a Record), 110 for two longs, 630 for a column of three nested records, 17
for an array of booleans, 10-20 for strings and bytes. So one 16 MiB block could take 3 GB,
and 10 GB for a schema of nested records, more for wider rows of nulls: the budget now
refuses it. A recursive type, which would make it unbounded, is refused (`recursive_type`).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import fastavro

from changelake.formats import avro_values as av

_WIDTH = {"null": 0, "boolean": 1, "int": 1, "long": 1, "float": 4, "double": 8,
          "bytes": 1, "string": 1}


def min_width(schema: Any, named: av.Named, _open: frozenset[str] = frozenset()) -> float:
    """The fewest bytes a value of `schema` takes in Avro binary (`math.inf` for a record
    that contains itself with nothing in between: no value of it can be written)."""
    resolved = av._resolve(schema, named)
    if isinstance(resolved, str):
        return _WIDTH[resolved]
    if isinstance(resolved, list):
        return 1  # the branch index
    kind = resolved["type"]
    if kind in ("array", "map", "enum"):
        return 1  # the block count (0 for an empty one), the symbol index
    if kind == "fixed":
        return resolved["size"]
    name = av.type_name(resolved, named)
    if name in _open:
        return math.inf
    inner = _open | {name}
    return sum((min_width(f["type"], named, inner) for f in resolved["fields"]), 0)


def zero_width_array(schema: Any, named: av.Named, path: str = "") -> tuple[str, str] | None:
    """The first array of `schema` whose items take no bytes, as (its path, the item type's
    name); None if there is none. Named types are visited once each."""
    return _find(schema, named, path, set())


def _find(schema: Any, named: av.Named, path: str, seen: set[str]) -> tuple[str, str] | None:
    resolved = av._resolve(schema, named)
    if isinstance(resolved, str):
        return None
    if isinstance(resolved, list):
        for branch in resolved:
            found = _find(branch, named, path, seen)
            if found is not None:
                return found
        return None
    kind = resolved["type"]
    if kind in ("record", "error"):
        name = av.type_name(resolved, named)
        if name in seen:
            return None
        seen.add(name)
        for field in resolved["fields"]:
            sub = f"{path}.{field['name']}" if path else field["name"]
            found = _find(field["type"], named, sub, seen)
            if found is not None:
                return found
        return None
    if kind == "array":
        items = resolved["items"]
        if min_width(items, named) == 0:
            return path or "the array", av.type_name(items, named)
        return _find(items, named, f"{path}[]", seen)
    if kind == "map":
        return _find(resolved["values"], named, f"{path}[]", seen)
    return None


def recursive_type(schema: Any, named: av.Named) -> str | None:
    """The name of the first named type that contains itself (a linked list's node, say);
    None if there is none. changelake's converters walk a schema to compile it, and a datum
    of such a type may nest as deep as it has bytes: such schemas are refused."""
    return _cycle(schema, named, (), set())


def _cycle(schema: Any, named: av.Named, open_: tuple[str, ...], done: set[str]) -> str | None:
    resolved = av._resolve(schema, named)
    if isinstance(resolved, str):
        return None
    if isinstance(resolved, list):
        branches = resolved
    elif resolved["type"] == "array":
        branches = [resolved["items"]]
    elif resolved["type"] == "map":
        branches = [resolved["values"]]
    elif resolved["type"] in ("record", "error"):
        name = av.type_name(resolved, named)
        if name in open_:
            return name
        if name in done:
            return None
        found = None
        for field in resolved["fields"]:
            found = found or _cycle(field["type"], named, (*open_, name), done)
        done.add(name)
        return found
    else:
        return None
    for branch in branches:
        found = _cycle(branch, named, open_, done)
        if found is not None:
            return found
    return None


# ------------------------------------------------------------ the decoded-size budget

#: The most one block (or one framed message) may decode to, as `Cost` estimates it: the
#: fastavro values and the frozen rows made of them, both alive while the block's messages
#: are made. A block over it is refused in one line (`InputError`: the file, the block's
#: offset, the datum that reached it, and this rule); the writers cut messages and close
#: blocks so that what they write stays within it (`materialize.avro_datums`,
#: `ocf.write_container`).
BLOCK_BUDGET = 256 * 2**20

#: Python bytes of what fastavro makes of one value, CPython 3.11 on 64 bits, rounded up,
#: as (a, b): a value of n bytes takes at most a * n + b. None, booleans and an enum's symbol
#: (the schema's own string) are shared objects.
_LEAF_COST: dict[str, tuple[float, float]] = {
    "null": (0, 0), "boolean": (0, 0), "int": (0, 36), "long": (0, 36),
    "float": (0, 24), "double": (0, 24),
    "bytes": (1, 40),  # 33 + n
    "string": (4, 80),  # 49 + n for ASCII, up to 76 + 4 a character (UCS-4)
}
#: A dict of k entries takes at most 184 + 40 k bytes (64 empty; 184 to 5 entries, 1584 at
#: 43, 3328 at 86: measured with `sys.getsizeof`); its frozen `Record`, 40 + 64 k (a pointer
#: and a 2-tuple of 56 bytes a field). Counted twice (`FROZEN_FACTOR`), 184 + 56 k covers both.
_DICT, _DICT_ENTRY = 184, 56
_LIST, _LIST_ITEM = 64, 16  # 56 + 8 a pointer, over-allocated by at most an eighth and 6
#: A logical type's value (a date, a datetime, a Decimal, a UUID) and its plain form:
#: beyond its underlying type's cost, at most this (a UUID: 56 + a 36-byte int + its text).
_LOGICAL = (2, 240)
#: The frozen rows (`Record`s of (name, value) pairs, tuples) take no more than the
#: fastavro values they are made of, while both are alive: every cost is counted twice.
FROZEN_FACTOR = 2


@dataclass(frozen=True, slots=True)
class Affine:
    """A value that takes n bytes in Avro costs at most `a * n + b` bytes as Python objects."""

    a: float
    b: float

    def __call__(self, n: int) -> float:
        return self.a * n + self.b


class OverBudget(Exception):
    """Internal: a block's decoded values reached `BLOCK_BUDGET` (as `Cost` counts them)."""

    def __init__(self, spent: float) -> None:
        self.spent = spent
        super().__init__(f"{spent:.0f}")


def cost(schema: Any, named: av.Named) -> Affine:
    """The cost of a value of `schema` as Python objects, as an affine bound in its bytes
    (fastavro's value and its frozen form: `FROZEN_FACTOR` is applied by `Cost`, not here).

    Every array item and map entry takes a byte or more (zero-width items are refused:
    `zero_width_array`), so a container's per-item costs are paid for by its bytes: an array
    of items costing at most a n + b, each at least w bytes, costs at most
    (a + (b + 16) / w) n + 64. Recursive types are refused: `math.inf` for one."""
    return _cost(schema, named, frozenset())


def _cost(schema: Any, named: av.Named, open_: frozenset[str]) -> Affine:
    logical = isinstance(schema, dict) and "logicalType" in schema
    resolved = av._resolve(schema, named)
    if isinstance(resolved, str):
        found = Affine(*_LEAF_COST[resolved])
    elif isinstance(resolved, list):
        branches = [_cost(b, named, open_) for b in resolved] or [Affine(0, 0)]
        found = Affine(max(c.a for c in branches), max(c.b for c in branches))
    else:
        kind = resolved["type"]
        if kind == "enum":
            found = Affine(0, 8)
        elif kind == "fixed":
            found = Affine(1, 40)
        elif kind == "array":
            items = _cost(resolved["items"], named, open_)
            width = max(min_width(resolved["items"], named), 1e-300)
            found = Affine(items.a + (items.b + _LIST_ITEM) / width, _LIST)
        elif kind == "map":
            values = _cost(resolved["values"], named, open_)
            width = 1 + min_width(resolved["values"], named)  # a key takes a byte or more
            found = Affine(max(4, values.a) + (_LEAF_COST["string"][1] + _DICT_ENTRY
                                              + values.b) / width, _DICT)
        else:
            name = av.type_name(resolved, named)
            if name in open_:
                return Affine(math.inf, math.inf)
            fields = [_cost(f["type"], named, open_ | {name}) for f in resolved["fields"]]
            found = Affine(max((c.a for c in fields), default=0),
                           _DICT + _DICT_ENTRY * len(fields) + sum(c.b for c in fields))
    if logical:
        found = Affine(found.a + _LOGICAL[0], found.b + _LOGICAL[1])
    return found


def _read_long(fo: IO[bytes]) -> int:
    shift = value = 0
    for _ in range(10):
        byte = fo.read(1)
        if not byte:
            raise EOFError("the datum ends in the middle of a number")
        b = byte[0]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1)
        shift += 7
    raise ValueError("not a valid Avro long (more than 10 bytes)")


class Cost:
    """What the datums of one Materialize CDC schema may cost, and a reader that holds a block
    to `BLOCK_BUDGET` whatever its bytes claim.

    `static(n, count)` bounds what a block of n bytes and `count` datums may cost whatever it
    holds: one within the budget is decoded by fastavro at once. Another is decoded by
    `read`, which takes the containers (unions, records, arrays and maps holding arrays or
    maps) apart itself and hands fastavro only what holds no container (an update whose
    columns hold none, a long), counting each value's cost as it is made: it stops with
    `OverBudget` as soon as the block's values reach the budget, having made at most that
    plus one container-free value (at most 4 bytes a byte of the block beyond it: a string).
    The values it makes are fastavro's own (records as dicts, unions as their branch's value).
    """

    def __init__(self, avro: Any, named: av.Named) -> None:
        self.datum = cost(avro, named)
        self._named = named
        self._read = self._compile(avro)
        array = av._resolve(avro[0], named)
        self.item = cost(array["items"], named)

    def static(self, n: int, count: int) -> float:
        return FROZEN_FACTOR * (self.datum.a * n + self.datum.b * count)

    def weigh(self, datum: bytes) -> float:
        """What `read` may count for `datum`, one datum as this project's writers encode it
        (an updates message as one block of items: fastavro's, `avro_datums`'s framing):
        its items' count is read from its head, so many small updates weigh more than one
        large one of the same bytes."""
        fo = io.BytesIO(datum)
        try:
            if _read_long(fo) == 0:
                count = _read_long(fo)
                if count >= 0:
                    return self.weigh_updates(count, len(datum))
        except (EOFError, ValueError):
            pass
        return self.static(len(datum), 1)

    def weigh_updates(self, count: int, n: int) -> float:
        """What `read` may count for an updates datum of n bytes holding `count` updates."""
        return FROZEN_FACTOR * (_LIST + self.item.a * n + (self.item.b + _LIST_ITEM) * count)

    def read(self, fo: IO[bytes], budget: list[float]) -> Any:
        """One datum from `fo`, its cost taken from `budget[0]` (`OverBudget` when spent)."""
        return self._read(fo, budget)

    def _compile(self, schema: Any) -> Callable[[IO[bytes], list[float]], Any]:
        named = self._named
        resolved = av._resolve(schema, named)
        if not _holds_container(schema, named, frozenset()):
            if resolved == "long" and not (isinstance(schema, dict)
                                           and "logicalType" in schema):
                return _charged_long
            parsed = fastavro.parse_schema(standalone(schema, named))
            leaf = cost(schema, named)
            a, b = FROZEN_FACTOR * leaf.a, FROZEN_FACTOR * leaf.b
            reader = fastavro.schemaless_reader

            def read_leaf(fo: IO[bytes], budget: list[float]) -> Any:
                start = fo.tell()
                value = reader(fo, parsed)
                _spend(budget, a * (fo.tell() - start) + b)
                return value

            return read_leaf
        if isinstance(resolved, list):
            branches = [self._compile(b) for b in resolved]

            def read_union(fo: IO[bytes], budget: list[float]) -> Any:
                index = _read_long(fo)
                if not 0 <= index < len(branches):
                    raise IndexError(f"union branch {index} of {len(branches)}")
                return branches[index](fo, budget)

            return read_union
        kind = resolved["type"]
        if kind == "array":
            item = self._compile(resolved["items"])

            def read_array(fo: IO[bytes], budget: list[float]) -> Any:
                _spend(budget, FROZEN_FACTOR * _LIST)
                out = []
                while (count := _block_count(fo)) != 0:
                    for _ in range(count):
                        _spend(budget, FROZEN_FACTOR * _LIST_ITEM)
                        out.append(item(fo, budget))
                return out

            return read_array
        if kind == "map":
            value = self._compile(resolved["values"])
            key_a, key_b = _LEAF_COST["string"]

            def read_map(fo: IO[bytes], budget: list[float]) -> Any:
                _spend(budget, FROZEN_FACTOR * _DICT)
                out = {}
                while (count := _block_count(fo)) != 0:
                    for _ in range(count):
                        size = _read_long(fo)
                        if size < 0:
                            raise ValueError(f"a map key of negative length {size}")
                        key = fo.read(size)
                        if len(key) != size:
                            raise EOFError("the datum ends in a map key")
                        _spend(budget, FROZEN_FACTOR * (key_a * (size + 1) + key_b
                                                        + _DICT_ENTRY))
                        out[key.decode()] = value(fo, budget)
                return out

            return read_map
        fields = [(f["name"], self._compile(f["type"])) for f in resolved["fields"]]
        charge = FROZEN_FACTOR * (_DICT + _DICT_ENTRY * len(fields))

        def read_record(fo: IO[bytes], budget: list[float]) -> Any:
            _spend(budget, charge)
            return {name: read(fo, budget) for name, read in fields}

        return read_record


def _spend(budget: list[float], amount: float) -> None:
    budget[0] -= amount
    if budget[0] < 0:
        raise OverBudget(BLOCK_BUDGET - budget[0])


def _charged_long(fo: IO[bytes], budget: list[float]) -> int:
    value = _read_long(fo)
    _spend(budget, FROZEN_FACTOR * _LEAF_COST["long"][1])
    return value


def _block_count(fo: IO[bytes]) -> int:
    """An array's or map's block count (a negative one is followed by the block's size)."""
    count = _read_long(fo)
    if count < 0:
        _read_long(fo)
        count = -count
    return count


def _holds_container(schema: Any, named: av.Named, seen: frozenset[str]) -> bool:
    resolved = av._resolve(schema, named)
    if isinstance(resolved, str):
        return False
    if isinstance(resolved, list):
        return any(_holds_container(b, named, seen) for b in resolved)
    kind = resolved["type"]
    if kind in ("array", "map"):
        return True
    if kind in ("record", "error"):
        name = av.type_name(resolved, named)
        if name in seen:
            return False
        return any(_holds_container(f["type"], named, seen | {name})
                   for f in resolved["fields"])
    return False


def standalone(schema: Any, named: av.Named) -> Any:
    """`schema` as a schema of its own, for fastavro to parse a part of a larger schema alone:
    every named type it uses is defined where it first occurs, under a name of its own
    (`changelake_part.t0`, ...): fastavro's values carry no type names (records are dicts,
    enums their symbols, unions their branch's value), and fully qualified names leave
    nothing to the namespaces of the larger schema."""
    return _standalone(schema, named, {})


def _standalone(schema: Any, named: av.Named, defined: dict[int, str]) -> Any:
    if isinstance(schema, list):
        return [_standalone(b, named, defined) for b in schema]
    if isinstance(schema, str):
        if schema in av.PRIMITIVES:
            return schema
        schema = av._resolve(schema, named)
    kind = schema["type"]
    if isinstance(kind, dict | list) or (isinstance(kind, str) and kind not in (
            "record", "error", "enum", "fixed", "array", "map")):
        return {**schema, "type": _standalone(kind, named, defined)}
    if kind == "array":
        return {**schema, "items": _standalone(schema["items"], named, defined)}
    if kind == "map":
        return {**schema, "values": _standalone(schema["values"], named, defined)}
    if id(schema) in defined:
        return defined[id(schema)]
    name = defined[id(schema)] = f"changelake_part.t{len(defined)}"
    out = {k: v for k, v in schema.items() if k not in ("namespace", "aliases")}
    out["name"] = name
    if kind in ("record", "error"):
        out["fields"] = [{**f, "type": _standalone(f["type"], named, defined)}
                         for f in schema["fields"]]
    return out
