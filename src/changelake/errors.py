"""Typed errors, each carrying the location of the input that caused it.

Every error that bad input can cause is a `ChangelakeError`. The CLI turns one into a single
readable line and exit status 2, so the location must be part of the message: a user with a
million-line changefeed needs "file:line: rule broken", not a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Location:
    """Where a piece of input came from. Any field may be unknown (None)."""

    file: str | None = None
    line: int | None = None
    offset: int | None = None
    index: int | None = None  # position of an item inside a message (e.g. update #3)

    def __str__(self) -> str:
        parts: list[str] = []
        parts.append(self.file if self.file is not None else "<input>")
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        if self.index is not None:
            parts.append(f"item {self.index}")
        return ", ".join(parts) if len(parts) > 1 or self.file is not None else parts[0]

    def with_index(self, index: int) -> Location:
        return Location(self.file, self.line, self.offset, index)


class ChangelakeError(Exception):
    """Base class: a failure the user can act on, reported as one line."""

    def __init__(self, message: str, location: Location | None = None) -> None:
        self.reason = message
        self.location = location
        super().__init__(f"{location}: {message}" if location is not None else message)


class InputError(ChangelakeError):
    """Input that cannot be parsed: bad JSON, wrong types, unknown shape, truncated Avro."""


class SchemaError(ChangelakeError):
    """A schema that is invalid, or data/schemas that do not fit each other."""


class ProtocolError(ChangelakeError):
    """Well-formed messages that break a rule of the CDCv2 protocol.

    `rule` is a short stable identifier (e.g. "conflicting-diff") so that lenient-mode reports
    and tests can name the rule without parsing prose.
    """

    def __init__(self, rule: str, message: str, location: Location | None = None) -> None:
        self.rule = rule
        super().__init__(f"[{rule}] {message}", location)


class ChangefeedError(InputError):
    """A Debezium or YDB changefeed message that cannot be understood or breaks its format."""


class LakeError(ChangelakeError):
    """A lake table operation that cannot proceed (missing table, incompatible schema, ...)."""


class ChangelakeWarning(RuntimeWarning):
    """Something the user should know that changes no result (a slower way taken, say): one
    line, which the CLI prints as `changelake: warning: ...`."""
