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

from changelake.formats.materialize.frames import (
    confluent_header,
    decode_framed,
    encode_confluent,
    encode_single_object,
)
from changelake.formats.materialize.read import (
    expand_paths,
    message_from_python,
    read_all,
    read_json_lines,
    read_messages,
    read_ocf,
    read_ocf_schema,
    read_stream,
)
from changelake.formats.materialize.schema import (
    CONFLUENT_MAGIC,
    NAMESPACE,
    OCF_MAGIC,
    PROGRESS_BRANCH,
    SINGLE_OBJECT_MAGIC,
    CdcSchema,
    cdc_schema,
    cdc_schema_around,
    load_schema,
    load_schema_text,
)
from changelake.formats.materialize.values import (
    SetAside,
    Sink,
    message_from_avro_json,
    message_to_avro_json,
    message_to_plain,
    progress_from_plain,
    updates_from_plain,
)
from changelake.formats.materialize.write import (
    UpdateTooLarge,
    avro_datums,
    json_lines,
    write_json_lines,
    write_ocf,
)

__all__ = [
    "CONFLUENT_MAGIC",
    "NAMESPACE",
    "OCF_MAGIC",
    "PROGRESS_BRANCH",
    "SINGLE_OBJECT_MAGIC",
    "CdcSchema",
    "SetAside",
    "Sink",
    "UpdateTooLarge",
    "avro_datums",
    "cdc_schema",
    "cdc_schema_around",
    "confluent_header",
    "decode_framed",
    "encode_confluent",
    "encode_single_object",
    "expand_paths",
    "json_lines",
    "load_schema",
    "load_schema_text",
    "message_from_avro_json",
    "message_from_python",
    "message_to_avro_json",
    "message_to_plain",
    "progress_from_plain",
    "read_all",
    "read_json_lines",
    "read_messages",
    "read_ocf",
    "read_ocf_schema",
    "read_stream",
    "updates_from_plain",
    "write_json_lines",
    "write_ocf",
]
