"""Step 2 for YDB, the careful parse: the lines the typed parse (`ydb.py`) cannot prove
simple, each read as a VARIANT, every value's JSON kind asked, into the rows `ydb.ydb_items`
gives.

Mirrors `formats.ydb.YdbParser` (FORMAT = 'JSON') for the columns whose YDB types this path
reads in the JVM (`ydb.COVERED`). The line is parsed once (`try_parse_json`); a value's JSON
kind (`schema_of_variant`) decides what the Python parser decides with `type(value)`:

* `{"resolved": [step, txId]}` (nothing else): a barrier at `rpos`;
* a data record: `key` (an array in primary-key order), exactly one of `update`/`reset`/`erase`
  (an object), optional `ts` (`[step, txId]`: position `pos`, time `step`), `newImage` /
  `oldImage` (objects of non-key columns; null reads as absent). What it becomes is
  `YdbParser._record`'s rule: erase a delete, with before = key + oldImage; with newImage a
  write of key + newImage (an UPDATE with oldImage, an UPSERT without); otherwise a write of
  key + the object's columns, the others UNCHANGED (`update`) or null (`reset`).

Values as `decode_value` reads them: Bool a JSON boolean; integers a JSON integer in the type's
range (Uint64 beyond a long as `decimal(20,0)`); Float/Double a number or "nan"/"inf"/"-inf";
Utf8/Uuid a string; null anything.

Every line the Python parser refuses, and every line this parse cannot read the Python way,
sets `problem` (the caller hands the batch to the Python path, which names the line as
`encode_changefeed` does): not one JSON object nesting at most four levels (strings aside),
a line near the length limit, a surrogate escape, a byte-order mark or a replacement character
(orjson refuses what Spark would repair or skip), duplicate names (the variant refuses them,
orjson keeps the last), DEBEZIUM_JSON records (`payload`/`value`), OLD_IMAGE records (no after
image), a null key value, and, on a line with a Uint64 beyond a long, a number with an exponent
or 19 digits before its point (`9223372036854775808.0` reads as that integer in a variant).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from changelake.formats.lines import MAX_LINE_BYTES
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import _base_type
from changelake.protocol.time import MAX_TIME
from changelake.spark.changefeed.keyed import ColumnSpec
from changelake.spark.changefeed.types import decimal_literal
from changelake.spark.expressions import per_jvm

#: The integer types' ranges (Uint64 aside: beyond a long).
INTS = {f"Int{b}": (-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)} | {
    f"Uint{b}": (0, (1 << b) - 1) for b in (8, 16, 32)} | {
    "Interval": (-(1 << 63), (1 << 63) - 1), "Interval64": (-(1 << 63), (1 << 63) - 1)}
_DATA_FIELDS = ("key", "update", "reset", "erase", "newImage", "oldImage", "ts")
_STRING = r'"(?:[^"\\]++|\\.)*+"'
_CONTAINER = r"\{[^{}\[\]]*\}|\[[^{}\[\]]*\]"


def _kind(v: Column, path: str) -> Column:
    """The JSON kind at `path` (BIGINT, DECIMAL(p,s), DOUBLE, STRING, BOOLEAN, VOID for null,
    OBJECT<..>, ARRAY<..>); null when the path is absent."""
    return F.schema_of_variant(F.try_variant_get(v, path, "variant"))


def _unsigned(v: Column, path: str) -> tuple[Column, Column, Column]:
    """(value as decimal(20,0), ok, big): a JSON integer in [0, 2^64); `big` when it is beyond
    a long, where the variant would read a float with a zero fraction the same way."""
    kind = _kind(v, path)
    value = F.try_variant_get(v, path, "decimal(20,0)")
    big = kind.rlike(r"^DECIMAL\(\d+,0\)$") & (value >= decimal_literal(1 << 63)) \
        & (value <= decimal_literal((1 << 64) - 1))
    ok = F.coalesce(((kind == "BIGINT") & (value >= 0)) | big, F.lit(False))
    return value, ok, F.coalesce(big, F.lit(False))


def _value(v: Column, path: str, base: str) -> tuple[Column, Column, Column]:
    """(value, ok, big) of one column value at `path` (absent or null: null, ok)."""
    kind = _kind(v, path)
    null = kind.isNull() | (kind == "VOID")
    big = F.lit(False)
    if base == "Bool":
        value, ok = F.try_variant_get(v, path, "boolean"), kind == "BOOLEAN"
    elif base == "Uint64":
        value, ok, big = _unsigned(v, path)
    elif base in INTS:
        low, high = INTS[base]
        value = F.try_variant_get(v, path, "bigint")
        ok = (kind == "BIGINT") & value.between(low, high)
    elif base in ("Float", "Double"):
        text = F.try_variant_get(v, path, "string")
        exact = F.try_variant_get(v, path, "double")
        value = (F.when(kind == "STRING", F.when(text == "nan", F.lit(float("nan")))
                        .when(text == "inf", F.lit(float("inf")))
                        .when(text == "-inf", F.lit(float("-inf"))))
                 .when(kind.startswith("DECIMAL"), text.cast("double"))
                 .when(kind.isin("BIGINT", "DOUBLE"), exact))
        ok = (((kind == "STRING") & text.isin("nan", "inf", "-inf"))
              | kind.isin("BIGINT", "DOUBLE") & ~F.isnan(exact) & (F.abs(exact) < float("inf"))
              | kind.startswith("DECIMAL"))
        # "-0.0" reads as a decimal zero without its sign; let the Python path read it.
        ok = ok & ~(kind.startswith("DECIMAL") & (value == 0) & F.col("value").contains("-0"))
    else:  # Utf8, Uuid
        value, ok = F.try_variant_get(v, path, "string"), kind == "STRING"
    return (F.when(~null, value), null | F.coalesce(ok, F.lit(False)),
            ~null & F.coalesce(big, F.lit(False)))


def _object(v: Column, name: str) -> tuple[Column, Column, Column]:
    """(present and not null, is an object, its member names) of a top-level field."""
    kind = _kind(v, f"$['{name}']")
    names = F.json_object_keys(F.to_json(F.try_variant_get(v, f"$['{name}']", "variant")))
    return kind.isNotNull() & (kind != "VOID"), F.coalesce(kind.startswith("OBJECT"),
                                                           F.lit(False)), names


def _only(names: Column, allowed: Sequence[str]) -> Column:
    return F.coalesce(F.size(F.array_except(names, F.array(*map(F.lit, allowed)))) == 0,
                      F.lit(True))


def _pair(v: Column, name: str) -> tuple[Column, Column, Column]:
    """(`[step, txId]` as array<decimal(20,0)>, ok, big) of a top-level field."""
    path = f"$['{name}']"
    length = F.json_array_length(F.to_json(F.try_variant_get(v, path, "variant")))
    step, step_ok, step_big = _unsigned(v, f"{path}[0]")
    tx, tx_ok, tx_big = _unsigned(v, f"{path}[1]")
    ok = F.coalesce(_kind(v, path).startswith("ARRAY") & (length == 2), F.lit(False)) \
        & step_ok & tx_ok
    return F.array(step, tx), ok, step_big | tx_big


def problems(*cases: tuple[Column, str]) -> Column:
    """The reason of the first case whose condition holds, else null."""
    out = F.lit(None).cast("string")
    for condition, reason in reversed(cases):
        out = F.when(condition, F.lit(reason)).otherwise(out)
    return out


def _float_like() -> Column:
    """A number in the line (strings aside) that the variant could read as an integer beyond
    a long although JSON spells a float: 19 or more digits before a point, or an exponent."""
    return F.regexp_replace("value", _STRING, '""').rlike(r"[0-9]{19}\.|[0-9][eE]")


def _well_formed(value: Column) -> Column:
    """One JSON value nesting at most four containers (strings aside), and nothing after it:
    Spark's JSON parser reads the first value of a line and ignores the rest, orjson does not."""
    flat = F.regexp_replace(value, _STRING, "0")
    for _ in range(4):
        flat = F.regexp_replace(flat, _CONTAINER, "0")
    return flat.rlike(r"^[ \t\r\n]*0[ \t\r\n]*$")


