"""The Python path's values between Python and Spark: the Spark type of a parsed value
(`infer_kind`), whether a value fits its column's type (`fits`, `misfit`: a value Arrow would
refuse inside a worker, where no line can be named), and its Arrow form on the way back
(`to_arrow`, `arrow_type`). Changes travel between the steps pickled (`change_at`, `restore`).
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from changelake.formats.change import NAN, Change, _Unchanged
from changelake.spark_arrow import arrow_of

if TYPE_CHECKING:
    import pyarrow as pa


def infer_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint" if -(2**63) <= value < 2**63 else "decimal(20,0)"
    if isinstance(value, float):
        return "double"
    return "string"


def fits(value: Any, kind: str) -> bool:
    """Can `value` (as parsed) go into a column of this Spark type? What Arrow would otherwise
    refuse inside a worker, with no line to name."""
    if value is None or isinstance(value, _Unchanged):
        return True
    if kind == "bigint":
        return type(value) is int and -(2**63) <= value < 2**63
    if kind == "decimal(20,0)":
        return type(value) is int and -(10**20) < value < 10**20
    if kind == "double":
        return type(value) in (int, float)
    if kind == "boolean":
        return type(value) is bool
    return isinstance(value, str)


def misfit(change: Change, kinds: dict[str, str]) -> str | None:
    for what, image in (("after", change.after), ("before", change.before)):
        for name, value in (image or {}).items():
            kind = kinds.get(name)
            if kind is not None and not fits(value, kind):
                return (f"column {name} of the {what} image is {value!r}, not a {kind} (the "
                        "column's type: the table schema's, the state's, or that of the "
                        "column's first value in the batch)")
    return None


def from_spark(value: Any) -> Any:
    """A state value as the parsers give it: Uint64 columns are decimals in Spark."""
    import decimal

    return int(value) if isinstance(value, decimal.Decimal) else value


def to_arrow(value: Any, kind: str) -> Any:
    import decimal

    if not fits(value, kind):
        return None
    return decimal.Decimal(value) if kind.startswith("decimal") and value is not None else value


def arrow_type(kind: str) -> pa.DataType:
    """The Arrow type of a column kind here (one of `ARROW_TYPES`): `spark_arrow`'s mapping."""
    return arrow_of(kind, kind)


ARROW_TYPES = frozenset({"bigint", "double", "boolean", "string", "decimal(20,0)"})


def restore(change: Change) -> Change:
    """Pickling turns the NAN singleton into a fresh NaN: bring the singleton back."""
    def fix(image: Any) -> Any:
        if image is None:
            return None
        return {k: NAN if isinstance(v, float) and v != v else v for k, v in image.items()}

    return Change(change.op, fix(change.key), fix(change.before), fix(change.after),
                  change.position, change.time, change.transaction, change.table,
                  change.origin, change.snapshot, change.tx_order, change.message)


def change_at(item: bytes, time: Any) -> Change:
    """A parsed change with the time the windows gave it."""
    change = restore(pickle.loads(item))
    return replace(change, time=int(time))
