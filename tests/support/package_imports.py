"""Which modules of a package a module imports, from its syntax tree: for the tests that hold
a package's modules to an order (`test_lake_imports.py`, `test_spark_changefeed_imports.py`)."""

from __future__ import annotations

import ast


def package_imports(tree: ast.AST, package: str) -> list[tuple[str, bool]]:
    """(module of `package` imported, whether at module level) for each import in `tree`:
    `from package.module import ...` and `from package import module` alike, a subpackage
    named as one module. Imports for type annotations, in a module-level
    `if TYPE_CHECKING:`, count as module level."""
    body = list(tree.body)  # type: ignore[attr-defined]
    for node in list(body):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and \
                node.test.id == "TYPE_CHECKING":
            body += node.body
    top = {id(node) for node in body}
    depth = len(package.split("."))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module.startswith(package + "."):
            found.append((node.module.split(".")[depth], id(node) in top))
        elif node.module == package:
            found += [(alias.name, id(node) in top) for alias in node.names]
    return found
