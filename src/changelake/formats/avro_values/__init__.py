"""Avro values in three forms, and the schema-directed conversions between them.

* **Avro JSON**: the JSON encoding of the Avro spec, which the Materialize docs use: a union value
  that is not null is wrapped as `{"<branch type name>": value}`, bytes are strings of code
  points 0-255.
* **Python Avro**: what fastavro reads and writes (bytes as `bytes`, logical types as Decimal,
  datetime, UUID ...).
* **Plain JSON**: what changelake hands to users and stores in rows: unions unwrapped, bytes as
  the same 0-255 strings as Avro JSON (so the plain form is lossless and printable), logical
  types as their ISO/decimal strings, from any carrier (`avro_logical.py`).

Conversions validate as they go and raise `ValueError` with a path such as `data.price`, so the
caller can name file, line and field.
"""

from __future__ import annotations

from changelake.formats.avro_values.compiled import (
    Converter,
    Invalid,
    compile_avro_json,
    compile_avro_json_rows,
    compile_python,
    compile_to_avro_json,
)
from changelake.formats.avro_values.generic import (
    INT_RANGE,
    LONG_RANGE,
    PRIMITIVES,
    Named,
    Schema,
    compile_plain_python,
    freeze_unwrapped,
    from_avro_json,
    named_types,
    plain_to_python,
    python_to_plain,
    to_avro_json,
    type_name,
    unwrap_unions_heuristically,
)
from changelake.formats.avro_values.generic import (
    _resolve as _resolve,  # the generic path's, which readers of schemas use too
)

__all__ = [
    "INT_RANGE",
    "LONG_RANGE",
    "PRIMITIVES",
    "Converter",
    "Invalid",
    "Named",
    "Schema",
    "compile_avro_json",
    "compile_avro_json_rows",
    "compile_plain_python",
    "compile_python",
    "compile_to_avro_json",
    "freeze_unwrapped",
    "from_avro_json",
    "named_types",
    "plain_to_python",
    "python_to_plain",
    "to_avro_json",
    "type_name",
    "unwrap_unions_heuristically",
]
