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
from typing import Any

from changelake.protocol import Antichain, Progress
from changelake.protocol.reader import progress_from_json, progress_to_json

BATCH_DIGITS = 12
PENDING = "pending"
"""A state's pending updates, as Parquet, when there are any."""
STATE_FILE = "state.json"
"""A state's frontier and statements; written last, it marks the state whole."""


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


def latest_state(state_dir: Any, before: int | None = None) -> tuple[FollowState, Any] | None:
    """The last whole state in `state_dir` (a `Path`, or a `RemotePath` of a checkpoint on a
    remote store), before batch `before` if given, with its directory. A state directory
    without its `state.json`, written last, is a crashed attempt's, not whole: passed over
    (on a remote store a state is written in place, see `follow.CommitBatches._temporary`)."""
    if not state_dir.is_dir():
        return None
    batches = sorted(
        (int(p.name) for p in state_dir.iterdir() if p.name.isdigit()), reverse=True)
    for batch in batches:
        if before is not None and batch >= before:
            continue
        path = state_dir / state_name(batch)
        try:
            text = (path / STATE_FILE).read_text()
        except (FileNotFoundError, NotADirectoryError):
            continue
        return FollowState.from_json(json.loads(text)), path
    return None
