"""Which schema decodes a framed message: the ids and fingerprints a topic's frames may carry.

A Confluent frame names its writer's schema by a registry id; `NO_REGISTRY_ID` (0, an id no
Confluent registry assigns: they count from 1) is what the sink writes when there is no
registry, and means "the reader brings the schema" (`--schema FILE`). An Avro single-object
frame names its schema by fingerprint, which the schema file answers too.

Any other id is looked up in the registry when there is one; without one it is unknown (a bad
record): decoding a registry's message with a schema file the writer may not have used could
misread it silently.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from changelake.formats.materialize import CdcSchema
from changelake.kafka.registry import SchemaRegistry

NO_REGISTRY_ID = 0


class FrameSchemas(Mapping[int | bytes, CdcSchema]):
    """The mapping `formats.materialize.decode_framed` takes, resolved on demand: a missing
    key is an unknown schema. Registry failures (`RegistryError`) propagate: they are not the
    record's fault."""

    def __init__(self, schema: CdcSchema | None, registry: SchemaRegistry | None) -> None:
        self.schema = schema
        self.registry = registry
        self._fingerprint = schema.fingerprint() if schema is not None else None
        self._seen: dict[int | bytes, CdcSchema] = {}

    def __getitem__(self, key: int | bytes) -> CdcSchema:
        found = self._seen.get(key)
        if found is not None:
            return found
        if isinstance(key, bytes):
            if self.schema is None or key != self._fingerprint:
                raise KeyError(key)
            found = self.schema
        elif key == NO_REGISTRY_ID and self.schema is not None:
            found = self.schema
        elif self.registry is not None:
            found = self.registry.schema(key)
        if found is None:
            raise KeyError(key)
        self._seen[key] = found
        return found

    def __iter__(self) -> Iterator[int | bytes]:
        return iter(self._seen)

    def __len__(self) -> int:
        return len(self._seen)
