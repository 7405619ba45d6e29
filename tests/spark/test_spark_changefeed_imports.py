"""The modules of `changelake.spark.changefeed` import one another only downwards: which
batches each path takes (`dispatch.py`, with the `Unsupported` any step may raise) first, the
steps next, then the checked conversion both formats end in, then one module per format, and
the conversion on one path or the other (`pipeline.py`) on top. A step that imported a format's
module, or the conversion that imported a step above it, would tie the layers `pipeline.py`'s
docstring describes into a cycle; this keeps the folder telling the architecture. Imports
inside functions count too (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import changelake.spark.changefeed
from tests.support.package_imports import package_imports

CHANGEFEED = Path(changelake.spark.changefeed.__file__).parent
PACKAGE = "changelake.spark.changefeed"
ORDER = ["dispatch", "read", "temporal", "times", "progress", "types", "parse", "keyed", "unkeyed",
         "ydb", "barriers", "steps", "conversion", "moves", "debezium_path", "ydb_path",
         "python_path", "pipeline"]


def test_every_module_is_placed_in_the_order():
    modules = [p.stem for p in CHANGEFEED.glob("*.py") if p.stem != "__init__"]
    packages = [p.name for p in CHANGEFEED.iterdir() if (p / "__init__.py").exists()]
    assert sorted(modules + packages) == sorted(ORDER)


def test_imports_point_down():
    for module in ORDER:
        path = CHANGEFEED / module
        files = sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
        for file in files:
            imported = package_imports(ast.parse(file.read_text()), PACKAGE)
            for target in {target for target, _ in imported} - {module}:
                assert ORDER.index(target) < ORDER.index(module), \
                    f"{file.name} ({module}) imports {target}, a module above it"
