"""The table schema a user supplies for a changefeed (`--table-schema FILE`).

YDB JSON records name no columns (the key is a positional array) and schemaless Debezium JSON
loses logical types, so both need the table described from outside:

    {"columns": [{"name": "id", "type": "Uint64"}, {"name": "name", "type": "Utf8"}],
     "primary_key": ["id"]}

`type` uses YDB type names (`Optional<...>` is accepted and unwrapped). For schemaless Debezium
a column may also carry `"debezium"`: the Kafka Connect field schema Debezium would have sent,
e.g. `{"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
"parameters": {"scale": "2"}}`, so that values decode as with shape A.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from changelake.errors import InputError, Location, SchemaError
from changelake.formats import lines as jsonl


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str | None = None
    debezium: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TableSchema:
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def check_keys(self, keys: Sequence[str]) -> None:
        """Key columns must be columns of the schema, named exactly: a SchemaError before any
        record is read, whichever path converts the feed (the encoder, Spark)."""
        unknown = [k for k in keys if k not in self.names]
        if unknown:
            raise SchemaError(f"key columns {unknown} are not in the table schema "
                              f"{list(self.names)}")

    def column(self, name: str) -> Column | None:
        for c in self.columns:
            if c.name == name:
                return c
        return None

    @classmethod
    def from_json(cls, value: Any, source: str = "table schema") -> TableSchema:
        """Validate the JSON form; every mistake is a SchemaError naming what is wrong."""
        if not isinstance(value, dict):
            raise SchemaError(f"{source}: expected an object with columns and primary_key")
        raw_columns = value.get("columns")
        if not isinstance(raw_columns, list) or not raw_columns:
            raise SchemaError(f"{source}: columns must be a non-empty array")
        columns: list[Column] = []
        for i, c in enumerate(raw_columns):
            if isinstance(c, str):
                columns.append(Column(c))
                continue
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise SchemaError(f"{source}: columns[{i}] must be an object with a name")
            kind = c.get("type")
            if kind is not None and not isinstance(kind, str):
                raise SchemaError(f"{source}: columns[{i}].type must be a string")
            debezium = c.get("debezium")
            if debezium is not None and not isinstance(debezium, dict):
                raise SchemaError(f"{source}: columns[{i}].debezium must be an object")
            columns.append(Column(c["name"], kind, debezium))
        names = [c.name for c in columns]
        if len(set(names)) != len(names):
            raise SchemaError(f"{source}: duplicate column names in {names}")
        key = value.get("primary_key", [])
        if not isinstance(key, list) or not all(isinstance(k, str) for k in key):
            raise SchemaError(f"{source}: primary_key must be an array of column names")
        missing = [k for k in key if k not in names]
        if missing:
            raise SchemaError(f"{source}: primary_key columns {missing} are not in columns")
        return cls(tuple(columns), tuple(key))


def read_table_json(path: Path | str) -> dict[str, Any]:
    """A table schema file's JSON, checked by `TableSchema.from_json` (errors name the file),
    as written: the Spark paths take it so."""
    try:
        raw = jsonl.loads(Path(path).read_bytes())
    except jsonl.JsonError as error:
        raise InputError(str(error), Location(str(path))) from None
    TableSchema.from_json(raw, str(path))
    return raw
