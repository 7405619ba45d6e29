"""Debezium's temporal Connect types as Spark expressions, text for text as Python gives it.

`formats.debezium.decode_value` turns the integers Debezium writes for dates, times of day and
timestamps into ISO text (the plain-JSON value a lake table holds as a string). Each function
here is the same rule as a column expression over the integer, so that a feed with these
columns converts in the JVM:

* `date_text` (`io.debezium.time.Date`, Connect `Date`: days since 1970-01-01): the date's
  `isoformat`, for years 1 to 9999;
* `time_text` (`Time` ms, `MicroTime` µs, `NanoTime` ns since midnight): `HH:MM:SS` and the
  fraction without trailing zeros; hours are not wrapped at 24, and a negative value reads as
  Python's floor division reads it (`divmod`);
* `timestamp_text` (`Timestamp` ms, `MicroTimestamp` µs, `NanoTimestamp` ns since the epoch, no
  time zone): `YYYY-MM-DDTHH:MM:SS` and the fraction, or PostgreSQL's `infinity` and
  `-infinity` as Debezium writes them.

Integer arithmetic only (`div` and `pmod`), so no value passes through a double, and
no session time zone is involved: the date is counted in days, the time of day in seconds. A
date outside years 1-9999 is an error (`raise_error`) as Python's `OverflowError` is, so that
the batch goes to the Python path, which names the line. `types.decode` applies them to columns
whose Connect schema names these types (`types.connect_decoder`), read from JSON as bigint.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

#: Days from 1970-01-01 to 0001-01-01 and to 9999-12-31: the dates Python can write.
FIRST_DAY = -719162
LAST_DAY = 2932896
_DAY = 86400
#: PostgreSQL's +-infinity timestamps as Debezium writes them, in microseconds.
_INFINITY_US = {9223372036825200000: "infinity", -9223372036832400000: "-infinity"}


def _long_div(value: Column, by: int) -> Column:
    """Python's `//` on longs: Spark's `div` truncates toward zero (no overflow either way)."""
    quotient = F.call_function("div", value, F.lit(by))
    return F.when((value < 0) & (F.pmod(value, F.lit(by)) != 0), quotient - 1) \
        .otherwise(quotient)


def _fraction(rest: Column, per_second: int) -> Column:
    """`.` and the fraction of a second without trailing zeros, or nothing when it is 0."""
    digits = len(str(per_second)) - 1
    text = F.regexp_replace(F.lpad(rest.cast("string"), digits, "0"), "0+$", "")
    return F.when(rest == 0, F.lit("")).otherwise(F.concat(F.lit("."), text))


def date_text(days: Column) -> Column:
    """`(date(1970, 1, 1) + timedelta(days)).isoformat()`."""
    day = F.date_add(F.lit("1970-01-01").cast("date"), days.cast("int"))
    out_of_range = (days < FIRST_DAY) | (days > LAST_DAY)
    return F.when(days.isNull(), F.lit(None).cast("string")) \
        .when(out_of_range, F.raise_error(F.lit("date out of range"))) \
        .otherwise(F.date_format(day, "yyyy-MM-dd"))


def _clock(seconds: Column) -> tuple[Column, Column, Column]:
    """Hours (unbounded), minutes and seconds of a count of seconds, floored as `divmod`."""
    rest = F.pmod(seconds, F.lit(3600))
    return _long_div(seconds, 3600), _long_div(rest, 60), F.pmod(rest, F.lit(60))


def time_text(total: Column, per_second: int) -> Column:
    """`formats.debezium._time_of_day(total, per_second)`."""
    seconds = _long_div(total, per_second)
    hours, minutes, secs = _clock(seconds)
    text = F.concat(F.format_string("%02d:%02d:%02d", hours, minutes, secs),
                    _fraction(F.pmod(total, F.lit(per_second)), per_second))
    return F.when(total.isNull(), F.lit(None).cast("string")).otherwise(text)


def timestamp_text(total: Column, per_second: int) -> Column:
    """`formats.debezium._timestamp(total, per_second)`."""
    seconds = _long_div(total, per_second)
    days = _long_div(seconds, _DAY)
    hours, minutes, secs = _clock(F.pmod(seconds, F.lit(_DAY)))
    text = F.concat(date_text(days), F.lit("T"),
                    F.format_string("%02d:%02d:%02d", hours, minutes, secs),
                    _fraction(F.pmod(total, F.lit(per_second)), per_second))
    # Debezium's infinities, compared in microseconds as Python compares them.
    if per_second >= 1_000_000:
        micros = _long_div(total, per_second // 1_000_000)
        exact = F.lit(True)
    else:
        factor = 1_000_000 // per_second
        limit = (2**63 - 1) // factor
        exact = total.between(-limit, limit)
        micros = total * F.lit(factor)
    out = F.when(total.isNull(), F.lit(None).cast("string"))
    for value, name in _INFINITY_US.items():
        out = out.when(exact & (micros == F.lit(value)), F.lit(name))
    return out.otherwise(text)
