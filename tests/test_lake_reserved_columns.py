"""A data column named as one of the lake's own (`_time`, `_diff`): one `changelake: error:`
line naming it and what to do, exit status 2, no table made (it was an internal error:
Spark's "Reference `_time` is ambiguous")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLI = [str(Path(sys.executable).parent / "changelake")]


def test_ingest_of_a_cdc_log_with_a_time_column_is_one_line(tmp_path: Path) -> None:
    feed = tmp_path / "t.jsonl"
    feed.write_text(
        '{"array":[{"data":{"id":1,"_time":5},"time":0,"diff":1}]}\n'
        '{"com.materialize.cdc.progress":{"lower":[0],"upper":[1],"counts":[{"time":0,'
        '"count":1}]}}\n')
    lake = tmp_path / "lake"
    done = subprocess.run([*CLI, "ingest", "--lake", str(lake), "--table", "t", "--key", "id",
                           "--master", "local[1]", str(feed)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "changelake: error: the input has a data column named '_time', a name the lake keeps "
        "for its own columns (_time, _diff, _bucket); rename the column at the source (or in "
        "the feed's schema) before ingesting it"]
    made = [p.name for p in (lake / "tables").rglob("*")] if (lake / "tables").exists() else []
    assert set(made) <= {"default", "t", "_lock"}  # no table: at most the writer's lock
