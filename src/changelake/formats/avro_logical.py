"""Avro logical types (decimal, date, time, timestamps, uuid) in changelake's plain form.

The plain form of a logical value is its text: what fastavro's Python value prints as
(`avro_values.python_to_plain`): a decimal as `12.50` (the schema's scale), a date as
`2024-01-02`, a `timestamp-micros` as `2024-01-02T03:04:05.000006+00:00` (UTC), a
`local-timestamp-micros` without an offset, a time as `03:04:05`, a uuid in lower case.

One value has one plain form whatever carried it. An Avro container file or a framed Kafka
message reaches it through fastavro's own readers; the JSON encoding of the Avro spec (the
Materialize docs' Avro JSON lines) carries the underlying value (a decimal's two's-complement
bytes as code points 0-255, a date's day count), and reaches it here through the same
readers, `fastavro.read.LOGICAL_READERS`. Writing goes back through
`fastavro.write.LOGICAL_WRITERS`. So a log read from JSON lines and the same log read from a
container file decode to the same rows, and every writer takes the rows a reader gave.

The logical types are the ones fastavro converts (its keys, `bytes-decimal`, `int-date`, ...).
Any other annotation (an unknown name, a decimal without a precision, `date` on a long) is
ignored, as the Avro specification says a reader must: the value is its underlying type.
(fastavro's container reader instead fails on a decimal without a precision, a `KeyError`
that `read_ocf` reports as a block that does not decode; JSON lines give its bytes.)
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from dataclasses import dataclass
from typing import Any

from fastavro.read import LOGICAL_READERS
from fastavro.write import LOGICAL_WRITERS

_PARSERS: dict[str, Any] = {
    "decimal": decimal.Decimal,
    "date": dt.date.fromisoformat,
    "time-millis": dt.time.fromisoformat,
    "time-micros": dt.time.fromisoformat,
    "timestamp-millis": dt.datetime.fromisoformat,
    "timestamp-micros": dt.datetime.fromisoformat,
    "local-timestamp-millis": dt.datetime.fromisoformat,
    "local-timestamp-micros": dt.datetime.fromisoformat,
    "uuid": uuid.UUID,
}
"""The plain text of each logical type to the Python value fastavro writes."""

_PYTHON_TYPES: dict[str, type | tuple[type, ...]] = {
    "decimal": decimal.Decimal, "date": dt.date, "time-millis": dt.time,
    "time-micros": dt.time, "timestamp-millis": dt.datetime,
    "timestamp-micros": dt.datetime, "local-timestamp-millis": dt.datetime,
    "local-timestamp-micros": dt.datetime, "uuid": uuid.UUID,
}
"""A value already of the Python type (a row straight from Spark or fastavro) is taken as is."""


@dataclass(frozen=True, slots=True)
class Logical:
    """A logical type fastavro converts, over its underlying Avro type."""

    schema: dict[str, Any]  # the annotated schema: {"type": "bytes", "logicalType": ...}
    name: str  # "decimal", "date", ...
    key: str  # fastavro's key: "bytes-decimal", "int-date", ...

    @property
    def underlying(self) -> Any:
        """The Avro type that carries the value: a primitive name, or the fixed schema
        without its annotation."""
        if self.schema["type"] == "fixed":
            return {k: v for k, v in self.schema.items() if k != "logicalType"}
        return self.schema["type"]

    @property
    def carries_bytes(self) -> bool:
        return self.schema["type"] in ("bytes", "fixed")

    def to_plain(self, raw: Any) -> str:
        """The underlying value (bytes, int, str) as the plain text."""
        from changelake.formats.avro_values import python_to_plain

        if self.carries_bytes and isinstance(raw, str):
            raw = raw.encode("latin-1")  # the JSON encoding's code points
        return python_to_plain(LOGICAL_READERS[self.key](raw, self.schema, self.schema))

    def to_python(self, value: Any) -> Any:
        """The plain text (or the Python value itself) as the Python value fastavro writes.
        Raises ValueError for text that is not a value of the type."""
        if isinstance(value, _PYTHON_TYPES[self.name]) and not (
                self.name == "date" and isinstance(value, dt.datetime)):
            return self._exact_decimal(str(value), value) if self.name == "decimal" else value
        if not isinstance(value, str):
            raise ValueError(f"expected {self.name} text, got {type(value).__name__}")
        try:
            parsed = self.from_plain(value)
        except (ValueError, ArithmeticError):
            raise ValueError(f"{value!r} is not a {self.name}") from None
        if self.name == "decimal":
            return self._exact_decimal(value, parsed)
        return parsed

    def from_plain(self, text: str) -> Any:
        """The Python value of plain text, parsed but not checked against the type: what a
        reader made (`to_plain`) is a value of it by construction (a decimal at its scale),
        and `to_python`'s checks cost ten times the parse. An instant without an offset is
        UTC's, not the local time fastavro's writer would take it for."""
        parsed = _PARSERS[self.name](text)
        if self.name in ("timestamp-millis", "timestamp-micros") and parsed.tzinfo is None:
            return parsed.replace(tzinfo=dt.UTC)
        return parsed

    def _exact_decimal(self, text: str, value: decimal.Decimal) -> decimal.Decimal:
        """`value` at the type's scale (`1.5` as `1.50` at scale 2: fastavro's writer takes
        exactly its scale), if the type holds it exactly: finite, no more digits after the
        point than `scale`, none beyond `precision` in all (fastavro's reader rounds to the
        precision: a value written beyond it would come back another)."""
        precision, scale = self.schema["precision"], self.schema.get("scale", 0)
        kind = f"decimal({precision}, {scale})"
        if not value.is_finite():
            raise ValueError(f"{text!r} is not a finite decimal")
        _, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        exact = decimal.Context(prec=len(digits) + abs(exponent) + scale + 1)
        unscaled = value.scaleb(scale, exact)
        if unscaled != unscaled.to_integral_value(context=exact):
            raise ValueError(f"{text!r} has more digits after the point than {kind} holds")
        if len(str(abs(int(unscaled)))) > precision:
            raise ValueError(f"{text!r} has more digits than {kind} holds")
        return decimal.Decimal(int(unscaled)).scaleb(-scale, exact)

    def takes(self, value: Any) -> bool:
        """Whether `value` is the plain form (or the Python value) of a value of this type."""
        try:
            self.to_underlying(value)
        except ValueError:
            return False
        return True

    def to_underlying(self, value: Any) -> Any:
        """The plain text as the underlying value of the JSON encoding (bytes as code points
        0-255). Raises ValueError where the type cannot hold it (a decimal of more digits
        than its scale, say)."""
        python = self.to_python(value)
        try:
            raw = LOGICAL_WRITERS[self.key](python, self.schema)
        except (ValueError, TypeError, OverflowError, ArithmeticError) as error:
            raise ValueError(f"{value!r} does not fit {self.name}: {error}") from None
        return raw.decode("latin-1") if isinstance(raw, bytes | bytearray) else raw


def logical(schema: Any, named: Any) -> Logical | None:
    """The logical type `schema` (or the named type it names) is annotated with, if fastavro
    converts it; None for any other schema."""
    if isinstance(schema, str):
        schema = named.get(schema)
    if not isinstance(schema, dict) or not isinstance(schema.get("logicalType"), str):
        return None
    base = schema.get("type")
    if not isinstance(base, str):
        return None
    name = schema["logicalType"]
    key = f"{base}-{name}"
    if key not in LOGICAL_READERS or name not in _PARSERS:
        return None
    if name == "decimal" and not isinstance(schema.get("precision"), int):
        return None  # fastavro's reader needs a precision; without one it is bytes
    return Logical(schema, name, key)
