"""The format a new table takes: Delta Lake unless `CHANGELAKE_TABLE_FORMAT` (or `--format`)
says otherwise; a value that names no format is refused in one line."""

from __future__ import annotations

import pytest

from changelake.errors import LakeError
from changelake.lake.table import STORAGE_ENV, default_storage


def test_delta_unless_the_environment_says_otherwise(monkeypatch) -> None:
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    assert default_storage() == "delta"
    monkeypatch.setenv(STORAGE_ENV, " Hive ")
    assert default_storage() == "hive"
    monkeypatch.setenv(STORAGE_ENV, "iceberg")
    with pytest.raises(LakeError, match="'iceberg' is not a table format"):
        default_storage()
