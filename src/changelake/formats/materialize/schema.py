"""The Materialize CDC schema: the Avro union of an updates array and a progress record, validated
once into a `CdcSchema` with the codecs it needs compiled."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import orjson
from fastavro.schema import fingerprint, to_parsing_canonical_form

from changelake.errors import SchemaError
from changelake.formats import avro_bounds, ocf
from changelake.formats import avro_values as av

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

def _flat(error: Exception) -> str:
    """A library's error message as one line of reasonable length."""
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."
