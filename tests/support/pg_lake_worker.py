"""Finish a capture into a lake and dump the lake, in one process (one Spark start-up).

    python tests/support/pg_lake_worker.py OUT -- capture postgres --lake DIR ... --until-idle S

Runs the `changelake` command line given after `--` in this process (exactly what the console
script runs), then opens the lake on its own metastore and writes to OUT a pickle of
`({table: Counter of rows}, frontier)`: every captured table's current rows, typed as the
capture types values read from PostgreSQL, and the least committed frontier of the tables.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.pg_workload import lake_rows


def main(out: Path, argv: list[str]) -> int:
    from changelake.capture.postgres.to_lake import consistent_frontier
    from changelake.cli import main as cli
    from changelake.lake.api import open_lake

    try:
        cli.main(argv, prog_name="changelake", standalone_mode=False)
    except SystemExit as e:  # the command's own exit (an error: its line is on stderr)
        if e.code:
            return int(e.code)
    given = argv[argv.index("--lake") + 1]
    lake_dir = given if "://" in given else Path(given)  # a lake URI (`s3a://`) as it is
    master = argv[argv.index("--master") + 1] if "--master" in argv else "local[1]"
    lake = open_lake(lake_dir, master=master)
    try:
        names = tuple(lake.tables())
        tables, frontier = lake_rows(lake, names), consistent_frontier(lake, names)
    finally:
        lake.spark.stop()
    out.write_bytes(pickle.dumps((tables, frontier)))
    return 0


if __name__ == "__main__":
    split = sys.argv.index("--")
    sys.exit(main(Path(sys.argv[1]), sys.argv[split + 1:]))
