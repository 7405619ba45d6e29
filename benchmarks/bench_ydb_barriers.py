"""YDB's barrier rule timed apart: `barriers._below` and `barriers.unrepeated_below` on a
parsed, checkpointed feed, optionally against another version of `barriers.py` in the same
process, alternating.

The feed is `bench_ingest.py`'s YDB one (two partitions, a barrier every thousand events, a
restart that re-sends the last 2% of each partition: those are the records below a barrier,
which `unrepeated_below` must find repeated). Each round times, for each version:

* `below`: the records below their file's barrier found and checkpointed (the Java scan,
  `scan_below`, where that version has it, else the window);
* `unrepeated`: the whole rule (finding them again, and the joins that look the records
  below up among the earlier ones).

`--against` names a `barriers.py` (another commit's, `git show REV:src/...`), imported as a
module of its own; its `_below` may take the items alone (the older signature).
`--broadcast-below` sets `barriers.BROADCAST_BELOW` for this run.

    python benchmarks/bench_ydb_barriers.py --events 1100000 --rounds 3
    git show HEAD~1:src/changelake/spark/changefeed/barriers.py > /tmp/old_barriers.py
    python benchmarks/bench_ydb_barriers.py --events 11000000 --rounds 2 \\
        --against /tmp/old_barriers.py
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import YDB_TABLE, in_child, write_ydb_feed


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("barriers_against", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _below(module: ModuleType, items: Any) -> int:
    """The records below a barrier, checkpointed and counted: by the scan where that version
    has one and it applies (`scan_below`), else by the window (`_below` of either
    signature)."""
    scan = getattr(module, "scan_below", None)
    if scan is not None:
        scanned = scan(items, ())
        if scanned is not None:
            return scanned.count
    below = module._below
    if len(inspect.signature(below).parameters) > 1:
        return below(items, ()).localCheckpoint().count()
    return below(items).localCheckpoint().count()


def _unrepeated(module: ModuleType, items: Any, size: int) -> bool:
    """The whole rule, given the batch's size where that version takes it (as the ingest)."""
    rule = module.unrepeated_below
    if len(inspect.signature(rule).parameters) > 2:
        return rule(items, 1, size)
    return rule(items, 1)


def _timed(label: str, action: Callable[[], Any]) -> None:
    start = time.perf_counter()
    result = action()
    print(f"  {label:34s} {time.perf_counter() - start:7.2f} s   {result}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=110_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--against", type=Path, default=None,
                        help="another version of barriers.py to time in the same process")
    parser.add_argument("--broadcast-below", type=int, default=None)
    args = parser.parse_args()

    from changelake.formats.tableschema import TableSchema
    from changelake.lake import lake_session
    from changelake.spark.changefeed import barriers, ydb
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.checkpoint import stored

    versions: list[tuple[str, ModuleType]] = [("this", barriers)]
    if args.against is not None:
        versions.append(("against", _module(args.against)))
    if args.broadcast_below is not None:
        for _, module in versions:
            module.BROADCAST_BELOW = args.broadcast_below

    work = Path(tempfile.mkdtemp(prefix="bench-barriers-"))
    try:
        feed = [work / "partition-0.jsonl", work / "partition-1.jsonl"]
        lines = in_child(write_ydb_feed, feed, args.events)
        spark = lake_session(work / "lake", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        schema = TableSchema.from_json(YDB_TABLE)
        columns = ydb.ydb_columns(schema, ["id"])
        items = stored(ydb.java_items(read_lines(spark, [str(p) for p in feed]).bounded,
                                      schema, columns).drop("_below", "_deferred", "_facts"))
        print(f"{lines:,} YDB lines in 2 partitions, parsed and checkpointed; "
              f"master {args.master}")
        for n in range(1, args.rounds + 1):
            print(f"round {n}")
            for name, module in versions:
                _timed(f"{name}: below", lambda m=module: _below(m, items))
                _timed(f"{name}: unrepeated", lambda m=module: _unrepeated(m, items, lines))
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
