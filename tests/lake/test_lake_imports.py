"""The modules of `changelake.lake` import one another only downwards (the order of the
package docstring), at module level: no cycle, and no import hidden inside a function (imports
for type annotations, in a module-level `if TYPE_CHECKING:`, count as module level)."""

from __future__ import annotations

import ast
from pathlib import Path

import changelake.lake
from tests.support.package_imports import package_imports

LAKE = Path(changelake.lake.__file__).parent
ORDER = ["files", "identifier", "layout", "follow_lag", "follow_state", "arrow", "schema", "sql",
         "scd2", "delta_storage", "current_follower", "commit", "key_rule", "table", "compact",
         "changes", "catalog", "sources", "metastore", "api", "ingest",
         "kafka_ingest", "kafka_changefeed", "follow", "follow_changefeed", "report",
         "sql_endpoint"]


def test_every_module_is_placed_in_the_order():
    assert sorted(p.stem for p in LAKE.glob("*.py") if p.stem != "__init__") == sorted(ORDER)


def test_imports_point_down_and_are_at_module_level():
    for module in ORDER:
        tree = ast.parse((LAKE / f"{module}.py").read_text())
        for target, at_top in package_imports(tree, "changelake.lake"):
            assert at_top, f"{module} imports {target} inside a function"
            assert ORDER.index(target) < ORDER.index(module), f"{module} imports {target}"
