"""The protocol demo: a history written by two writers that batch it differently, mangled as an
at-least-once log would (duplicates, reordering, re-batching), carried through the real codecs
(Avro OCF and JSON-lines files) and decoded; it must equal the history exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from changelake.formats.materialize import CdcSchema, read_all
from changelake.protocol import Antichain, collect
from changelake.simulate import History, mangle, random_history, write, write_log_files

DEMO_FIELDS = [{"name": "id", "type": "long"}, {"name": "v", "type": ["null", "long"]}]


@dataclass(frozen=True, slots=True)
class DemoResult:
    changes: int
    truth: int
    messages_written: int
    messages_delivered: int
    files: int
    recovered: int
    frontier: Antichain
    matches: bool


def run_protocol_demo(workdir: Path, *, seed: int = 0, updates: int = 20_000,
                      times: int = 200) -> DemoResult:
    rng = random.Random(seed)
    history: History = random_history(rng, updates=updates, times=times, keys=updates // 10)
    streams = [write(history, batch_size=256), write(history, batch_size=97, finish_every=3)]
    log = mangle(streams, rng, duplicate=0.5)
    schema = CdcSchema.for_fields(DEMO_FIELDS)
    files = 8
    chunk = -(-len(log) // files)
    write_log_files(workdir, [log[i * chunk : (i + 1) * chunk] for i in range(files)], schema)
    got = collect(read_all([workdir]))
    truth = history.truth
    return DemoResult(
        changes=len(history.changes),
        truth=len(truth),
        messages_written=sum(len(s) for s in streams),
        messages_delivered=len(log),
        files=files,
        recovered=len(got.updates),
        frontier=got.frontier,
        matches=sorted(got.updates) == sorted(truth) and got.frontier.is_closed,
    )
