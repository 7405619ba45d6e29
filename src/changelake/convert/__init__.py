"""Changefeeds (Debezium, YDB) into CDCv2: keyed upsert conversion, progress, and encoding.

`encode_changefeed` is the entry point of `changelake encode --from debezium|ydb`.
"""

from changelake.convert.base import Stats, WindowedConverter
from changelake.convert.feed import ChangefeedEncoder, FeedReport, encode_changefeed
from changelake.convert.images import ImageConverter
from changelake.convert.upsert import KeyedConverter, MemoryState, State, UpsertOptions

__all__ = [
    "ChangefeedEncoder",
    "FeedReport",
    "ImageConverter",
    "KeyedConverter",
    "MemoryState",
    "State",
    "Stats",
    "UpsertOptions",
    "WindowedConverter",
    "encode_changefeed",
]
