"""The modules of `changelake.lake` import one another only downwards (the order of the
package docstring), at module level: no cycle, and no import hidden inside a function (imports
for type annotations, in a module-level `if TYPE_CHECKING:`, count as module level)."""

from __future__ import annotations

import ast
from pathlib import Path

import changelake.lake

LAKE = Path(changelake.lake.__file__).parent
ORDER = ["identifier", "layout", "follow_lag", "arrow", "schema", "sql", "scd2", "commit",
         "table", "compact", "changes", "catalog", "sources", "metastore", "commands",
         "kafka_ingest", "kafka_changefeed", "follow", "follow_changefeed", "report",
         "sql_endpoint"]


def lake_imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(module of changelake.lake imported, whether at module level)."""
    body = list(tree.body)  # type: ignore[attr-defined]
    for node in list(body):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and \
                node.test.id == "TYPE_CHECKING":
            body += node.body
    top = {id(node) for node in body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("changelake.lake."):
            found.append((node.module.split(".")[2], id(node) in top))
    return found


def test_every_module_is_placed_in_the_order():
    assert sorted(p.stem for p in LAKE.glob("*.py") if p.stem != "__init__") == sorted(ORDER)


def test_imports_point_down_and_are_at_module_level():
    for module in ORDER:
        tree = ast.parse((LAKE / f"{module}.py").read_text())
        for target, at_top in lake_imports(tree):
            assert at_top, f"{module} imports {target} inside a function"
            assert ORDER.index(target) < ORDER.index(module), f"{module} imports {target}"
