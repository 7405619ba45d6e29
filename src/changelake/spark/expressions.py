"""Column expressions built once per JVM, for the steps that build many.

A `Column` of classic PySpark is a JVM object, and every function that builds one (`F.when`,
`column[name]`, `.alias`) is a round trip from the Python driver to the JVM. The keyed
conversion's steps (`changefeed.keyed`) build many of them: driver time that every batch pays
whatever its size, every micro-batch of `lake follow` and every small test. Built once, a
small batch converts faster (`benchmarks/bench_fixed_cost.py`).

An unresolved expression names its columns and holds no DataFrame and no session, so the same
objects serve every batch: `per_jvm` builds them at the first call and keeps them for as long
as the JVM they were built in (PySpark starts one per Python process and keeps it across
sessions; should it start another, they are built again there).

`quote` quotes a name for the text Spark parses (SQL, a struct type's text), whatever the name
holds: a Debezium image's column names reach the changefeed path's types through it (they are
not checked to be identifiers first, as YDB's and a lake table's are), and the lake's SQL
uses it too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

T = TypeVar("T")


def _gateway() -> Any:
    from pyspark import SparkContext

    return SparkContext._gateway


_CACHES: list[dict[Any, Any]] = []


def forget() -> None:
    """Drop every expression built so far: the next calls build them again (to measure what
    the cache spares: `benchmarks/bench_fixed_cost.py`)."""
    for cache in _CACHES:
        cache.clear()


def per_jvm(build: Callable[..., T]) -> Callable[..., T]:
    """`build(*args)` once per JVM and `args` (values: names, flags, frozen dataclasses,
    never a DataFrame or Column; built anew each time where one is not hashable, a table
    schema holding a Debezium schema's dict, say). What `build` returns must be Columns, or
    plain containers of them, that read no DataFrame."""
    built: dict[tuple[Hashable, ...], tuple[Any, T]] = {}
    _CACHES.append(built)

    @functools.wraps(build)
    def cached(*args: Hashable) -> T:
        try:
            hash(args)
        except TypeError:
            return build(*args)
        gateway = _gateway()
        entry = built.get(args)
        if entry is None or entry[0] is not gateway:
            entry = built[args] = (gateway, build(*args))
        return entry[1]

    return cached


def selected(frame: DataFrame, steps: Sequence[Sequence[Column | str]]) -> DataFrame:
    """`frame` through `steps`, one `select` each, in order: how a step applies the selects a
    `per_jvm` builder gives it."""
    for step in steps:
        frame = frame.select(*step)
    return frame


def quote(name: str) -> str:
    """`name` as Spark SQL quotes an identifier, in SQL text and in a type's text (a struct's
    field names): any name, a backtick in it too, is that name and nothing more."""
    return "`" + name.replace("`", "``") + "`"
