"""Ingest Debezium's topics into a lake, a table at a time, and dump the lake, in one process.

    python tests/support/debezium_lake_worker.py SPEC.json OUT

SPEC: `{"lake": DIR, "bootstrap": B, "prefix": P, "master": M, "tables": {NAME: [KEY...]},
"until_idle": S}`. For each table, runs exactly what a user runs (the `changelake` command
line, in this process): `ingest --lake DIR --table NAME [--key K] --from debezium --kafka B
--topic P.NAME,P.transaction --follow --until-idle S`; then opens the lake and writes to OUT a
pickle of `{table: [row tuples]}` (every table's current rows) and each run's seconds.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path


def main(spec_path: Path, out: Path) -> int:
    from changelake.cli import main as cli
    from changelake.lake.api import open_lake

    spec = json.loads(spec_path.read_text())
    seconds = {}
    for name, key in spec["tables"].items():
        argv = ["ingest", "--lake", spec["lake"], "--table", name, "--from", "debezium",
                "--kafka", spec["bootstrap"], "--topic",
                f"{spec['prefix']}.{name},{spec['prefix']}.transaction", "--follow",
                "--until-idle", str(spec["until_idle"]), "--trigger-seconds", "0.5",
                "--master", spec["master"]]
        if key:
            argv += ["--key", ",".join(key)]
        started = time.monotonic()
        try:
            cli.main(argv, prog_name="changelake", standalone_mode=False)
        except SystemExit as e:  # the command's own exit (an error: its line is on stderr)
            if e.code:
                return int(e.code)
        seconds[name] = round(time.monotonic() - started, 1)
    lake = open_lake(Path(spec["lake"]), master=spec["master"])
    try:
        tables = {name: [tuple(row) for row in lake.table(name).current().collect()]
                  for name in spec["tables"]}
    finally:
        lake.spark.stop()
    out.write_bytes(pickle.dumps((tables, seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
