"""The queue protocol on the store: each step is a few store requests in a fixed order.

Each invocation has a **ticket** ``_tickets/<band>/<id>`` in its queue, and, once anything
has moved it, a **record** ``<id>/record``. The submit is one create-only write: the ticket,
holding the queued record. The first move (a claim, a cancel, a missed deadline, a corrupt
ticket failed) creates the record, create-only, so exactly one mover wins; from then on the
record is the truth and every move is a compare-and-swap on it. So "the record" of an
invocation is ``<id>/record`` when it exists and the ticket's content before that; an etag
that starts with ``ticket:`` (:func:`unclaimed`) stands for "no record yet" and makes
:meth:`QueueOps.cas` create the record.

One invariant carries the protocol: **every live (queued or running) invocation has its
ticket**. It is the submit's only write, it stays while the job runs (which is how expired
leases are found: no separate lease hints), and it is deleted only after the record is
terminal. The orders below keep the invariant through any crash between two requests:

* **submit**: [args object] → [id index] → ticket (create-only). A ``Conflict`` means a
  tombstone holds the id: the submit was judged dead and fenced out (see ``fence.py``).
* **claim**: list tickets → get the ticket (a full one: no record yet) or the record (a
  ticket rewritten to a marker: the record exists) → create or CAS the record to running.
  The ticket stays while the job runs. One listing serves several claims of this process
  (for up to ``_LISTING_S``), and the process's slots take different candidates from it.
* **back to queued** (retry, release, expiry): rewrite the ticket to a marker (a new etag
  tells other workers to look again) → CAS record to queued.
* **complete**: [result object] → CAS record to terminal (fenced by the etag of the attempt's
  last write) → delete the ticket, in the worker's next batch (``lakeshore.tidy``). A
  fenced-out attempt's result is dropped.
* **lives**: each rerun is a new life of the invocation with a ticket key of its own
  (``<id>.<n>``, the record's ``reruns``), and a life that ended never comes back, so a
  ticket whose life is over is deleted without a condition: when its record is terminal in
  that life or has reached a later one. A ticket of a life the record has not reached is a
  rerun between its ticket and its record write, left alone until ``_RERUN_GRACE_S`` old.
  A marker whose record is missing is dropped once ``ORPHAN_GRACE_S`` old. A ticket that
  holds a terminal record is a tombstone and is left to gc.
* **expired leases**: a claimer that reads a running record whose lease has run out (in the
  store's clock) requeues or fails it by CAS; the holder's late writes are then fenced.

What a worker has read is remembered per ticket etag (running until its lease ends, backing
off until its retry is due, a tombstone): the ticket is skipped without a GET until then, or
until its etag changes. Heartbeats CAS the record itself (lease pushed out): one request
that also notices cancellation, because a cancel changes the record.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from lakeshore import lifecycle
from lakeshore.errors import (
    Conflict,
    IllegalTransition,
    InvalidArgument,
    NewerRecord,
    NotFound,
    PermissionDenied,
    RecordError,
    StoreError,
    TooLarge,
)
from lakeshore.keys import QueueKeys
from lakeshore.record import MAX_INLINE_BYTES, Blob, Record, write_id
from lakeshore.store.base import CREATE, OVERWRITE, ObjectInfo, Store, if_match
from lakeshore.tidy import Tidier

__all__ = [
    "ABANDONED",
    "MARKER_MAX",
    "MAX_RECORD_BYTES",
    "ORPHAN_GRACE_S",
    "Claimed",
    "QueueOps",
    "corrupt_stub",
    "unclaimed",
]

log = logging.getLogger("lakeshore.worker")

ABANDONED = "SubmitAbandoned"  # error type of a record whose submit was judged dead
# Every free-form field of a record has a cap (lakeshore.record.LIMITS): two inline blobs
# and a pickled callable of 1 MiB each, an error map of 8 texts of 64 KiB, small names.
# They add up to under 4 MiB; the rest is room for fields of newer schemas. Larger is not read.
MAX_RECORD_BYTES = 8 << 20
# Keys, slots, markers, index entries, queue records, signs of life: small by construction.
MAX_SMALL_BYTES = 1 << 20
# A ticket this small is a marker (a write id): its record exists. A ticket that holds a
# record is larger (the required fields alone take more), so the listing tells them apart.
MARKER_MAX = 64
ORPHAN_GRACE_S = 60.0  # a marker without its record: in flight (or being gc'd) until this old
_UNCLAIMED = "ticket:"  # etag prefix: the record is still the ticket's content
_RERUN_GRACE_S = 30.0  # a ticket of a life the record has not reached: a rerun until this old
_LISTING = 1000  # candidates kept from one LIST of the tickets (one S3 page)
_LISTING_S = 1.0  # a listing is reused by later claims for this long (bounds priority lag)
_MAX_SPREAD = 64  # widest random pick over the head of the queue once claims collide
_SCAN = 5000  # tickets looked at (listed, not read) per LIST at most
_LISTS_PER_CLAIM = 4
_NARROW_AFTER = 16  # clean claims in a row before the spread halves again
_BAD_TICKET_S = 60.0  # a ticket whose examination raised something unexpected: passed over


_Claimable = tuple[Record, str, str]  # record, its etag, the ticket's etag


def unclaimed(etag: str) -> bool:
    """True for the etag :meth:`QueueOps.read` gives a record that is still its ticket's
    content (no ``<id>/record`` yet): writing over it creates the record."""
    return etag.startswith(_UNCLAIMED)


@dataclass
class Claimed:
    """A running attempt held by this worker: the record as written and its etag, and the
    ticket's etag as listed (deleted with ``if_match`` once the record is terminal)."""

    record: Record
    etag: str
    token: str
    ticket_etag: str | None = None


