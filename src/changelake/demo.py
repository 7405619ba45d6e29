"""`changelake demo`: the protocol's promise, shown end to end on generated data.

A history is generated, written by two writers that batch it differently, and mangled as an
at-least-once log would (duplicates, reordering, re-batching). The log goes through the real
codecs (Avro OCF and JSON-lines files on disk) and is decoded; the result must equal the
history exactly, or the demo fails with a non-zero exit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from changelake.formats.materialize import CdcSchema, read_all, write_json_lines, write_ocf
from changelake.protocol import Antichain, collect
from changelake.simulate import History, mangle, random_history, write

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
    workdir.mkdir(parents=True, exist_ok=True)
    files = 8
    chunk = -(-len(log) // files)
    for i in range(files):
        part = log[i * chunk : (i + 1) * chunk]
        if i % 2:
            with open(workdir / f"part-{i:02d}.avro", "wb") as fo:
                write_ocf(fo, part, schema)
        else:
            with open(workdir / f"part-{i:02d}.jsonl", "wb") as fo:
                write_json_lines(fo, part, schema)
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
