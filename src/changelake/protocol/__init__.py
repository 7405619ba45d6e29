"""The CDCv2 protocol in pure Python: times, frontiers, statements, the Reader and the Writer.

Nothing here imports Spark: the Spark layer resolves progress statements on the driver with
this same code, so the protocol's rules are stated once, here; the few that the Spark decoder
evaluates over a whole log have Spark SQL twins beside them in `rules.py`, which
`tests/protocol/test_protocol_rules.py` checks in pairs.
"""

from changelake.protocol.antichain import Antichain, FrontierLike, as_frontier
from changelake.protocol.consolidate import consolidate
from changelake.protocol.messages import Data, Message, Progress, Update, Updates
from changelake.protocol.reader import Batch, Collected, Reader, Rejected, collect, read
from changelake.protocol.time import Time
from changelake.protocol.writer import Writer

__all__ = [
    "Antichain",
    "Batch",
    "Collected",
    "Data",
    "FrontierLike",
    "Message",
    "Progress",
    "Reader",
    "Rejected",
    "Time",
    "Update",
    "Updates",
    "Writer",
    "as_frontier",
    "collect",
    "consolidate",
    "read",
]