class QueueOps:
    """Protocol steps for one queue of one namespace. Shared by the slots of a process:
    they take different candidates from one listing, so they never race each other."""

    def __init__(self, store: Store, keys: QueueKeys) -> None:
        self.store = store
        self.keys = keys
        self._lock = threading.Lock()
        self._listing_lock = threading.Lock()  # one LIST in flight per process
        self._spread = 1  # 1: strict order (FIFO per priority); grows while claims collide
        self._clean = 0  # claims won since the last lost race
        self._me = ""  # the worker id claims are made for (its own leases are no collision)
        # ticket key -> (its etag, when to look again): read and found not claimable, skipped
        # without a GET until then or until the ticket changes, so long-running jobs and
        # retries backing off at the head of the queue never hide the work behind them
        self._later: dict[str, tuple[str, float]] = {}
        # when the last retry this process read backing off comes due (store time): a worker
        # draining the queue does not leave before it has polled once after that
        self._retry_due = 0.0
        self._listing: list[ObjectInfo] = []
        self._listed_at = -1e9  # time.monotonic() of the listing
        self._trying: set[str] = set()  # ticket keys a slot of this process is reading now
        self._misses: dict[str, int] = {}  # ticket key -> times its record was not there yet
        # full tickets whose record exists (a create of it failed): read the record first
        self._promoted: set[str] = set()
        self._tidier = Tidier(store)

    # -- records -----------------------------------------------------------------------------

    def read(self, inv: str) -> tuple[Record, str]:
        """The record and its etag: ``<id>/record``, or, before anything moved the
        invocation, its ticket's content with an :func:`unclaimed` etag.

        Raises:
            NotFound: no such invocation in this queue.
            RecordError: the object is corrupt, of a newer schema, or larger than any
                record lakeshore writes (``MAX_RECORD_BYTES``; then it is not read).
        """
        try:
            return self.read_record(inv)
        except NotFound:
            ticket = self.keys.ticket_of_id(inv)
            if ticket is None:
                raise
        try:
            data, etag = self._get_bounded(ticket)
        except NotFound:
            # Between the two GETs the invocation may have been claimed, run and its ticket
            # deleted: then its record exists now.
            try:
                return self.read_record(inv)
            except NotFound:
                raise NotFound(
                    f"read {self.keys.record(inv)}", "no record and no ticket", "check the id"
                ) from None
        if len(data) <= MARKER_MAX:  # a marker: the record was written meanwhile
            return self.read_record(inv)
        return _decode_ticket(data, self.keys, ticket), _UNCLAIMED + etag

    def read_record(self, inv: str) -> tuple[Record, str]:
        """``<id>/record`` and its etag (NotFound before the first move)."""
        data, etag = self._get_bounded(self.keys.record(inv))
        return _decode(data, self.keys, inv), etag

    def _get_bounded(self, key: str) -> tuple[bytes, str]:
        try:
            return self.store.get(key, max_bytes=MAX_RECORD_BYTES)
        except TooLarge as e:
            raise RecordError(
                f"read {key}",
                f"the object is {e.details.get('size')} bytes, more than any record "
                f"({MAX_RECORD_BYTES})",
                "it was not read; delete it or cancel the invocation",
            ) from None

    def cas(self, rec: Record, etag: str) -> str:
        """Write ``rec`` over the version ``etag`` (create the record when ``etag`` is
        :func:`unclaimed`); Conflict when someone wrote first."""
        mode = CREATE if unclaimed(etag) else if_match(etag)
        return self.store.put(self.keys.record(rec.id), rec.to_bytes(), mode)

    # -- blobs -------------------------------------------------------------------------------

    def put_blob(self, key: str, data: bytes, spill_bytes: int) -> Blob:
        """Inline when small (at most ``spill_bytes``, and never over the record's cap for an
        inline blob), else a create-only object checked by size and sha256."""
        if len(data) <= min(spill_bytes, MAX_INLINE_BYTES):
            return Blob(inline=data)
        try:
            self.store.put(key, data, CREATE)
        except Conflict:
            if self.store.get(key, max_bytes=len(data))[0] != data:  # only our own retry
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

    # -- tickets -----------------------------------------------------------------------------

    def ticket_key(self, rec: Record) -> str:
        """The ticket of ``rec`` in its current life (``rec.reruns``)."""
        return self.keys.ticket(rec.priority, rec.id, rec.reruns)

    def put_marker(self, rec: Record) -> str:
        """Rewrite the ticket of ``rec`` (whose record exists) to a marker; returns its etag."""
        # The marker's bytes are the record write id: unique, so its etag is never reused (ABA).
        return self.store.put(self.ticket_key(rec), rec.wid.encode(), OVERWRITE)

    def drop_ticket(self, info: ObjectInfo, if_match: str | None = None) -> None:
        """Delete a stale ticket: one whose life has ended (its record is terminal in that
        life, or in a later one). Unconditional: that life never comes back, and a rerun
        writes a ticket of its own. A ticket of a life the record has not reached (or one
        that is not lakeshore's) may yet become a rerun's: that one is deleted only on the
        etag it was judged by (``if_match``), so a rerun that rewrote it meanwhile keeps it."""
        self._forget(info.key)
        if if_match is None:
            self.store.delete(info.key)
            return
        with contextlib.suppress(Conflict):
            self.store.delete(info.key, if_match=if_match)

    def drop_own_ticket(self, held: Claimed, until: float | None = None) -> None:
        """After the held attempt's terminal write: delete its ticket. With ``until`` (a
        store time), in the next batch of this process's background deletes, and skipped by
        this process's claims until then (unless it changes)."""
        key = self.ticket_key(held.record)
        self._forget(key)
        if until is None:
            self.store.delete(key)
            return
        if held.ticket_etag is not None:
            self._remember(ObjectInfo(key, held.ticket_etag, 0, 0.0), until)
        self._tidier.delete(key)

    def tickets(self) -> Iterator[ObjectInfo]:
        return self.store.list(self.keys.tickets_prefix)

    def _remember(self, info: ObjectInfo, until: float) -> None:
        with self._lock:
            self._later[info.key] = (info.etag, until)

    def _forget(self, key: str) -> None:
        with self._lock:
            self._later.pop(key, None)
            self._misses.pop(key, None)
            self._promoted.discard(key)

    def retry_due(self) -> float:
        """When the last retry this process has read backing off comes due (store time; 0
        when none). A record claiming a time past the longest backoff does not count."""
        with self._lock:
            return self._retry_due

    def _skipped(self, info: ObjectInfo, now: float) -> bool:
        seen = self._later.get(info.key)
        return seen is not None and seen[0] == info.etag and seen[1] > now

    # -- steps ---------------------------------------------------------------------------------

    def submit(self, rec: Record) -> bool:
        """Publish a new invocation: its ticket, holding the queued record, create-only (one
        request). Returns False when the ticket's key is taken already (a tombstone: the
        submit was judged dead and fenced out); True once the ticket is ours.

        Raises:
            InvalidArgument: ``rec.id`` was not made by :func:`keys.new_id` for its priority.
            StoreError: the store failed (the invocation was not published).
        """
        key = self.keys.ticket(rec.priority, rec.id)
        if self.keys.ticket_of_id(rec.id) != key:
            raise InvalidArgument(
                f"submit {rec.id}",
                f"the id does not carry band {key.rsplit('/', 2)[1]} of priority {rec.priority}",
                "make ids with lakeshore.keys.new_id(priority)",
            )
        data = rec.to_bytes()
        try:
            self.store.put(key, data, CREATE)
        except Conflict:
            try:  # our own write, retried by the store after a lost answer?
                return self.store.get(key, max_bytes=len(data))[0] == data
            except (NotFound, TooLarge):
                return False
        return True

    def claim(
        self,
        worker: str,
        now: float,
        lease_s: float | None = None,
        stopping: Callable[[], bool] | None = None,
    ) -> Claimed | None:
        """Try to take one queued invocation; None when there is nothing to take (or
        ``stopping()`` turned true: no claim is written after that).
        ``lease_s`` overrides the invocation's lease length for this attempt.

        ``now`` is the store time the caller read; each candidate is judged at the later of
        it and a fresh reading, and the lease is counted from a reading taken just before the
        claim's write, so a claim slowed by many reads still writes a full lease.

        Running invocations whose lease has run out are requeued (or failed) on the way;
        corrupt records are marked failed so they never block the queue; invocations
        backing off before a retry are skipped without a GET until they are due.
        """
        self._me = worker
        lists = 0
        while True:
            if stopping is not None and stopping():
                return None
            now = max(now, self.store.now())
            info = self._next_candidate(now)
            if info is None:
                if lists >= _LISTS_PER_CLAIM or not self._list(now):
                    return None
                lists += 1
                continue
            try:
                got = self._try_claim(info, worker, now, lease_s, stopping)
            except (StoreError, PermissionDenied):
                raise  # the store's trouble, not this ticket's: the caller decides
            except Exception:
                # A bug or a shape nobody foresaw: one object must not stop the worker. Pass
                # this ticket over for a while (until it changes) and serve the others.
                log.exception("claim on %s: passing over %s for now", self.keys.queue, info.key)
                self._remember(info, now + _BAD_TICKET_S)
                continue
            finally:
                with self._lock:
                    self._trying.discard(info.key)
            if got is not None:
                return got

    def _list(self, now: float) -> bool:
        """List the head of the queue (what is not skipped); False when there is none.
        One slot lists at a time: slots that ran dry together wait for its listing instead
        of each sending the same LIST."""
        asked = time.monotonic()
        with self._listing_lock:
            with self._lock:
                if self._listed_at >= asked:  # another slot listed while we waited
                    return bool(self._listing)
            fresh: list[ObjectInfo] = []
            seen: set[str] = set()
            for scanned, info in enumerate(self.tickets()):
                if scanned >= _SCAN or len(fresh) >= _LISTING:
                    break
                seen.add(info.key)
                if not self._skipped(info, now):
                    fresh.append(info)
            with self._lock:
                self._later = {k: v for k, v in self._later.items() if v[1] > now}
                self._promoted &= seen
                self._listing = fresh
                self._listed_at = time.monotonic()
            return bool(fresh)

    def _next_candidate(self, now: float) -> ObjectInfo | None:
        """Take a candidate from the listing: the oldest while claims go through, a random
        one of the head while they collide (other processes list the same head). The pick
        stays inside the head's priority band: never a lower band first."""
        with self._lock:
            if time.monotonic() - self._listed_at > _LISTING_S:
                self._listing = []
            head: list[int] = []
            band = None
            for i, info in enumerate(self._listing):
                if info.key in self._trying or self._skipped(info, now):
                    continue
                this = info.key.rsplit("/", 2)[-2]
                if band is None:
                    band = this
                elif this != band:
                    break
                head.append(i)
                if len(head) >= self._spread:
                    break
            if not head:
                self._listing = []
                return None
            info = self._listing.pop(random.choice(head))
            self._trying.add(info.key)
            return info

    def _collided(self, lost: bool) -> None:
        # widen fast, narrow slowly: among busy workers the spread stays wide (few races);
        # a worker left alone is back to strict order after a run of clean claims
        with self._lock:
            if lost:
                self._spread, self._clean = min(self._spread * 4, _MAX_SPREAD), 0
            else:
                self._clean += 1
                if self._clean % _NARROW_AFTER == 0:
                    self._spread = max(1, self._spread // 2)

    def _examine(self, info: ObjectInfo, now: float) -> tuple[_Claimable | None, bool]:
        """Read the record behind a ticket and settle what needs no claim: drop a stale
        ticket, requeue an expired lease, time out a missed deadline, remember what is not
        due. Returns the record, its etag and the ticket's etag when it is claimable now,
        and whether an expired lease was ended."""
        moved = False
        inv = QueueKeys.id_of(info.key)
        try:
            got = self._read_listed(info, inv)
        except NotFound:
            if info.last_modified < now - ORPHAN_GRACE_S:
                self.drop_ticket(info)  # a marker whose record is gone (gc, by hand)
            else:  # a record being written or deleted: look again soon, then less and less
                # often, so a young one is picked up at once and an orphan costs a dozen
                # GETs until it can be dropped. (Not from the ticket's age: listings give
                # last-modified times in whole seconds.)
                with self._lock:
                    misses = self._misses[info.key] = self._misses.get(info.key, 0) + 1
                wait = min(0.005 * 2 ** min(misses, 12), 5.0)
                self._remember(info, min(now + wait, info.last_modified + ORPHAN_GRACE_S))
            return None, moved
        except NewerRecord:
            self._remember(info, now + ORPHAN_GRACE_S)  # for a newer lakeshore's workers
            return None, moved
        except RecordError as e:
            if self._fail_corrupt(inv, e, now):
                self.drop_ticket(info)  # the record is failed now: its ticket is stale
            return None, moved
        if got is None:
            return None, moved
        rec, etag, ticket_etag = got
        if self._misses:
            with self._lock:
                self._misses.pop(info.key, None)
        if unclaimed(etag) and rec.terminal:
            # a tombstone (a submit fenced out): it stays, so the late submit cannot land;
            # gc removes it with the finished invocations
            self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), math.inf)
            return None, moved
        life = QueueKeys.reruns_of(info.key)
        if life is None or rec.reruns > life:
            self.drop_ticket(info)  # a ticket of an earlier life (or not one we write)
            return None, moved
        if rec.reruns < life:
            # a rerun between its ticket and its record write, or a ticket nobody should
            # have written: look again once it is older than a rerun takes
            if info.last_modified > now - _RERUN_GRACE_S:
                self._remember(info, info.last_modified + _RERUN_GRACE_S)
            else:  # unless a rerun rewrote it since it was read (its record may be queued now)
                self.drop_ticket(info, if_match=ticket_etag)
            return None, moved
        if rec.state == "running":
            expires = rec.lease.expires_at if rec.lease is not None else now
            if expires >= now:
                self._remember(info, expires)  # its worker holds it: look again at expiry
                if rec.lease is not None and rec.lease.worker != self._me:
                    # taken by another process since we listed it: spread out as after a
                    # lost race, or this process keeps walking just behind the other
                    self._collided(True)
                return None, moved
            nxt = lifecycle.expire(rec, now)
            if nxt.state == "queued":
                ticket_etag = self.put_marker(nxt)  # before the record says queued
            try:
                etag = self.cas(nxt, etag)
            except Conflict:
                return None, moved  # the holder renewed or someone else reaped
            self.settle(nxt)
            rec, moved = nxt, True
        if rec.terminal:  # in this ticket's life: it is over (a rerun writes its own ticket)
            self.drop_ticket(info)
            return None, moved
        if lifecycle.past_deadline(rec, now):
            ended = lifecycle.time_out(rec, now)
            try:
                self.cas(ended, etag)
            except Conflict:
                self._lost_create(info.key, etag)
                return None, moved
            self.settle(ended)
            self.drop_ticket(info)
            return None, moved
        if rec.not_before > now:
            # backing off before a retry; the ticket stays
            self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), rec.not_before)
            if rec.not_before <= now + lifecycle.MAX_BACKOFF_S:  # no later than a real backoff
                with self._lock:
                    self._retry_due = max(self._retry_due, rec.not_before)
            return None, moved
        return (rec, etag, ticket_etag), moved

    def _read_listed(self, info: ObjectInfo, inv: str) -> tuple[Record, str, str] | None:
        """The record behind a listed ticket, its etag and the ticket's etag; None for a
        stray ticket (dropped). A ticket that holds a record is read itself (one GET for a
        fresh submit), unless a create of its record already failed; a marker's record is
        read directly.

        Raises:
            NotFound: a marker (or a ticket whose record existed) and no record.
            RecordError: neither the ticket nor the record can be used.
        """
        full = info.size > MARKER_MAX and info.key not in self._promoted
        if full and self._spread > 1:
            # Other processes claim from this queue too (this one lost races lately): a full
            # ticket at the head has most likely been claimed since the listing, and its
            # record tells so for one GET, where trying to create it would be a lost write.
            with contextlib.suppress(NotFound):
                rec, rec_etag = self.read_record(inv)
                return rec, rec_etag, info.etag
        if full:
            data, etag = self._get_bounded(info.key)  # NotFound: gone since the listing
            if len(data) > MARKER_MAX:
                try:
                    return _decode_ticket(data, self.keys, info.key), _UNCLAIMED + etag, etag
                except NewerRecord:
                    raise
                except RecordError as err:
                    if self.keys.ticket_of_id(inv) != info.key:
                        # not where lakeshore puts this id's ticket: no invocation's (yet:
                        # a rerun may overwrite it with its ticket before this delete)
                        self.drop_ticket(info, if_match=etag)
                        return None
                    try:  # a record that exists is the truth; its ticket is only a marker
                        rec, rec_etag = self.read_record(inv)
                    except NotFound:
                        raise err from None  # nothing to run: _fail_corrupt records why
                    return rec, rec_etag, etag
            info = ObjectInfo(info.key, etag, len(data), info.last_modified)
        rec, rec_etag = self.read_record(inv)
        return rec, rec_etag, info.etag

    def _lost_create(self, key: str, etag: str) -> None:
        """A write over a ticket's content lost: the record exists now; read it next time."""
        if unclaimed(etag):
            with self._lock:
                self._promoted.add(key)

    def _try_claim(
        self,
        info: ObjectInfo,
        worker: str,
        now: float,
        lease_s: float | None = None,
        stopping: Callable[[], bool] | None = None,
    ) -> Claimed | None:
        seen, _ = self._examine(info, now)
        if seen is None or (stopping is not None and stopping()):
            return None
        rec, etag, ticket_etag = seen
        token = write_id()
        # The lease counts from the clock read right before the write, not from when the
        # claim began: a slow read or a long walk past running records must not eat into it.
        now = max(now, self.store.now())
        try:
            running = lifecycle.claim(rec, worker, token, now, lease_s)
        except IllegalTransition:
            return None  # its start deadline passed meanwhile: the next claim ends it
        try:
            new_etag = self.cas(running, etag)
        except Conflict:
            self._collided(True)
            if unclaimed(etag):  # its record exists: the next look reads that instead
                self._lost_create(info.key, etag)
                return None
            # someone else claimed it (or cancelled it): look again when a lease would end
            self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), now + running.lease_s)
            return None
        self._collided(False)
        assert running.lease is not None
        self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), running.lease.expires_at)
        return Claimed(running, new_etag, token, ticket_etag)

    def _fail_corrupt(self, inv: str, err: RecordError, now: float) -> bool:
        """Overwrite an unreadable record with a failed one that says why (or create it,
        when the unreadable one is the ticket's content); True if done."""
        key = self.keys.record(inv)
        stub = corrupt_stub(self.keys, inv, err, now)
        try:
            data, etag = self.store.get(key, max_bytes=MAX_RECORD_BYTES)
        except NotFound:
            try:
                self.store.put(key, stub.to_bytes(), CREATE)
            except Conflict:
                return False
            return True
        except TooLarge:  # never read: its etag comes from a listing
            found = [i for i in self.store.list(key) if i.key == key]
            if not found or found[0].size <= MAX_RECORD_BYTES:
                return False  # gone, or rewritten meanwhile
            data, etag = b"", found[0].etag
        if data and _usable(data, self.keys, inv):
            return False  # rewritten meanwhile (or of a newer schema): not ours to fail
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
        return Claimed(rec, self.cas(rec, held.etag), held.token, held.ticket_etag)

    def finish(self, held: Claimed, final: Record, tidy_later: bool = False) -> str:
        """Write the attempt's outcome (fenced by the last etag), then tidy the ticket.

        Back to queued (a retry, a release): the ticket is rewritten to a marker first, so
        workers that remember the job as running look again. Terminal: the ticket (and
        admission slot) are deleted after — by a background thread with ``tidy_later`` (a
        worker: the outcome is visible at once, and a delete lost with the process only
        leaves a stale ticket for claimers to drop; ``flush`` waits for them).
        Raises Conflict when the attempt was fenced out (the result is then dropped).
        """
        if final.state == "queued":
            self._forget(self.ticket_key(final))
            self.put_marker(final)
        etag = self.cas(final, held.etag)
        if not final.terminal:
            self.settle(final)
        elif tidy_later:
            self.drop_own_ticket(held, until=(final.finished_at or 0.0) + ORPHAN_GRACE_S)
            if final.slot is not None:
                self._tidier.later(lambda: self.settle(final))
        else:
            self.drop_own_ticket(held)
            self.settle(final)
        return etag

    def flush(self, timeout: float = 30.0) -> bool:
        """Send the pending ticket deletes and wait for background tidying to finish; False
        if ``timeout`` passed first."""
        return self._tidier.flush(timeout)

    def reap(self, now: float) -> int:
        """One pass over the tickets: requeue (or fail) running invocations whose lease ran
        out and drop stale tickets. Claims do this on their way, for the head of the queue;
        a pass reads every live record not remembered. Returns how many moved."""
        moved = 0
        for scanned, info in enumerate(list(self.tickets())):
            if scanned >= _SCAN:
                break
            if not self._skipped(info, now):
                moved += self._examine(info, now)[1]
        return moved


