"""Abandoned submits: the tombstone record that fences a late submitter out.

A submit writes its record last, create-only. A process that decides a submit is dead (the
slot repair of admission, gc's sweep of orphaned folders, a repair of an idempotency key)
first creates a terminal record at that id, create-only, and acts only if it lands: then
the late submitter's own create meets ``Conflict`` and that invocation can never become
live. If the tombstone loses, the record exists after all and nothing was abandoned.

The tombstone is an ordinary ``failed`` record (error type ``SubmitAbandoned``): readers
show it, gc collects it like any finished invocation.
"""

from __future__ import annotations

from lakeshore.errors import Conflict
from lakeshore.protocol import ABANDONED, QueueOps
from lakeshore.record import Blob, Record
from lakeshore.store.base import CREATE

__all__ = ["ABANDONED", "abandoned", "fence"]


def fence(ops: QueueOps, inv: str, now: float, why: str) -> bool:
    """Create the tombstone of ``inv``; True if it landed, False if a record exists.

    Raises:
        StoreError: the store failed.
    """
    stone = Record(
        id=inv,
        ns=ops.keys.ns,
        queue=ops.keys.queue,
        fn="?",
        args=Blob(inline=b""),
        state="failed",
        error={
            "type": ABANDONED,
            "message": f"the submit of {inv} never wrote its record: {why}; nothing ran",
            "traceback": "",
        },
        submitted_at=now,
        finished_at=now,
    )
    try:
        ops.store.put(ops.keys.record(inv), stone.to_bytes(), CREATE)
    except Conflict:
        return False
    return True


def abandoned(rec: Record) -> bool:
    """True for a tombstone written by :func:`fence`."""
    error = rec.error
    return rec.state == "failed" and isinstance(error, dict) and error.get("type") == ABANDONED
