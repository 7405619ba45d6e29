"""Finish a capture into a lake and dump the lake, in one process (one Spark start-up).

    python tests/pg_lake_worker.py OUT -- capture postgres --lake DIR ... --until-idle S

Runs the `changelake` command line given after `--` in this process (exactly what the console
script runs), then opens the lake on its own metastore and writes to OUT a pickle of
`({table: [row, ...]}, frontier)`: every captured table's current rows, typed as the capture
types values read from PostgreSQL, and the least committed frontier of the tables.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path


def main(out: Path, argv: list[str]) -> int:
    from changelake.capture.postgres.to_lake import _from_spark, consistent_frontier
    from changelake.cli import main as cli
    from changelake.lake.commands import open_lake

    try:
        cli.main(argv, prog_name="changelake", standalone_mode=False)
    except SystemExit as e:  # the command's own exit (an error: its line is on stderr)
        if e.code:
            return int(e.code)
    lake_dir = Path(argv[argv.index("--lake") + 1])
    master = argv[argv.index("--master") + 1] if "--master" in argv else "local[1]"
    lake = open_lake(lake_dir, master=master)
    try:
        tables = {}
        for name in lake.tables():
            table = lake.table(name)
            frame = table.current()
            kinds = [f.dataType for f in frame.schema.fields]
            tables[name] = [tuple(_from_spark(k, v) for k, v in zip(kinds, row, strict=True))
                            for row in frame.collect()]
        frontier = consistent_frontier(lake, list(tables))
    finally:
        lake.spark.stop()
    out.write_bytes(pickle.dumps((tables, frontier)))
    return 0


if __name__ == "__main__":
    split = sys.argv.index("--")
    sys.exit(main(Path(sys.argv[1]), sys.argv[split + 1:]))
