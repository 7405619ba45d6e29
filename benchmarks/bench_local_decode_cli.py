"""`changelake decode FILE` as a process, end to end, against the least any decoder must do.

`bench_local_decode.py` times `decode_local` inside one process on one favourable shape. This
one times what a user waits for: the whole `python -m changelake decode FILE > out` process,
start to last line, wall time, on logs shaped like the Materialize docs' example (seed 000:
nullable columns written as Avro-JSON unions, `"price": {"int": 12}`).

Inputs: `--updates` distinct updates (default 300k; `data` has 4 fields: `id` long, `name`
string, `price` int, `weight` double), a time every `--per-time` updates, written by the
Writer in messages of 50 and of 1,000 updates, every message delivered twice, shuffled, as
Avro-JSON lines. Each size is written twice:

* plain: every value a plain scalar (schema: the four types as they are);
* union: the last three columns nullable (`["null", T]`), a fifth of them null, the others
  wrapped as Avro JSON writes a union (`{"int": 12}`).

Each file is decoded without a schema and with `--schema` (the schema it was written with):
eight figures. The baseline, per file, is a minimal script run as a process on the same file:
`orjson.loads` of every line, every update into a `set()` (its `data` as sorted-key JSON bytes),
sort by time, print one line per update with one `orjson.dumps`-made line each. Each round
runs every process once, the baseline and decodes alternating in order between rounds;
printed: the median wall seconds of `--rounds` rounds, and the ratio baseline / decode (the
decode's rate as a fraction of the baseline's: the aim is >= 0.50).

The decode's lines are checked against the baseline's (same number of update lines; for the
plain file without a schema, the same lines). With `--reference SRC`, each decode's output is
also checked to be byte-for-byte what the sources in SRC print (say, `/work/main/src`).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_local_decode_cli.py \
        [--updates 300000] [--rounds 3] [--sizes 50,1000] [--reference DIR] [--profile DIR]

With `--profile DIR`, each decode also runs once under cProfile (not timed), its stats saved
in DIR, and the top functions by internal time printed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from changelake.formats.materialize import CdcSchema, write_json_lines
from changelake.protocol import Writer
from changelake.values import freeze

PLAIN_FIELDS = [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "price", "type": "int"},
    {"name": "weight", "type": "double"},
]
UNION_FIELDS = [
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"]},
    {"name": "price", "type": ["null", "int"]},
    {"name": "weight", "type": ["null", "double"]},
]

MINIMAL = b'''\
import sys
import orjson

seen = set()
add = seen.add
dumps, sort_keys = orjson.dumps, orjson.OPT_SORT_KEYS
with open(sys.argv[1], "rb") as lines:
    for line in lines:
        updates = orjson.loads(line).get("array")
        if updates is None:
            continue
        for u in updates:
            add((dumps(u["data"], option=sort_keys), u["time"], u["diff"]))
sys.stdout.buffer.write(b"".join(
    b'{"data":%s,"time":%d,"diff":%d}\\n' % u for u in sorted(seen, key=lambda u: u[1])
))
'''


def row(i: int, union: bool) -> dict:
    if union and i % 5 == 0:
        return {"id": i, "name": None, "price": None, "weight": None}
    return {"id": i, "name": f"n{i % 977}", "price": i % 10_007, "weight": i * 0.25}


def make_log(path: Path, n: int, per_time: int, batch: int, union: bool, seed: int = 1) -> int:
    """The mangled log (every message twice, shuffled) as Avro-JSON lines written with the
    schema of `union`; returns the number of lines."""
    writer = Writer(batch_size=batch)
    log: list = []
    for start in range(0, n, per_time):
        t = start // per_time
        writer.extend((freeze(row(i, union)), t, 1 if i % 3 else -1)
                      for i in range(start, min(n, start + per_time)))
        log += writer.finish_through(t)
    log += writer.close()
    log = log + log
    random.Random(seed).shuffle(log)
    with path.open("wb") as fo:
        return write_json_lines(fo, log, schema(union))


def schema(union: bool) -> CdcSchema:
    return CdcSchema.for_fields(UNION_FIELDS if union else PLAIN_FIELDS)


def run(command: list[str], out: Path, env: dict[str, str]) -> float:
    """Wall seconds of one process, its standard output to `out`."""
    with out.open("wb") as fo:
        start = time.perf_counter()
        done = subprocess.run(command, stdout=fo, stderr=subprocess.PIPE, env=env, check=False)
        seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{command} failed: {done.stderr.decode(errors='replace')}")
    return seconds


def update_lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines()
            if not line.startswith(b'{"frontier"')]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=300_000)
    parser.add_argument("--per-time", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="50,1000")
    parser.add_argument("--reference", type=Path, default=None,
                        help="sources (a src folder) whose decode output must be the same")
    parser.add_argument("--profile", type=Path, default=None,
                        help="profile each decode once, stats to this folder")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    env = dict(os.environ)
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-decode-cli-") as tmp:
        root = Path(tmp)
        minimal = root / "minimal.py"
        minimal.write_bytes(MINIMAL)
        cases = []  # (label, log, schema file or None)
        for union in (False, True):
            schema_file = root / f"{'union' if union else 'plain'}.avsc"
            schema_file.write_bytes(orjson.dumps(schema(union).avro))
            for batch in sizes:
                kind = "union" if union else "plain"
                log = root / f"{kind}-{batch}.jsonl"
                lines = make_log(log, args.updates, args.per_time, batch, union)
                print(f"{log.name}: {lines:,} lines, {log.stat().st_size / 1e6:.1f} MB")
                cases.append((f"{kind}, messages of {batch}", log, schema_file))
        print(f"updates: {args.updates:,} distinct, {2 * args.updates:,} delivered (every "
              f"message twice, shuffled), a time every {args.per_time:,}; "
              f"median wall seconds of {args.rounds} rounds; python {sys.version.split()[0]}")

        def commands(log: Path, schema_file: Path) -> dict[str, list[str]]:
            decode = [python, "-m", "changelake", "decode"]
            return {"baseline": [python, str(minimal), str(log)],
                    "no schema": [*decode, str(log)],
                    "--schema": [*decode, "--schema", str(schema_file), str(log)]}

        times: dict[tuple[int, str], list[float]] = {}
        for r in range(args.rounds):
            for c, (_, log, schema_file) in enumerate(cases):
                order = list(commands(log, schema_file).items())
                if r % 2:
                    order.reverse()
                for what, command in order:
                    out = root / f"{c}-{what}.out"
                    times.setdefault((c, what), []).append(run(command, out, env))
        for c, (label, _, _) in enumerate(cases):
            base = update_lines(root / f"{c}-baseline.out")
            for what in ("no schema", "--schema"):
                got = update_lines(root / f"{c}-{what}.out")
                assert len(got) == len(base) == args.updates, (label, what, len(got))
                if what == "no schema" and "plain" in label:
                    assert sorted(got) == sorted(base), f"{label}: other lines than baseline"
        if args.reference is not None:
            reference = {**env, "PYTHONPATH": str(args.reference)}
            for c, (label, log, schema_file) in enumerate(cases):
                for what, command in commands(log, schema_file).items():
                    if what == "baseline":
                        continue
                    out = root / f"{c}-{what}.ref"
                    run(command, out, reference)
                    same = out.read_bytes() == (root / f"{c}-{what}.out").read_bytes()
                    assert same, f"{label}, {what}: output differs from {args.reference}'s"
            print(f"outputs: byte-for-byte the same as {args.reference}'s")

        print(f"\n{'log':<26} {'baseline':>9} {'decode':>14} {'ratio':>7}"
              f" {'decode --schema':>16} {'ratio':>7}")
        for c, (label, _, _) in enumerate(cases):
            base = statistics.median(times[c, "baseline"])
            plain = statistics.median(times[c, "no schema"])
            typed = statistics.median(times[c, "--schema"])
            print(f"{label:<26} {base:8.2f}s {plain:13.2f}s {base / plain:6.2f}x"
                  f" {typed:15.2f}s {base / typed:6.2f}x")
        print("ratio: baseline seconds / decode seconds (aim >= 0.50)")

        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            for label, log, schema_file in cases:
                for what, command in commands(log, schema_file).items():
                    if what == "baseline":
                        continue
                    name = f"{label.replace(', messages of ', '-')}-" \
                           f"{'schema' if what == '--schema' else 'schemaless'}.prof"
                    stats = args.profile / name
                    profiled = [python, "-m", "cProfile", "-o", str(stats), *command[1:]]
                    run(profiled, root / "profiled.out", env)
                    print(f"\n== {label}, {what}: {stats}")
                    print_top(stats)


def print_top(stats_path: Path, n: int = 12) -> None:
    import io
    import pstats

    text = io.StringIO()
    stats = pstats.Stats(str(stats_path), stream=text)
    stats.sort_stats("tottime").print_stats(n)
    lines = text.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    total = next(line for line in lines if "function calls" in line)
    print(total.strip())
    for line in lines[start:start + n + 1]:
        print(line[:150])


if __name__ == "__main__":
    main()
