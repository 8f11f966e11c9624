"""Abandoned submits: the tombstone that fences a late submitter out.

A submit writes its ticket last, create-only. A process that decides a submit is dead (the
slot repair of admission, gc's sweep of orphaned folders, a repair of an idempotency key)
first creates a terminal record at that id's ticket, create-only, and acts only if it lands:
then the late submitter's own create meets ``Conflict`` and that invocation can never become
live. If the tombstone loses, the ticket exists after all and nothing was abandoned. (An id
made before 0.4 carries no band, and its submitter wrote ``<id>/record`` last: its
tombstone goes there.)

The tombstone is an ordinary ``failed`` record (error type ``SubmitAbandoned``): readers
show it, claimers leave it where it is, gc collects it like any finished invocation.
"""

from __future__ import annotations

import contextlib
import dataclasses

from lakeshore.errors import Conflict, NotFound, PermissionDenied, RecordError
from lakeshore.keys import QueueKeys
from lakeshore.protocol import ABANDONED, QueueOps
from lakeshore.record import Blob, Record
from lakeshore.store.base import CREATE

__all__ = ["ABANDONED", "abandoned", "fence"]


def fence(ops: QueueOps, inv: str, now: float, why: str) -> bool:
    """Create the tombstone of ``inv``; True if it landed, False if its ticket (or record)
    exists.

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
            "message": f"the submit of {inv} never wrote its ticket: {why}; nothing ran",
            "traceback": "",
        },
        submitted_at=now,
        finished_at=now,
    )
    where = ops.keys.ticket_of_id(inv)
    if where is None:
        try:
            ops.store.put(ops.keys.record(inv), stone.to_bytes(), CREATE)
        except Conflict:
            return False
        return True
    stone = dataclasses.replace(stone, priority=QueueKeys.priority_of(where))
    try:
        etag = ops.store.put(where, stone.to_bytes(), CREATE)
    except Conflict:
        return False
    # The caller found neither record nor ticket, but between its two reads the invocation
    # may have been claimed, run and its ticket deleted: then its record exists, and the
    # tombstone (which the record outranks for every reader) is taken back.
    try:
        ops.read_record(inv)
    except NotFound:
        return True
    except RecordError:
        pass
    # Best effort: a producer may not delete tickets. A tombstone left beside a record is
    # harmless (readers take the record; claimers leave tombstones alone; gc removes it).
    with contextlib.suppress(Conflict, PermissionDenied):
        ops.store.delete(where, if_match=etag)
    return False


def abandoned(rec: Record) -> bool:
    """True for a tombstone written by :func:`fence`."""
    error = rec.error
    return rec.state == "failed" and isinstance(error, dict) and error.get("type") == ABANDONED