def variant_items(lines: DataFrame, schema: TableSchema, columns: Sequence[ColumnSpec]
                  ) -> DataFrame:
    """The rows `ydb.ydb_items` describes, one per line of `lines`. The expressions are built
    once per JVM (`expressions.per_jvm`): they are thousands of round trips to the JVM."""
    # Parsed once (a project over these is not collapsed into their many uses).
    lines = lines.select("file", "file_index", "block", "row", "value",
                         F.try_parse_json("value").alias("_v"),
                         F.json_object_keys("value").alias("_top"))
    return lines.select(*_item_columns(schema, tuple(columns)))


@per_jvm
def _item_columns(schema: TableSchema, columns: tuple[ColumnSpec, ...]) -> list[Column | str]:
    """`variant_items`' columns over the parsed lines (`_v`, `_top`)."""
    v, top = F.col("_v"), F.col("_top")
    types = {c.name: _base_type(c.type) or "" for c in schema.columns}
    keys = list(schema.primary_key)
    non_key = [n for n in schema.names if n not in keys]
    resolved = F.coalesce(F.array_contains(top, "resolved"), F.lit(False))
    debezium = F.coalesce(F.array_contains(top, "payload") | F.array_contains(top, "value"),
                          F.lit(False))
    rpos, rpos_ok, rpos_big = _pair(v, "resolved")

    present = {k: F.coalesce(F.array_contains(top, k), F.lit(False)) for k in _DATA_FIELDS}
    kinds = [present[k].cast("int") for k in ("update", "reset", "erase")]
    body = F.when(present["update"], "update").when(present["reset"], "reset") \
        .otherwise("erase")
    body_object = F.coalesce(*[F.when(present[k], _object(v, k)[1])
                               for k in ("update", "reset", "erase")], F.lit(False))
    key_kind = _kind(v, "$['key']")
    key_length = F.json_array_length(F.to_json(F.try_variant_get(v, "$['key']", "variant")))
    key_values = [_value(v, f"$['key'][{i}]", types[k]) for i, k in enumerate(keys)]
    ts, ts_ok, ts_big = _pair(v, "ts")
    new_on, new_object, new_names = _object(v, "newImage")
    old_on, old_object, old_names = _object(v, "oldImage")

    def image(field: str) -> list[tuple[Column, Column, Column]]:
        return [_value(v, f"$['{field}']['{n}']", types[n]) for n in non_key]

    new, old = image("newImage"), image("oldImage")
    written = {f: image(f) for f in ("update", "reset")}
    body_names = F.coalesce(*[F.when(present[k], _object(v, k)[2])
                              for k in ("update", "reset")])
    written_values = [F.when(present["update"], u[0]).otherwise(r[0])
                      for u, r in zip(written["update"], written["reset"], strict=True)]
    written_ok = [F.when(present["update"], u[1]).when(present["reset"], r[1])
                  .otherwise(F.lit(True))
                  for u, r in zip(written["update"], written["reset"], strict=True)]
    written_big = [F.when(present["update"], u[2]).when(present["reset"], r[2])
                   .otherwise(F.lit(False))
                   for u, r in zip(written["update"], written["reset"], strict=True)]
    erase = body == "erase"
    uses_written = ~erase & ~new_on

    def all_of(flags: list[Column]) -> Column:
        out = F.lit(True)
        for f in flags:
            out = out & f
        return out

    def any_of(flags: list[Column]) -> Column:
        out = F.lit(False)
        for f in flags:
            out = out | f
        return out

    big = (any_of([b for _, _, b in key_values]) | (present["ts"] & ts_big)
           | (new_on & any_of([b for _, _, b in new]))
           | (old_on & any_of([b for _, _, b in old]))
           | (uses_written & any_of(written_big)))
    data_problem = problems(
        (debezium, "unsupported: YDB's DEBEZIUM_JSON"),
        (~_only(top, _DATA_FIELDS), "bad: unknown fields in a YDB record"),
        (sum(kinds[1:], kinds[0]) != 1, "bad: not exactly one of update, reset, erase"),
        (~body_object, "bad: update, reset or erase that is not an object"),
        (F.coalesce(~key_kind.startswith("ARRAY") | (key_length != len(keys)), F.lit(True)),
         "bad: key"),
        (~all_of([ok for _, ok, _ in key_values]), "bad: a key value"),
        (present["ts"] & ~ts_ok, "bad: ts"),
        (present["ts"] & (ts[0] > decimal_literal(MAX_TIME)), "bad: a step beyond a long"),
        (new_on & (~new_object | ~_only(new_names, non_key)
                   | ~all_of([ok for _, ok, _ in new])), "bad: newImage"),
        (old_on & (~old_object | ~_only(old_names, non_key)
                   | ~all_of([ok for _, ok, _ in old])), "bad: oldImage"),
        (erase & new_on, "bad: an erase with a newImage"),
        (~erase & ~new_on & old_on, "bad: no after image (OLD_IMAGE)"),
        (uses_written & (~_only(body_names, non_key) | ~all_of(written_ok)),
         "bad: update or reset columns"),
        (any_of([value.isNull() for value, _, _ in key_values]), "unsupported: a null key"),
        (big & _float_like(), "unsupported: a float beside a Uint64 beyond a long"),
    )
    resolved_problem = problems(
        (F.size(top) != 1, "bad: a resolved record must hold nothing else"),
        (~rpos_ok, "bad: resolved"),
        (rpos[0] > MAX_TIME, "unsupported: a barrier beyond a long"),
        (rpos_big & _float_like(), "unsupported: a float beside a Uint64 beyond a long"),
    )
    line_problem = problems(
        (F.octet_length("value") >= MAX_LINE_BYTES - 1, "unsupported: a line near the limit"),
        (F.col("value").rlike("[\ufffd\ufeff]"), "unsupported: a replacement character or BOM"),
        (F.col("value").rlike(r"\\u[dD][89a-fA-F]"), "unsupported: a surrogate escape"),
        (~_well_formed(F.col("value")), "unsupported: not one JSON value of at most 4 levels"),
        (v.isNull() | top.isNull(), "bad: not a JSON object"),
    )
    problem = F.coalesce(line_problem, F.when(resolved, resolved_problem).otherwise(data_problem))

    names = [c.name for c in columns]
    typed = {c.name: c.out_type for c in columns}
    key_of = {k: key_values[i][0].cast(typed[k]) for i, k in enumerate(keys)}

    def row(values: list[Column]) -> Column:
        by_name = dict(zip(non_key, values, strict=True))
        return F.struct(*[(key_of[n] if n in key_of else by_name[n].cast(typed[n])).alias(n)
                          for n in names])

    def flags(values: list[Column]) -> Column:
        by_name = dict(zip(non_key, values, strict=True))
        return F.struct(*[(by_name[n] if n in by_name else F.lit(False)).alias(n)
                          for n in names])

    none = F.lit(False)
    no_row = F.lit(None).cast("struct<" + ", ".join(f"`{n}`: {typed[n]}" for n in names) + ">")
    a = F.when(erase, no_row).when(new_on, row([x[0] for x in new])) \
        .otherwise(row(written_values))
    unchanged = [present["update"] & ~F.coalesce(F.array_contains(body_names, n), F.lit(False))
                 for n in non_key]
    ua = F.when(new_on | erase, flags([none] * len(non_key))).otherwise(flags(unchanged))
    b = F.when(old_on, row([x[0] for x in old])).otherwise(no_row)
    op = F.when(erase, "d").when(new_on & old_on, "u").otherwise("w")
    pos = F.when(present["ts"], ts)
    return [
        "file", "file_index", "block", "row",
        F.when(resolved, "resolved").otherwise("change").alias("kind"),
        problem.alias("problem"), F.when(resolved, rpos).alias("rpos"),
        present["ts"].alias("has_ts"), pos.alias("pos"),
        F.when(present["ts"], ts[0].cast("bigint")).alias("time"),
        *[key_of[k].alias(f"k{i}") for i, k in enumerate(keys)],
        erase.alias("is_delete"), F.when(erase, 0).otherwise(1).alias("rank"),
        op.alias("op"), a.alias("a"), ua.alias("ua"), b.alias("b"),
        flags([none] * len(non_key)).alias("ub")]
