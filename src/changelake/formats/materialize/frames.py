"""Single Materialize CDC messages framed for Kafka: Confluent (magic byte 0, 4-byte schema id)
and Avro single-object encoding (`C3 01`, 8-byte CRC-64-AVRO fingerprint)."""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping
from typing import Any

import fastavro

from changelake.errors import InputError, Location
from changelake.formats import avro_bounds
from changelake.formats.materialize.read import _over_budget, message_from_python
from changelake.formats.materialize.schema import (
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_MAGIC,
    CdcSchema,
    _flat,
)
from changelake.formats.materialize.write import _python_datum
from changelake.protocol.messages import Message


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
