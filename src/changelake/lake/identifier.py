"""Table and column names: checked once where they enter, then passed inward as values.

A name is what both Hive and a file path accept without quoting or escaping: an identifier
`[A-Za-z_][A-Za-z0-9_]*`. Hive compares names case-insensitively and stores them lower-cased,
so we do the same: `Shop.Orders` and `shop.orders` are one table, in one directory
`tables/shop/orders`. Anything else (a path, `..`, a quote, a backtick, a space, a `*`, an
empty part) is a `LakeError` raised before anything is created, written or deleted.

Column names follow the same rule (`check_name`, applied where schemas enter the lake: see
`schema.evolve`), so no name needs escaping anywhere, although the SQL quotes them anyway.

`TableIdentifier.parse` is the one place a table name is split; everything inward takes the
resulting value (its database, name, quoted SQL form and directory), as PyIceberg passes an
`Identifier`. The directory is resolved (symlinks followed) and verified to lie inside the
lake's `tables/` directory each time it is asked for, so a symlink planted in the lake cannot
send a write or a garbage collection elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from changelake.errors import ChangelakeError, LakeError

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_DATABASE = "default"
HISTORY_SUFFIX = "_history"


RULE = "use letters, digits and _, not starting with a digit"


def check_name(text: str, what: str, error: type[ChangelakeError] = LakeError) -> str:
    """`text` if it is an identifier (see the module docstring), else an `error` naming
    `what` it is and the rule."""
    if not isinstance(text, str) or IDENTIFIER.fullmatch(text) is None:
        raise error(f"{what} {text!r} is not a valid name: {RULE}")
    return text


@dataclass(frozen=True, slots=True)
class TableIdentifier:
    """A validated table name: lower-cased database and name, both identifiers."""

    database: str
    name: str

    def __post_init__(self) -> None:
        check_name(self.database, "database name")
        check_name(self.name, "table name")
        if self.database != self.database.lower() or self.name != self.name.lower():
            raise LakeError(f"table identifier {self.database}.{self.name} is not lower-cased "
                            "(use TableIdentifier.parse)")

    @classmethod
    def parse(cls, text: str | TableIdentifier) -> TableIdentifier:
        """`NAME` (in database `default`) or `DATABASE.NAME`, each an identifier."""
        if isinstance(text, TableIdentifier):
            return text
        if not isinstance(text, str):
            raise LakeError(f"table name {text!r} is not a string")
        parts = text.split(".")
        if len(parts) > 2:
            raise LakeError(f"table name {text!r} must be NAME or DATABASE.NAME")
        database = check_name(parts[0], "database name").lower() if len(parts) == 2 \
            else DEFAULT_DATABASE
        name = check_name(parts[-1], "table name").lower()
        return cls(database, name)

    @property
    def quoted(self) -> str:
        """The SQL form, `` `db`.`name` `` (identifiers need no escaping inside backticks)."""
        return f"`{self.database}`.`{self.name}`"

    @property
    def display(self) -> str:
        """As users write it: `name` in the default database, else `db.name`."""
        return self.name if self.database == DEFAULT_DATABASE else f"{self.database}.{self.name}"

    def __str__(self) -> str:
        return self.display

    def history(self) -> TableIdentifier:
        """The SCD type 2 history view of this table, `NAME_history` in the same database."""
        return TableIdentifier(self.database, self.name + HISTORY_SUFFIX)

    def directory(self, tables: Path) -> Path:
        """This table's directory under a lake's `tables/` directory, resolved and verified to
        lie inside it (a LakeError otherwise)."""
        root = tables.resolve()
        path = (root / self.database / self.name).resolve()
        if path.parent.parent != root or not path.is_relative_to(root):
            raise LakeError(f"table {self.display}: its directory {path} is not inside the "
                            f"lake's tables directory {root}; nothing was written")
        return path
