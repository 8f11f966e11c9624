"""A submit's publish writes, awaited: :meth:`QueueOps.publish` on the store's async verbs
(``aput``, ``aget``, ``anow``), in the same order and with the same conditions — the
arguments' object when they spill, the id index outside the default queue, then the ticket,
create-only, the one write that makes the invocation exist.

On a store with an async client (S3 through obstore) no thread is started; other stores
run each verb in a thread (the store contract's fallback). Admission and idempotency keys
are not here: a submit that needs them publishes with the blocking code in one thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib

from lakeshore.errors import Conflict, NotFound, TooLarge
from lakeshore.keys import DEFAULT_QUEUE, id_index
from lakeshore.model.record import MAX_INLINE_BYTES, Blob, Record
from lakeshore.protocol.steps import QueueOps
from lakeshore.store.base import CREATE

__all__ = ["apublish"]


async def apublish(
    ops: QueueOps, draft: Record, payload: bytes, spill_bytes: int, deadline_s: float | None
) -> Record | None:
    """:meth:`QueueOps.publish`, awaited: the record as published, or None when the ticket's
    key was taken (a tombstone: the submit was fenced out).

    Raises:
        InvalidArgument: the id does not carry the band of its priority.
        StoreError: the store failed (the invocation was not published).
    """
    store = ops.store
    ticket = ops.keys.ticket(draft.priority, draft.id)
    ops.check_ticket(draft, ticket)
    now = await store.anow()
    rec = dataclasses.replace(
        draft,
        args=await _put_args(ops, draft.id, payload, spill_bytes),
        deadline_at=max(now, draft.not_before) + deadline_s if deadline_s is not None else None,
        submitted_at=now,
    )
    if rec.queue != DEFAULT_QUEUE:
        with contextlib.suppress(Conflict):  # ids never move: one already there is ours
            await store.aput(id_index(ops.keys.ns, rec.id), rec.queue.encode(), CREATE)
    data = rec.to_bytes()
    try:
        await store.aput(ticket, data, CREATE)
    except Conflict:
        try:  # our own write, retried by the store after a lost answer?
            return rec if (await store.aget(ticket, max_bytes=len(data)))[0] == data else None
        except (NotFound, TooLarge):
            return None
    return rec


async def _put_args(ops: QueueOps, inv: str, data: bytes, spill_bytes: int) -> Blob:
    """:meth:`QueueOps.put_args`, awaited."""
    if len(data) <= min(spill_bytes, MAX_INLINE_BYTES):
        return Blob(inline=data)
    key = ops.keys.args(inv)
    try:
        await ops.store.aput(key, data, CREATE)
    except Conflict:
        if (await ops.store.aget(key, max_bytes=len(data)))[0] != data:  # only our own retry
            raise
    return Blob(ref=key, size=len(data), sha256=hashlib.sha256(data).hexdigest())
