"""Writes `orders.jsonl`: the Debezium PostgreSQL changefeed of a small `orders` table that the
tour (README.md, docs/getting-started.md) ingests. Run it again to get the same file:
`.venv/bin/python examples/make_orders.py`.

The events are schemaless Debezium payloads as a PostgreSQL connector with the table's default
replica identity writes them: a snapshot (`op` "r"), then transactions of inserts ("c"),
updates ("u", no before-image) and deletes ("d", the key alone), and at the end the last
transaction's events sent again, as a connector restarted before it stored its offset sends
them. A transaction's time is `source.sequence[0]`, the LSN of the commit before it: 1000,
1100, ..., 1900 here; the snapshot's rows are at time 0.
"""

import json
from pathlib import Path

SNAPSHOT = [
    (1, "alice", 2500, "new"),
    (2, "bob", 1200, "new"),
    (3, "carol", 9900, "new"),
    (4, "dave", 450, "new"),
    (5, "erin", 3100, "new"),
]

# One list per transaction: (op, id, customer, amount_cents, status).
TRANSACTIONS = [
    [("c", 6, "frank", 7300, "new"), ("u", 1, "alice", 2500, "paid")],
    [("u", 2, "bob", 1200, "paid"), ("u", 3, "carol", 9900, "paid"), ("c", 7, "grace", 600, "new")],
    [("d", 4, None, None, None)],
    [("u", 1, "alice", 2500, "shipped"), ("u", 2, "bob", 1200, "shipped"),
     ("c", 8, "heidi", 5400, "new")],
    [("u", 6, "frank", 7300, "paid"), ("d", 5, None, None, None)],
    [("c", 9, "ivan", 1800, "new"), ("c", 10, "judy", 2200, "new"),
     ("u", 7, "grace", 600, "cancelled")],
    [("u", 3, "carol", 9900, "shipped"), ("u", 8, "heidi", 5100, "paid")],
    [("u", 9, "ivan", 1800, "paid"), ("d", 7, None, None, None)],
    [("u", 10, "judy", 2200, "paid"), ("u", 6, "frank", 7300, "shipped")],
    [("u", 1, "alice", 2500, "delivered"), ("u", 8, "heidi", 5100, "shipped")],
]

REPLAYED = 2  # the last transaction's events, sent again after a connector restart


def row(key, customer, amount, status):
    return {"id": key, "customer": customer, "amount_cents": amount, "status": status}


def event(op, before, after, *, snapshot, previous_commit, lsn, xid):
    sequence = json.dumps([None if previous_commit is None else str(previous_commit), str(lsn)],
                          separators=(",", ":"))
    return {"before": before, "after": after, "op": op, "ts_ms": 1_767_225_600_000 + lsn,
            "transaction": None,
            "source": {"version": "2.5.0.Final", "connector": "postgresql", "name": "shop",
                       "ts_ms": 1_767_225_600_000 + lsn, "snapshot": snapshot, "db": "shop",
                       "sequence": sequence, "schema": "public", "table": "orders",
                       "txId": xid, "lsn": lsn, "xmin": None}}


def events():
    out = []
    for i, values in enumerate(SNAPSHOT):
        flag = "first" if i == 0 else ("last" if i == len(SNAPSHOT) - 1 else "true")
        out.append(event("r", None, row(*values), snapshot=flag, previous_commit=None,
                         lsn=1000, xid=700))
    previous_commit = 1000
    for n, changes in enumerate(TRANSACTIONS):
        xid = 701 + n
        for k, (op, key, *values) in enumerate(changes):
            lsn = previous_commit + 10 * (k + 1)
            if op == "d":
                before, after = row(key, None, None, None), None
            else:
                before, after = None, row(key, *values)
            out.append(event(op, before, after, snapshot="false",
                             previous_commit=previous_commit, lsn=lsn, xid=xid))
        previous_commit += 100
    return out + out[-REPLAYED:]


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    lines = [json.dumps(e, separators=(",", ":")) for e in events()]
    (here / "orders.jsonl").write_text("\n".join(lines) + "\n")
