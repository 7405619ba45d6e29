"""The Java image reader (`spark/jvm/DebeziumImage.java`) gives exactly `from_json`'s struct.

For every image it reads, `from_json(image, columns, FAILFAST)` (what `keyed._parsed` runs
where Java leaves an image) gives the same values, compared by their `repr` (so -0.0 is not
0.0); where the two could part (a value of another kind than its column's, a number beyond
its type, a duplicate key, text that is not one object), Java leaves the image to `from_json`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from changelake.spark.changefeed.keyed import ColumnSpec, _parsed, java_image_reader
from changelake.spark.changefeed.types import Decoder
from tests.support.seeding import seeded

TYPES = {"id": "bigint", "name": "string", "amount": "double", "flag": "boolean",
         "big": "decimal(20,0)"}
COLUMNS = [ColumnSpec(n, t, t, Decoder(), Decoder()) for n, t in TYPES.items()]

READ = [
    '{"id":1,"name":"a","amount":1.5,"flag":true,"big":18446744073709551615}',
    "{}",
    '{"id":-9223372036854775808,"big":-9223372036854775808}',
    '{"id":9223372036854775807,"flag":false,"big":0}',
    '{"amount":1e308}', '{"amount":-0.0}', '{"amount":5e-324}', '{"amount":1E2}',
    '{"amount":12345678901234567890123}', '{"amount":0.1}', '{"amount":-7}',
    r'{"name":"\u00e9\ud83d\ude00 \"q\" \\ \n\t/"}', '{"name":""}', '{"name":null,"id":null}',
    '{"other":{"x":[1,2,{"y":3}]},"id":2,"more":[{"name":1}]}',
    '{"ID":5,"Name":"upper"}',  # names are matched exactly: these are not the columns
    '{"name":"__debezium_unavailable_value"}',
    '{"name":"ĉu vi? 中文"}',
    '{ "id" : 3 , "name" : "spaced" }',
]

DEFERRED = [
    '{"id":1.0}', '{"id":"1"}', '{"id":9223372036854775808}', '{"id":-9223372036854775809}',
    '{"name":1}', '{"name":{"a":1}}', '{"name":[1]}', '{"name":true}', '{"name":1.5}',
    '{"amount":"NaN"}', '{"amount":1e400}', '{"amount":-1e400}', '{"amount":true}',
    '{"flag":"true"}', '{"flag":1}',
    '{"big":18446744073709551616}', '{"big":-9223372036854775809}', '{"big":1.0}',
    '{"big":"1"}',
    '{"id":1,"id":2}', '{"other":1,"other":2}', '{"other":{"a":1,"a":2}}',
    '{"other":[{"a":1},{"a":1,"a":2}]}', '{"id":1} x', '{"id":1}{"id":2}', "[1]",
    "null", '{"id":01}', '{"id":1', "", ' {"id":1}', "{'id':1}", '{"id":NaN}',
    # UTF-16 text of an image Java reads: Jackson would take its bytes for UTF-16.
    '{"id":1}'.encode("utf-16-le").decode(),
]


def _random_images(count: int) -> list[str]:
    """Images of plain values of each column's kind, some columns missing or null, some
    fields no column names."""
    rng = seeded(20261126)
    texts = []
    for _ in range(count):
        image: dict[str, Any] = {}
        if rng.random() < 0.9:
            image["id"] = rng.choice([rng.randint(-2**63, 2**63 - 1), rng.randint(-9, 9), None])
        if rng.random() < 0.9:
            code = rng.choice([rng.randint(32, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])
            image["name"] = rng.choice(["", "x" * rng.randint(1, 300), "é\u2028\"\\",
                                        chr(code), None])
        if rng.random() < 0.9:
            image["amount"] = rng.choice([
                rng.uniform(-1e300, 1e300), rng.random(), float(rng.randint(-10**6, 10**6)),
                rng.randint(-2**80, 2**80), 1e-310, None])
        if rng.random() < 0.9:
            image["flag"] = rng.choice([True, False, None])
        if rng.random() < 0.9:
            image["big"] = rng.choice([rng.randint(-2**63, 2**64 - 1), 0, None])
        if rng.random() < 0.3:
            image["extra"] = {"nested": [1, "two", {"three": None}]}
        items = list(image.items())
        rng.shuffle(items)
        texts.append(json.dumps(dict(items), ensure_ascii=rng.random() < 0.5))
    return texts


def _read(spark: Any, texts: list[str]) -> tuple[list[Any], list[Any] | None]:
    """Java's struct per text, and `from_json`'s (FAILFAST) for the texts Java read."""
    from pyspark.sql import functions as F

    java = java_image_reader(spark, COLUMNS)
    assert java is not None, "raw types Java reads"
    function, spec = java
    frame = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, text string")
    read_by_java = F.call_function(function, F.col("text").cast("binary"), F.lit(spec))
    by_java = frame.select("i", read_by_java.alias("j")).orderBy("i").collect()
    read = [t for t, r in zip(texts, by_java, strict=True) if r["j"] is not None]
    if not read:
        return [r["j"] for r in by_java], None
    theirs = spark.createDataFrame([(i, t) for i, t in enumerate(read)], "i int, text string") \
        .select("i", _parsed(F.col("text"), COLUMNS).alias("f")).orderBy("i").collect()
    return [r["j"] for r in by_java], [r["f"] for r in theirs]


def _same(a: Any, b: Any) -> bool:
    return repr(tuple(a)) == repr(tuple(b))


def test_every_image_java_reads_is_read_the_same_by_from_json(spark: Any) -> None:
    texts = READ + _random_images(400)
    java, theirs = _read(spark, texts)
    read = [j for j in java if j is not None]
    assert theirs is not None and len(read) == len(theirs)
    for text, mine, its in zip([t for t, j in zip(texts, java, strict=True) if j is not None],
                               read, theirs, strict=True):
        assert _same(mine, its), (text, mine, its)
    # Every one of these is Java's: a reader that left them all would pass the loop above.
    assert [t for t, j in zip(texts, java, strict=True) if j is None] == []
    assert any(j["amount"] is not None and math.copysign(1, j["amount"]) < 0 for j in read)


def test_what_java_leaves_to_from_json(spark: Any) -> None:
    java, _ = _read(spark, DEFERRED)
    assert [t for t, j in zip(DEFERRED, java, strict=True) if j is not None] == []


def test_an_unsupported_column_type_has_no_java_reader(spark: Any) -> None:
    columns = [*COLUMNS, ColumnSpec("when", "timestamp", "timestamp", Decoder(), Decoder())]
    assert java_image_reader(spark, columns) is None
