"""Local `changelake decode` of a JSON-lines log against the least any decoder must do.

Input: `--updates` distinct updates (default 300k; `data` has 3 fields: long, nullable string,
double) written by the Writer (batches of 1,000, a progress statement every 10,000 updates),
every message delivered twice, shuffled, as Avro-JSON lines (one message per line). Measured
in the same run, `--repeat` times (median CPU seconds):

* baseline: the minimal work: `orjson.loads` every line, put every update in a `set()` (its
  `data` as sorted-key JSON bytes, which are hashable and are also what is printed), sort the
  set by time, print one line per update;
* `decode_local` (what `changelake decode FILE` runs) without a schema, and with `--schema`.

Output goes to a temporary file in both cases; the outputs are checked to hold the same lines.

    .venv/bin/python benchmarks/bench_local_decode.py [--updates 300000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from changelake.formats.materialize import CdcSchema, write_json_lines
from changelake.local import decode_local
from changelake.protocol import Writer
from changelake.values import freeze

SCHEMA = CdcSchema.for_fields([
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"]},
    {"name": "price", "type": "double"},
])


def make_log(path: Path, typed: Path, n: int, seed: int = 1) -> int:
    """The mangled log as Avro-JSON lines, without a schema (`path`) and with `SCHEMA`
    (`typed`: unions wrapped); returns the number of lines."""
    writer = Writer(batch_size=1000)
    log: list = []
    per_time = 10_000
    for start in range(0, n, per_time):
        t = start // per_time
        writer.extend(
            (freeze({"id": i, "name": None if i % 5 == 0 else f"n{i % 977}",
                     "price": i * 0.25}), t,
             1 if i % 3 else -1)
            for i in range(start, min(n, start + per_time))
        )
        log += writer.finish_through(t)
    log += writer.close()
    log = log + log
    random.Random(seed).shuffle(log)
    with typed.open("wb") as fo:
        write_json_lines(fo, log, SCHEMA)
    with path.open("wb") as fo:
        return write_json_lines(fo, log, None)


def minimal(path: Path, out: Path) -> int:
    """Parse, deduplicate in a set, sort by time, print: what any decoder must do."""
    seen: set[tuple[bytes, int, int]] = set()
    add = seen.add
    dumps, sort_keys = orjson.dumps, orjson.OPT_SORT_KEYS
    with path.open("rb") as lines:
        for line in lines:
            updates = orjson.loads(line).get("array")
            if updates is None:
                continue
            for u in updates:
                add((dumps(u["data"], option=sort_keys), u["time"], u["diff"]))
    with out.open("wb") as fo:
        fo.write(b"".join(
            b'{"data":%s,"time":%d,"diff":%d}\n' % u for u in sorted(seen, key=lambda u: u[1])
        ))
    return len(seen)


def ours(path: Path, out: Path, schema: CdcSchema | None) -> int:
    with out.open("wb") as fo:
        report = decode_local([str(path)], fo, schema=schema)  # type: ignore[arg-type]
    assert report.frontier.is_closed
    return report.updates


def timed(action: Callable[[], int], repeat: int) -> tuple[float, int]:
    """Median CPU seconds of this process (the work is single-threaded Python; CPU time is
    what other jobs on a shared machine disturb least), and the action's result."""
    runs, n = [], 0
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        n = action()
        runs.append(time.process_time() - start)
    return statistics.median(runs), n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-local-decode-") as tmp:
        root = Path(tmp)
        log = root / "log.jsonl"
        typed_log = root / "typed.jsonl"
        lines = make_log(log, typed_log, args.updates)
        size = log.stat().st_size / 1e6
        print(f"updates: {args.updates:,} distinct, {2 * args.updates:,} delivered, {lines:,} "
              f"lines ({size:.1f} MB, shuffled); median of {args.repeat}")
        base, n_base = timed(lambda: minimal(log, root / "base.out"), args.repeat)
        plain, n_plain = timed(lambda: ours(log, root / "plain.out", None), args.repeat)
        typed_base, _ = timed(lambda: minimal(typed_log, root / "typed-base.out"), args.repeat)
        typed, n_typed = timed(lambda: ours(typed_log, root / "typed.out", SCHEMA),
                               args.repeat)
        assert n_base == n_plain == n_typed == args.updates, (n_base, n_plain, n_typed)
        expected = sorted((root / "base.out").read_bytes().splitlines())
        got = [line for line in (root / "plain.out").read_bytes().splitlines()
               if not line.startswith(b'{"frontier"')]
        assert sorted(got) == expected, "decode printed other lines than the baseline"

        def row(label: str, seconds: float, baseline: float | None = None) -> str:
            rate = f"{2 * args.updates / seconds / 1e6:5.2f} M updates/s"
            tail = f"   {baseline / seconds:.2f}x baseline rate" if baseline else ""
            return f"{label:<34} {seconds:7.3f} s  {rate}{tail}"

        print(row("baseline parse+set+sort+print", base))
        print(row("decode, no schema", plain, base) + "  (aim >= 0.50)")
        print(row("baseline, schema-written file", typed_base))
        print(row("decode --schema", typed, typed_base))


if __name__ == "__main__":
    main()
