"""The queue protocol on the store: each step is a few store requests in a fixed order.

The record is the truth; hints are derived and may be stale. The orders below are chosen so a
crash between two requests never loses an invocation:

* **submit**: [args object] → [id index] → ready hint → record (create-only). A hint whose
  record is missing is either in flight or orphaned: claimers look again after as long as it
  has existed, and delete it once it is older than ``ORPHAN_GRACE_S``.
* **claim**: list ready hints → get record → put lease hint → CAS record to running → delete
  the ready hint. The lease hint exists before the record says running, so a crashed claimer's
  job is always found by the reaper.
* **back to queued** (retry, expiry): put ready hint → CAS record to queued → delete lease
  hint.
* **stale hints**: a hint is deleted only when its record is terminal (or, for a ready hint,
  missing for longer than ``ORPHAN_GRACE_S``), with ``if_match`` on the etag that was listed.
  A ready hint next to a *running* record may be a requeue in flight, and a lease hint next
  to a *queued* record may be a claim in flight: both are left alone, or the job could be lost.
* **complete**: [result object] → CAS record to terminal (fenced by the etag of the attempt's
  last write) → delete lease hint. A fenced-out attempt's result is dropped.

Heartbeats CAS the record itself (lease pushed out, in the store's clock): one request that
also notices cancellation, because a cancel changes the record and the CAS then fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

from lakeshore import lifecycle
from lakeshore.errors import Conflict, NotFound, StoreError
from lakeshore.keys import QueueKeys
from lakeshore.record import Blob, NewerRecord, Record, RecordError
from lakeshore.store.base import CREATE, OVERWRITE, ObjectInfo, Store, if_match

__all__ = ["ORPHAN_GRACE_S", "Claimed", "QueueOps"]

ORPHAN_GRACE_S = 60.0  # a ready hint without its record is in flight until this old
_CANDIDATES = 16  # ready hints read per claim
_SPREAD = 4  # after a lost race, the next claim tries the head of the queue in random order
_SCAN = 5000  # ready hints looked at (listed, not read) per claim at most


@dataclass
class Claimed:
    """A running attempt held by this worker: the record as written and its etag."""

    record: Record
    etag: str
    token: str


class QueueOps:
    """Protocol steps for one queue of one namespace."""

    def __init__(self, store: Store, keys: QueueKeys) -> None:
        self.store = store
        self.keys = keys
        self._contended = False  # did our last claim lose a race? then spread out
        # ids seen backing off (or in flight) -> when to look again: skipped without a GET,
        # so a long run of retries at the head of the queue never hides the work behind it
        self._later: dict[str, float] = {}

    # -- records -----------------------------------------------------------------------------

    def read(self, inv: str) -> tuple[Record, str]:
        """The record and its etag.

        Raises:
            NotFound: no such invocation in this queue.
            RecordError: the object is corrupt or of a newer schema.
        """
        data, etag = self.store.get(self.keys.record(inv))
        return Record.from_bytes(data, self.keys.record(inv)), etag

    def cas(self, rec: Record, etag: str) -> str:
        """Write ``rec`` over the version ``etag``; Conflict when someone wrote first."""
        return self.store.put(self.keys.record(rec.id), rec.to_bytes(), if_match(etag))

    # -- blobs -------------------------------------------------------------------------------

    def put_blob(self, key: str, data: bytes, spill_bytes: int) -> Blob:
        """Inline when small, else a create-only object checked by size and sha256."""
        if len(data) <= spill_bytes:
            return Blob(inline=data)
        try:
            self.store.put(key, data, CREATE)
        except Conflict:
            if self.store.get(key)[0] != data:  # same attempt, same key: only our own retry
                raise
        return Blob(ref=key, size=len(data), sha256=hashlib.sha256(data).hexdigest())

    def get_blob(self, blob: Blob, what: str, max_bytes: int | None = None) -> bytes:
        """The bytes of a blob; spilled ones are verified.

        Raises:
            StoreError: the spilled object is missing, does not match its size and sha256,
                or is larger than ``max_bytes`` (it is then not even fetched).
        """
        if blob.ref is None:
            return blob.inline or b""
        if max_bytes is not None and blob.size > max_bytes:
            raise StoreError(
                f"read {what}",
                f"the spilled object is {blob.size} bytes, over max_payload_bytes={max_bytes}",
                "raise Dispatch(max_payload_bytes=...) where it is read, if this is expected",
            )
        try:
            data, _ = self.store.get(blob.ref)
        except NotFound:
            raise StoreError(
                f"read {what}",
                f"the spilled object {blob.ref} is missing",
                "it was deleted (retention or by hand); the value cannot be recovered",
            ) from None
        if len(data) != blob.size or hashlib.sha256(data).hexdigest() != blob.sha256:
            raise StoreError(
                f"read {what}",
                f"the spilled object {blob.ref} does not match its size and sha256",
                "the object was altered; the value cannot be trusted",
            )
        return data

    # -- hints -------------------------------------------------------------------------------

    def put_ready(self, rec: Record) -> None:
        # The hint's bytes are the record write id: unique, so its etag is never reused (ABA).
        self.store.put(self.keys.ready(rec.priority, rec.id), rec.wid.encode(), OVERWRITE)

    def drop_hint(self, info: ObjectInfo) -> None:
        """Delete a stale hint, unless it was rewritten since we listed it."""
        with contextlib.suppress(Conflict):
            self.store.delete(info.key, if_match=info.etag)

    # -- steps ---------------------------------------------------------------------------------

    def submit(self, rec: Record) -> None:
        """Publish a new invocation: ready hint, then the record (create-only)."""
        self.put_ready(rec)
        self.store.put(self.keys.record(rec.id), rec.to_bytes(), CREATE)

    def ready_hints(self) -> Iterator[ObjectInfo]:
        return self.store.list(self.keys.ready_prefix)

    def claim(self, worker: str, now: float, lease_s: float | None = None) -> Claimed | None:
        """Try to take one queued invocation; None when there is nothing to take.
        ``lease_s`` overrides the invocation's lease length for this attempt.

        Corrupt records found on the way are marked failed (and skipped) so they never block
        the queue; invocations backing off before a retry are remembered and skipped without
        a GET until they are due, so they never hide the work queued behind them.
        """
        while True:
            later = {k: t for k, t in self._later.items() if t > now}
            self._later = dict(later)
            head: list[ObjectInfo] = []
            for scanned, info in enumerate(self.ready_hints()):
                if scanned >= _SCAN:
                    break
                if QueueKeys.id_of(info.key) not in later:
                    head.append(info)
                    if len(head) >= _CANDIDATES:
                        break
            if not head:
                return None
            # Alone, a worker takes the oldest job first (FIFO within a priority). Once it has
            # lost a race, it spreads over the head so competing workers stop colliding.
            spread = head[:_SPREAD]
            if self._contended:
                random.shuffle(spread)
            for info in spread + head[_SPREAD:]:
                got = self._try_claim(info, worker, now, lease_s)
                if got is not None:
                    return got
            if len(self._later) == len(later):
                return None  # nothing new learned: the rest is taken, stale or racing
            # every candidate was backing off (now remembered): look further down the queue

    def _try_claim(
        self, info: ObjectInfo, worker: str, now: float, lease_s: float | None = None
    ) -> Claimed | None:
        inv = QueueKeys.id_of(info.key)
        try:
            rec, etag = self.read(inv)
        except NotFound:
            if info.last_modified < now - ORPHAN_GRACE_S:
                self.drop_hint(info)  # its submitter died before writing the record
            else:  # a submit in flight (its record comes next), or an orphan: look again
                # after as long as the hint has existed, so a young one is picked up at once
                # and an orphan costs few GETs until it can be dropped
                age = max(0.0, now - info.last_modified)
                self._later[inv] = min(now + max(0.05, age), info.last_modified + ORPHAN_GRACE_S)
            return None
        except NewerRecord:
            self._later[inv] = now + ORPHAN_GRACE_S  # for a newer lakeshore's workers
            return None
        except RecordError as e:
            if self._fail_corrupt(inv, e, now):
                self.drop_hint(info)  # the record is failed now: its hint is stale
            return None
        if rec.state != "queued":
            if rec.terminal:
                self.drop_hint(info)
            else:  # running: the hint may belong to a requeue in flight; look again later
                self._later[inv] = now + min(5.0, rec.lease_s / 3)
            return None
        if lifecycle.past_deadline(rec, now):
            ended = lifecycle.time_out(rec, now)
            try:
                self.cas(ended, etag)
            except Conflict:
                return None
            self.settle(ended)
            self.drop_hint(info)
            return None
        if rec.not_before > now:
            self._later[inv] = rec.not_before  # backing off before a retry; the hint stays
            return None
        token = secrets.token_hex(8)
        running = lifecycle.claim(rec, worker, token, now, lease_s)
        self.store.put(self.keys.lease(inv), token.encode(), OVERWRITE)
        try:
            new_etag = self.cas(running, etag)
        except Conflict:
            self._contended = True
            return None  # lost the race: the lease hint stays, correct for the winner
        self._contended = False
        self.drop_hint(info)
        return Claimed(running, new_etag, token)

    def _fail_corrupt(self, inv: str, err: RecordError, now: float) -> bool:
        """Overwrite an unreadable record with a failed one that says why; True if done."""
        try:
            data, etag = self.store.get(self.keys.record(inv))
        except NotFound:
            return False
        if _usable(data):
            return False  # rewritten meanwhile (or of a newer schema): not ours to fail
        stub = Record(
            id=inv,
            ns=self.keys.ns,
            queue=self.keys.queue,
            fn="?",
            args=Blob(inline=b""),
            state="failed",
            error={"type": "CorruptRecord", "message": str(err), "traceback": ""},
            finished_at=now,
        )
        try:
            self.store.put(self.keys.record(inv), stub.to_bytes(), if_match(etag))
        except Conflict:
            return False
        return True

    def settle(self, rec: Record) -> None:
        """After a terminal write: free the admission slot the invocation held, if any (only
        if the slot is still the one it took)."""
        if rec.terminal and rec.slot is not None and rec.slot_etag is not None:
            with contextlib.suppress(Conflict):
                self.store.delete(self.keys.slot(rec.slot), if_match=rec.slot_etag)

    def heartbeat(self, held: Claimed, now: float) -> Claimed:
        """Push the lease out. Raises Conflict when the record changed (cancel, expiry)."""
        rec = lifecycle.heartbeat(held.record, held.token, now)
        return Claimed(rec, self.cas(rec, held.etag), held.token)

    def finish(self, held: Claimed, final: Record) -> str:
        """Write the attempt's outcome (fenced by the last etag), then tidy the hints.

        A retry goes back to queued: its ready hint is written first. Raises Conflict when the
        attempt was fenced out (the result is then dropped).
        """
        if final.state == "queued":
            self.put_ready(final)
        etag = self.cas(final, held.etag)
        self._drop_lease(final.id)
        self.settle(final)
        return etag

    def _drop_lease(self, inv: str) -> None:
        self.store.delete(self.keys.lease(inv))

    def reap(self, now: float) -> int:
        """Requeue (or fail) running invocations whose lease ran out; drop stale lease hints.
        Returns how many invocations were moved."""
        moved = 0
        for info in list(self.store.list(self.keys.leases_prefix)):
            inv = QueueKeys.id_of(info.key)
            try:
                rec, etag = self.read(inv)
            except NotFound:
                self.drop_hint(info)
                continue
            except RecordError:
                continue  # corrupt ones are failed by claimers; newer ones are not ours
            if rec.terminal:
                self.drop_hint(info)
                continue
            if rec.state != "running":
                continue  # queued: a claim may be in flight, and it needs this hint
            if rec.lease is None or rec.lease.expires_at >= now:
                continue
            nxt = lifecycle.expire(rec, now)
            if nxt.state == "queued":
                self.put_ready(nxt)
            try:
                self.cas(nxt, etag)
            except Conflict:
                continue  # the holder renewed or someone else reaped: fine either way
            self.settle(nxt)
            self.drop_hint(info)
            moved += 1
        return moved


def _usable(data: bytes) -> bool:
    """True unless ``data`` is a corrupt record (a newer schema is not corrupt)."""
    try:
        Record.from_bytes(data)
    except NewerRecord:
        return True
    except RecordError:
        return False
    return True
