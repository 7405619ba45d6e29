"""What `ingest --follow` keeps between micro-batches: the part of the decode left unfinished.

After batch `n`, the follow keeps, in `state/<id>/<n>` of its checkpoint:

* the distinct updates at times at or beyond the frontier reached (`pending`, Parquet, only
  when there are any);
* the progress statements not wholly behind that frontier (they still say how many updates an
  unfinished time must have, or wait for a gap before them to close), and the frontier.

Batch `n + 1` decodes from that state and its own messages, so each batch is a function of
(the state after the batch before it, its messages); `lake/follow.py` says when a state is
written and trusted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from changelake.protocol import Antichain, Progress
from changelake.protocol.reader import progress_from_json, progress_to_json

BATCH_DIGITS = 12
PENDING = "pending"
"""A state's pending updates, as Parquet, when there are any."""


@dataclass(frozen=True)
class FollowState:
    """The state after batch `batch` (see the module docstring)."""

    batch: int
    frontier: Antichain
    statements: tuple[Progress, ...]
    has_pending: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "batch": self.batch,
            "frontier": self.frontier.to_json(),
            "statements": [progress_to_json(p) for p in self.statements],
            "has_pending": self.has_pending,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> FollowState:
        if value.get("version") != 1:
            raise ValueError(f"unknown follow state version {value.get('version')!r}")
        return cls(
            value["batch"],
            Antichain.from_json(value["frontier"]),
            tuple(progress_from_json(p) for p in value["statements"]),
            value["has_pending"],
        )


def state_name(batch: int) -> str:
    """The directory name of batch `batch`'s state: its number, zero-padded to sort."""
    return f"{batch:0{BATCH_DIGITS}d}"


def latest_state(state_dir: Path, before: int | None = None) -> tuple[FollowState, Path] | None:
    """The last state in `state_dir` (before batch `before`, if given), with its directory."""
    if not state_dir.is_dir():
        return None
    batches = sorted(
        int(p.name) for p in state_dir.iterdir() if p.name.isdigit() and p.is_dir()
    )
    if before is not None:
        batches = [b for b in batches if b < before]
    if not batches:
        return None
    path = state_dir / state_name(batches[-1])
    return FollowState.from_json(json.loads((path / "state.json").read_text())), path
