"""Idempotency keys: the ``_keys/<sha256(key)>`` object that makes a keyed submit return the
same id however often it is retried.

A keyed submit creates the key object naming its new id (create-only) before it publishes
that id's ticket, or reads the one that exists and returns the id it names once that id's
record exists. A key whose first submitter died between the key and the ticket is repaired
by the next submit with that key, once the first had ``KEY_REPAIR_GRACE_S`` to finish: the
old id is fenced with a tombstone (``QueueOps.fence``) and the key moves to a new id by
compare-and-swap. The submit's side of it (admission, publishing) is in
:mod:`lakeshore.submit`; the protocol, step by step: docs/protocol.md#submit.
"""

from __future__ import annotations

import dataclasses
import math

from lakeshore import codec
from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    LakeshoreError,
    NotFound,
    RecordError,
    StoreError,
)
from lakeshore.keys import check_id
from lakeshore.protocol import polling
from lakeshore.protocol.steps import MAX_SMALL_BYTES, QueueOps, abandoned
from lakeshore.store.base import CREATE, if_match

__all__ = [
    "KEY_REPAIR_GRACE_S",
    "HeldKey",
    "key_body",
    "move_key",
    "needs_new_id",
    "parse_key",
    "take_or_read",
]

# A key whose record is missing is repaired only once its first submitter had this long to
# finish: a younger one is probably still being written by a concurrent submit.
KEY_REPAIR_GRACE_S = 30.0


@dataclasses.dataclass(frozen=True)
class HeldKey:
    """An idempotency key object as read: the id it names, its input hash, when it was
    written, its etag, and whether it names the id this submit chose (``mine``)."""

    id: str
    input_hash: str
    at: float
    etag: str
    mine: bool = False


def take_or_read(
    ops: QueueOps, key: str, inv: str, input_hash: str, create: bool
) -> HeldKey | None:
    """Create the key object for ``inv`` (``create``), or read the one that exists; None
    when the key is free (only looking, or removed since our create failed).

    Raises:
        StoreError: the key object is not one lakeshore wrote.
    """
    store, where = ops.store, ops.keys.idem(key)
    if create:
        now = store.now()
        body = key_body(inv, input_hash, now)
        try:
            return HeldKey(inv, input_hash, now, store.put(where, body, CREATE), True)
        except Conflict:
            pass
    try:
        data, etag = store.get(where, max_bytes=MAX_SMALL_BYTES)
    except NotFound:
        return None
    held = parse_key(data)
    if held is None:
        raise StoreError(
            f"submit _key={key!r}",
            f"the idempotency key object {where} is not one lakeshore wrote",
            "delete that object (the key then starts afresh), or use another key",
            key=where,
        )
    ident, input_hash, at = held
    # naming our own id: our create landed and only its answer was lost (a retried request)
    return HeldKey(ident, input_hash, at, etag, mine=ident == inv)


def move_key(ops: QueueOps, key: str, inv: str, input_hash: str, replacing: HeldKey | None) -> bool:
    """Make the key name ``inv``: create it, or move it off ``replacing`` by compare-and-
    swap. False when someone else changed it first."""
    store = ops.store
    body = key_body(inv, input_hash, store.now())
    mode = CREATE if replacing is None else if_match(replacing.etag)
    where = ops.keys.idem(key)
    try:
        store.put(where, body, mode)
    except Conflict:
        try:  # a retried request whose first try landed meets its own write
            held = parse_key(store.get(where, max_bytes=MAX_SMALL_BYTES)[0])
        except NotFound:
            return False
        return held is not None and held[0] == inv
    return True


def needs_new_id(ops: QueueOps, held: HeldKey) -> bool:
    """True when the id a key names will never run: a tombstone record, or no record once
    the key is older than ``KEY_REPAIR_GRACE_S`` (the first submitter died after the key;
    the id is fenced here so a slow one cannot publish later). While the key is younger
    and its record missing, wait for the record: an id is returned only once its record
    exists, so a caller never holds an id that a later repair abandons."""
    store = ops.store
    pause = 0.005
    while True:
        now = store.now()
        try:
            rec, _ = ops.read(held.id)
        except NotFound:
            if now - held.at <= KEY_REPAIR_GRACE_S:
                # a concurrent submit still between its key and its record, most likely:
                # it lands within milliseconds; a dead one is repaired after the grace
                polling.pause(
                    store, min(pause, max(0.0, held.at + KEY_REPAIR_GRACE_S - now) + 0.01)
                )
                pause = min(pause * 2, 0.5)
                continue
            why = f"a submit with its key found no record {KEY_REPAIR_GRACE_S:g} s later"
            if ops.fence(held.id, now, why):
                return True
            continue  # the record landed meanwhile: look at it
        except RecordError:
            return False  # corrupt or newer: the claimers deal with it, the key stays
        return abandoned(rec)


def key_body(inv: str, input_hash: str, now: float) -> bytes:
    return codec.encode({"id": inv, "input_hash": input_hash, "at": now})


def parse_key(data: bytes) -> tuple[str, str, float] | None:
    """``(id, input_hash, at)`` of an idempotency key object, or None when the bytes are not
    one (anything read from the store may be hostile). A key without ``at`` (written by an
    older lakeshore) counts as old."""
    try:
        obj = codec.decode(data, "idempotency key")
    except LakeshoreError:
        return None
    if not isinstance(obj, dict):
        return None
    ident, input_hash, at = obj.get("id"), obj.get("input_hash", ""), obj.get("at", 0.0)
    if not isinstance(ident, str) or not isinstance(input_hash, str):
        return None
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return None
    try:
        return check_id(ident), input_hash, float(at)
    except InvalidArgument:
        return None
