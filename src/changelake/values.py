"""Rows as hashable values.

The protocol deduplicates on `(data, time)`, so `data` must be hashable; rows arrive as JSON
objects or Avro records (dicts). `freeze` turns a plain-JSON value into an immutable one that
hashes and compares by content; `thaw` turns it back. A record keeps its field order (the
schema's order), so two rows with the same fields in a different order are different values:
freeze with `fields=` to impose one order when the input order is not meaningful.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Sequence
from typing import Any

NAN = float("nan")
"""The one NaN that frozen rows hold. `nan != nan`, and since Python 3.10 a NaN hashes by
identity, so two NaN objects would make two equal rows different keys; containers compare
by identity first, so with one shared NaN object equal rows deduplicate again."""

NONFINITE_TEXT = {"NaN": NAN, "Infinity": math.inf, "-Infinity": -math.inf}
"""How JSON, which has no such numbers, carries them (Jackson's and Avro-Java's spelling)."""


def nonfinite_text(value: float) -> str:
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def json_safe(value: Any) -> Any:
    """Plain JSON `value` (dicts, lists, scalars) with NaN and the infinities as their strings
    (`NONFINITE_TEXT`), as `decode` prints them: orjson would write null, which is SQL NULL's
    spelling. `thaw(json_safe=True)` does the same for frozen values."""
    if type(value) is float:
        return value if math.isfinite(value) else nonfinite_text(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def float32_text(value: float) -> str:
    """The shortest decimal text that reads back, as a float32, to `value` rounded to float32
    (`1.1`, not `1.100000023841858`): what PostgreSQL, Spark's `show()` and Avro-Java print
    for a `real` / `FloatType` / Avro `float`. A float32 widened to a double (as Python, Arrow,
    PySpark and fastavro hand it over) would print the double's digits, which name the
    float32's exact binary value, never the number that was written. Finite values only.

    numpy's float32 prints the shortest such text (Dragon4's unique mode), in C: 1.5 us a
    value against 18 us for trying 1 to 9 digits in Python until one reads back (random float32
    bit patterns; a local `decode` of a float column pays it once a value)."""
    text = str(_numpy_float32()(value))
    return text[:-2] if text.endswith(".0") else text  # "100000", as %g writes it


@functools.cache
def _numpy_float32() -> Any:
    """numpy's float32 type, imported at the first float32 (not by every command's start)."""
    import numpy

    return numpy.float32


def float32_value(value: float) -> float:
    """`value` (a float32, widened) as the double `float32_text` reads as, so that a JSON
    writer, `str` and `repr` print the float32's shortest text; it is still the same float32
    (`struct.pack("f", ...)` gives the same bytes). NaN (the one `NAN`) and the infinities stay
    what they are. Applied where rows leave for the user and the column's type is known to be
    32-bit: a double column's values are never passed here."""
    if not math.isfinite(value):
        return NAN if value != value else value
    return float(float32_text(value))


class Record(tuple):
    """A frozen JSON object: a tuple of `(name, value)` pairs. Hashes like a tuple (fast)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Record(" + ", ".join(f"{k}={v!r}" for k, v in self) + ")"

    def get(self, name: str, default: Any = None) -> Any:
        for key, value in self:
            if key == name:
                return value
        return default

    def names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self)


def freeze(value: Any, fields: Sequence[str] | None = None) -> Hashable:
    """Plain JSON (dicts, lists, scalars) to hashable: dict -> Record, list -> tuple.

    With `fields`, a top-level dict becomes a Record with exactly those fields in that order
    (missing ones are None), so that key order in the input does not matter.
    """
    if isinstance(value, dict):
        if fields is not None:
            return Record((name, freeze(value.get(name))) for name in fields)
        return Record((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if type(value) is float and value != value:
        return NAN
    return value


def thaw(value: Any, *, json_safe: bool = False) -> Any:
    """The inverse of `freeze`: Record -> dict, tuple -> list. With `json_safe`, NaN and the
    infinities become their strings (see `NONFINITE_TEXT`), which JSON writers would turn
    into null."""
    if isinstance(value, Record):
        return {k: thaw(v, json_safe=json_safe) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v, json_safe=json_safe) for v in value]
    if json_safe and type(value) is float and not math.isfinite(value):
        return nonfinite_text(value)
    return value
