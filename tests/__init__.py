"""The tests: a package mirroring `src/changelake/` (see `support/__init__.py`)."""
