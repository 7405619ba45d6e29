"""Materialize CDC codec rates: Avro OCF and Avro-JSON lines, to and from protocol messages.

Baselines in the same run, on the same files: fastavro's own reader iterating the OCF (no
conversion to rows), and `orjson.loads` of every JSON line (no validation). The ratios show
what our validation and row freezing cost on top of the raw parsers. Writing likewise:
`write_ocf` against fastavro's writer of the same records made beforehand, and
`write_json_lines` against `orjson.dumps` of the same Avro-JSON values made beforehand.

    .venv/bin/python benchmarks/bench_codecs.py [--updates N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import fastavro
import orjson

from changelake.formats.materialize import CdcSchema, read_all, write_json_lines, write_ocf
from changelake.protocol import Updates, Writer
from changelake.values import Record

FIELDS = [{"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]},
          {"name": "price", "type": ["null", "double"]}]


def messages(n: int) -> list:
    writer = Writer(batch_size=500)
    out: list = []
    for start in range(0, n, 10_000):
        t = start // 10_000
        writer.extend((Record((("id", i), ("name", f"item-{i % 1000}"),
                               ("price", None if i % 5 == 0 else i / 7))), t, 1)
                      for i in range(start, min(n, start + 10_000)))
        out += writer.finish_through(t)
    return out


def clock(fn) -> tuple[float, int]:
    start = time.perf_counter()
    n = fn()
    return time.perf_counter() - start, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=300_000)
    args = parser.parse_args()
    schema = CdcSchema.for_fields(FIELDS)
    log = messages(args.updates)
    with tempfile.TemporaryDirectory() as tmp:
        ocf, jsonl = Path(tmp) / "log.avro", Path(tmp) / "log.jsonl"
        with open(ocf, "wb") as fo:
            write_ocf(fo, log, schema)
        with open(jsonl, "wb") as fo:
            write_json_lines(fo, log, schema)

        def count_updates(path: Path, with_schema: bool) -> int:
            return sum(len(m.updates) if isinstance(m, Updates) else 0
                       for m in read_all([path], schema=schema if with_schema else None))

        def raw_avro() -> int:
            with open(ocf, "rb") as fo:
                return sum(len(d) if isinstance(d, list) else 0 for d in fastavro.reader(fo))

        def raw_json() -> int:
            with open(jsonl, "rb") as fo:
                return sum(len(o.get("array", ())) for o in map(orjson.loads, fo))

        rows = [
            ("Avro OCF, fastavro reader (baseline)", ocf, raw_avro),
            ("Avro OCF -> messages", ocf, lambda: count_updates(ocf, True)),
            ("JSON lines, orjson.loads (baseline)", jsonl, raw_json),
            ("JSON lines -> messages, schema-checked", jsonl, lambda: count_updates(jsonl, True)),
            ("JSON lines -> messages, no schema", jsonl, lambda: count_updates(jsonl, False)),
        ]
        from changelake.formats.materialize import message_to_avro_json
        from changelake.formats.materialize.write import _python_datum

        datums = [_python_datum(m, schema) for m in log]
        avro_json = [message_to_avro_json(m, schema) for m in log]

        def write_raw_avro() -> int:
            with open(Path(tmp) / "w.avro", "wb") as fo:
                fastavro.writer(fo, schema.parsed, datums)
            return args.updates

        def write_avro() -> int:
            with open(Path(tmp) / "w.avro", "wb") as fo:
                write_ocf(fo, log, schema)
            return args.updates

        def write_raw_json() -> int:
            with open(Path(tmp) / "w.jsonl", "wb") as fo:
                for value in avro_json:
                    fo.write(orjson.dumps(value) + b"\n")
            return args.updates

        def write_json() -> int:
            with open(Path(tmp) / "w.jsonl", "wb") as fo:
                write_json_lines(fo, log, schema)
            return args.updates

        rows += [
            ("write: fastavro writer (baseline)", ocf, write_raw_avro),
            ("write: messages -> Avro OCF", ocf, write_avro),
            ("write: orjson.dumps (baseline)", jsonl, write_raw_json),
            ("write: messages -> JSON lines", jsonl, write_json),
        ]
        print(f"{args.updates:,} updates in {len(log):,} messages")
        baseline = 0.0
        for label, path, fn in rows:
            seconds, n = clock(fn)
            assert n == args.updates, (label, n)
            size = path.stat().st_size / 1e6
            if "baseline" in label:
                baseline = seconds
            ratio = f"{baseline / seconds:5.2f}x baseline rate" if "baseline" not in label else ""
            print(f"{label:42s} {len(log) / seconds:9,.0f} msg/s {n / seconds / 1e6:6.2f} "
                  f"M updates/s {size / seconds:7.1f} MB/s  {ratio}")


if __name__ == "__main__":
    main()
