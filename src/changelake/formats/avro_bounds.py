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

What that costs as Python objects is bounded by the bytes, but not yet by a budget of its
own (issue 67, open). Measured on CPython 3.11 (tracemalloc peak while `read_all` decodes one
block, fastavro's values and the frozen rows both alive): about 190 bytes a byte for updates
of one boolean or none (an update of 2 bytes becomes a dict, a tuple and a Record), 110 for
two longs, 630 for a column of three nested records, 17 for an array of booleans, 10-20 for
strings and bytes. So one 16 MiB block may take 3 GB, and 10 GB for a schema of nested
records; deeper nesting costs more. A recursive type, which would make it unbounded, is
refused (`recursive_type`).
"""

from __future__ import annotations

import math
from typing import Any

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