def corrupt_stub(
    keys: QueueKeys,
    inv: str,
    err: RecordError,
    finished_at: float | None,
    submitted_at: float = 0.0,
) -> Record:
    """The failed record that replaces an unreadable one (``CorruptRecord``, saying why)."""
    return Record(
        id=inv,
        ns=keys.ns,
        queue=keys.queue,
        fn="?",
        args=Blob(inline=b""),
        state="failed",
        error={"type": "CorruptRecord", "message": str(err), "traceback": ""},
        submitted_at=submitted_at,
        finished_at=finished_at,
    )


def _decode(data: bytes, keys: QueueKeys, inv: str) -> Record:
    """The record stored for ``inv``; it must name itself as the one at this key, or a
    write meant for it would land on another invocation's record.

    Raises:
        RecordError: corrupt, or a record of another invocation. NewerRecord: newer schema.
    """
    where = keys.record(inv)
    rec = Record.from_bytes(data, where)
    if (rec.id, rec.ns, rec.queue) != (inv, keys.ns, keys.queue):
        raise RecordError(
            f"read {where}",
            f"the record names another invocation ({rec.ns}/{rec.queue}/{rec.id})",
            "the object was copied or written by hand; cancel or delete the invocation",
        )
    return rec


def _decode_ticket(data: bytes, keys: QueueKeys, ticket: str) -> Record:
    """The queued record a ticket holds. It must be the record of the id at the end of the
    ticket's key, made for the ticket's band, and queued or terminal (a tombstone): a
    producer that can write tickets must not be able to start a job anywhere else.

    Raises:
        RecordError: not such a record. NewerRecord: newer schema.
    """
    inv = QueueKeys.id_of(ticket)
    rec = _decode(data, keys, inv)
    if keys.ticket(rec.priority, inv) != ticket or keys.ticket_of_id(inv) != ticket:
        raise RecordError(
            f"read {ticket}",
            f"the ticket's record has priority {rec.priority}, not that of its band",
            "the object was copied or written by hand; delete it",
        )
    stone = rec.state == "failed" and (rec.error or {}).get("type") == ABANDONED
    if (rec.state != "queued" and not stone) or rec.lease is not None or rec.attempt:
        raise RecordError(
            f"read {ticket}",
            f"a ticket holds a record as submitted (or a tombstone), not one in state "
            f"{rec.state!r} at attempt {rec.attempt}",
            "the object was written by hand; delete it",
        )
    return rec


def _usable(data: bytes, keys: QueueKeys, inv: str) -> bool:
    """True unless ``data`` is a corrupt record (a newer schema is not corrupt)."""
    try:
        _decode(data, keys, inv)
    except NewerRecord:
        return True
    except RecordError:
        return False
    return True
