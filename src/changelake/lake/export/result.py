"""`ExportResult`: what one export run did, whatever the target format."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExportResult:
    """One export of lake table `table` to `target` (a `kind` table).

    `before` is the lake frontier the target held before the run (Antichain JSON; None: the
    target was new), `after` the one it holds now. `mode` is "full" (the whole table was
    written: the first run, or the changes since `before` were compacted away), "incremental"
    (only the changes were applied) or "none" (the target was already at the table's frontier:
    nothing was written). `inserted`, `updated`, `deleted` count the target's rows as its
    commit reports them (an unkeyed row whose multiplicity changes downwards is deleted and
    its remaining copies inserted). `version` is the target's version holding `after`."""

    table: str
    kind: str
    target: str
    before: list | None
    after: list
    mode: str
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    version: int | None = None

    def line(self) -> str:
        before = "new" if self.before is None else str(self.before)
        if self.mode == "none":
            return (f"export {self.table} to {self.kind} {self.target}: already at frontier "
                    f"{self.after} ({self.kind} version {self.version}); nothing to do")
        return (f"export {self.table} to {self.kind} {self.target}: frontier {before} -> "
                f"{self.after}, {self.mode}: {self.inserted} inserted, {self.updated} updated, "
                f"{self.deleted} deleted ({self.kind} version {self.version})")
