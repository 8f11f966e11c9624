"""The queue protocol on the store: each step is a few store requests in a fixed order.

:class:`QueueOps` owns every write of the protocol for one queue: the submit's publish
sequence, record moves, markers, results, heartbeats, the outcome, cancel, rerun, the
tombstone that fences out a dead submit, freeing an admission slot. It also knows where an
invocation's record is: its ticket until the first move, ``<id>/record`` from then on (an
:func:`unclaimed` etag makes :meth:`QueueOps.cas` create it, so one first mover wins).

Its orders keep one invariant through a crash between any two requests: every live invocation
has its ticket, deleted only once its record is terminal in that ticket's life. Every later
move is a compare-and-swap on the record, so a fenced-out attempt's writes are refused and its
result dropped. Which ticket to claim is the claim scheduler's choice
(``lakeshore.protocol.claims``). The other writers of queue keys are named in
docs/protocol.md#key-layout (``tests/unit/test_layering.py`` keeps it so). Each step, and why
a crash loses nothing: docs/protocol.md#the-steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    LakeshoreError,
    NewerRecord,
    NotFound,
    PermissionDenied,
    RecordError,
    StoreError,
    StoreUnavailable,
    TooLarge,
)
from lakeshore.keys import DEFAULT_QUEUE, QueueKeys, id_index
from lakeshore.model import lifecycle
from lakeshore.model.record import MAX_INLINE_BYTES, Blob, Record, State
from lakeshore.protocol.tidy import Tidier
from lakeshore.store.base import CREATE, OVERWRITE, ObjectInfo, Store, if_match

__all__ = [
    "ABANDONED",
    "CLAIM_FENCE_S",
    "MARKER_MAX",
    "MAX_RECORD_BYTES",
    "ORPHAN_GRACE_S",
    "Claimed",
    "Memory",
    "QueueOps",
    "abandoned",
    "corrupt_stub",
    "decode_ticket",
    "elapsed",
    "read_id_index",
    "unclaimed",
    "unclaimed_etag",
    "write_id_index",
]

log = logging.getLogger("lakeshore.worker")

ABANDONED = "SubmitAbandoned"  # error type of a record whose submit was judged dead
# Every free-form field of a record has a cap (lakeshore.model.record.LIMITS): two inline blobs
# and a pickled callable of 1 MiB each, an error map of 8 texts of 64 KiB, small names.
# They add up to under 4 MiB; the rest is room for fields of newer schemas. Larger is not read.
MAX_RECORD_BYTES = 8 << 20
# Keys, slots, markers, index entries, queue records, signs of life: small by construction.
MAX_SMALL_BYTES = 1 << 20
# A ticket this small is a marker (a write id): its record exists. A ticket that holds a
# record is larger (the required fields alone take more), so the listing tells them apart.
MARKER_MAX = 64
_TIDYING_PRUNE = 4096  # tickets awaiting their delete before expired ones are dropped
ORPHAN_GRACE_S = 60.0  # a marker without its record: in flight (or being gc'd) until this old
# gc deletes a record no sooner than this after its ticket was last seen; a claim that took
# longer from reading a full ticket to creating the record proves the ticket still exists
CLAIM_FENCE_S = 1.0
_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


def elapsed() -> float:
    """Seconds on a clock that nothing steps and that counts time the machine was
    suspended (``CLOCK_BOOTTIME`` where there is one): a claim that slept through a
    suspend has taken that long, as gc sees it."""
    return time.monotonic() if _CLOCK is None else time.clock_gettime(_CLOCK)


# an outcome write the store's own retries could not land is sent again after these pauses
_OUTCOME_PAUSE_S, _OUTCOME_PAUSE_CAP_S = 0.25, 4.0
_UNCLAIMED = "ticket:"  # etag prefix: the record is still the ticket's content


def unclaimed_etag(ticket_etag: str) -> str:
    """The etag :meth:`QueueOps.read` gives a record read from its ticket (etag given)."""
    return _UNCLAIMED + ticket_etag


def unclaimed(etag: str) -> bool:
    """True for the etag :meth:`QueueOps.read` gives a record that is still its ticket's
    content (no ``<id>/record`` yet): writing over it creates the record."""
    return etag.startswith(_UNCLAIMED)


def abandoned(rec: Record) -> bool:
    """True for a tombstone written by :meth:`QueueOps.fence`."""
    error = rec.error
    return rec.state == State.FAILED and isinstance(error, dict) and error.get("type") == ABANDONED


class Memory(Protocol):
    """What a claim scheduler remembers of tickets (``lakeshore.protocol.claims.Claimer``):
    the steps tell it when a ticket they rewrote must be looked at again."""

    def forget(self, key: str) -> None: ...


@dataclass
class Claimed:
    """A running attempt held by this worker: the record as written and its etag, the
    ticket's etag as listed (deleted with ``if_match`` once the record is terminal), and
    the scheduler that claimed it (told when its ticket changes)."""

    record: Record
    etag: str
    token: str
    ticket_etag: str | None = None
    by: Memory | None = None


class QueueOps:
    """Protocol steps for one queue of one namespace: each write of the queue protocol is
    a method here. Stateless but for the background tidier; what a worker remembers while
    it claims is its scheduler's (``lakeshore.protocol.claims.Claimer``)."""

    def __init__(self, store: Store, keys: QueueKeys) -> None:
        self.store = store
        self.keys = keys
        self._tidier = Tidier(store)
        self._lock = threading.Lock()
        # ticket key -> (its etag, until when): a life this process ended, whose delete is
        # waiting in the tidier's batch; every claimer of this process skips it meanwhile
        self._tidying: dict[str, tuple[str, float]] = {}
        self._prune_at = _TIDYING_PRUNE

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
            data, etag = self.read_bounded(ticket)
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
        return decode_ticket(data, self.keys, ticket), _UNCLAIMED + etag

    def read_record(self, inv: str) -> tuple[Record, str]:
        """``<id>/record`` and its etag (NotFound before the first move)."""
        data, etag = self.read_bounded(self.keys.record(inv))
        return _decode(data, self.keys, inv), etag

    def read_bounded(self, key: str) -> tuple[bytes, str]:
        """An object no larger than any record (a ticket or a record).

        Raises:
            NotFound: no such object. RecordError: it is larger than any record.
        """
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

    def put_args(self, inv: str, data: bytes, spill_bytes: int) -> Blob:
        """The submit's arguments as a blob (spilled to ``<id>/args`` when large)."""
        return self.put_blob(self.keys.args(inv), data, spill_bytes)

    def put_result(self, rec: Record, data: bytes, spill_bytes: int) -> Blob:
        """The attempt's result as a blob (spilled to ``<id>/result-<attempt>`` when large:
        a late attempt never overwrites another's)."""
        return self.put_blob(self.keys.result(rec.id, rec.attempt), data, spill_bytes)

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
            # never more than the size the record declares: the object may be anyone's
            data, _ = self.store.get(blob.ref, max_bytes=blob.size)
        except TooLarge:
            data = b""  # not what was declared: refused below without reading it
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
        if if_match is None:
            self.store.delete(info.key)
            return
        with contextlib.suppress(Conflict):
            self.store.delete(info.key, if_match=if_match)

    def unclaim_if_stale(self, ticket: str, ticket_etag: str, rec: Record, etag: str) -> bool:
        """After a slow claim that created the record of ``rec`` from the ticket ``ticket``
        read at ``ticket_etag``: prove the ticket is still there, unchanged. If it is not,
        the invocation ended and gc removed its record while the claim stalled (gc waits
        ``CLAIM_FENCE_S`` between a ticket's end and its record's delete, so only a claim
        slower than that can meet this): the record just created is deleted again, on its
        etag, and True says the claim must not run. A ticket that cannot be read is taken
        as not proven: the claim is undone all the same, which for a live invocation only
        hands it back to the queue.

        Raises:
            StoreError: the store failed to delete the record too.
        """
        why = "its ticket ended while the claim stalled (finished and collected meanwhile)"
        try:
            if self.store.get(ticket, max_bytes=MAX_RECORD_BYTES)[1] == ticket_etag:
                return False
        except (NotFound, TooLarge):
            pass
        except StoreError as e:
            # unproven: undone all the same. A live invocation is queued again by its ticket
            # (its record gone, the ticket holds it as submitted); a collected one stays gone
            why = f"its ticket could not be read to prove the claim ({e})"
        log.warning("claim of %s: %s: not running it", rec.id, why)
        with contextlib.suppress(Conflict):
            self.store.delete(self.keys.record(rec.id), if_match=etag)
        return True

    def drop_own_ticket(self, held: Claimed, until: float | None = None) -> None:
        """After the held attempt's terminal write: delete its ticket. With ``until`` (a
        store time), in the next batch of this process's background deletes, and skipped by
        worker's claims until then (unless it changes)."""
        key = self.ticket_key(held.record)
        if held.by is not None:
            held.by.forget(key)
        if until is None:
            self.store.delete(key)
            return
        if held.ticket_etag is not None:
            with self._lock:
                if len(self._tidying) >= self._prune_at:  # drop what has passed by now
                    now = until - ORPHAN_GRACE_S
                    self._tidying = {k: v for k, v in self._tidying.items() if v[1] > now}
                    self._prune_at = max(_TIDYING_PRUNE, 2 * len(self._tidying))
                self._tidying[key] = (held.ticket_etag, until)
        self._tidier.delete(key)

    def tidying(self, info: ObjectInfo, now: float) -> bool:
        """The ticket ``info`` is of a life this process ended, its delete still pending."""
        seen = self._tidying.get(info.key)
        return seen is not None and seen[0] == info.etag and seen[1] > now

    def tickets(self, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """The queue's tickets in key order (claim order), after ``start_after`` if given."""
        return self.store.list(self.keys.tickets_prefix, start_after)

    # -- steps ---------------------------------------------------------------------------------

    def publish(
        self, draft: Record, payload: bytes, spill_bytes: int, deadline_s: float | None
    ) -> Record | None:
        """A submit's writes, in their order: the arguments in an object of their own when
        they are over ``spill_bytes``, the id index outside the default queue, then the
        ticket (:meth:`submit`), the one write that makes the invocation exist. Everything
        the ticket depends on exists before it. Returns the record as published; None when
        the ticket's key was taken (a tombstone: the submit was fenced out).

        Raises:
            InvalidArgument: the id does not carry the band of its priority.
            StoreError: the store failed (the invocation was not published).
        """
        now = self.store.now()
        rec = dataclasses.replace(
            draft,
            args=self.put_args(draft.id, payload, spill_bytes),
            # a delayed submit's deadline counts from when it comes due
            deadline_at=max(now, draft.not_before) + deadline_s if deadline_s is not None else None,
            submitted_at=now,
        )
        if rec.queue != DEFAULT_QUEUE:
            write_id_index(self.store, self.keys.ns, rec.id, rec.queue)
        return rec if self.submit(rec) else None

    def submit(self, rec: Record) -> bool:
        """Publish a new invocation: its ticket, holding the queued record, create-only (one
        request). Returns False when the ticket's key is taken already (a tombstone: the
        submit was judged dead and fenced out); True once the ticket is ours.

        Raises:
            InvalidArgument: ``rec.id`` was not made by :func:`keys.new_id` for its priority.
            StoreError: the store failed (the invocation was not published).
        """
        key = self.keys.ticket(rec.priority, rec.id)
        self.check_ticket(rec, key)
        data = rec.to_bytes()
        try:
            self.store.put(key, data, CREATE)
        except Conflict:
            try:  # our own write, retried by the store after a lost answer?
                return self.store.get(key, max_bytes=len(data))[0] == data
            except (NotFound, TooLarge):
                return False
        return True

    def check_ticket(self, rec: Record, key: str) -> None:
        """Refuse a ticket ``key`` that is not where ``rec.id`` says its ticket is.

        Raises:
            InvalidArgument: ``rec.id`` was not made by :func:`keys.new_id` for its priority.
        """
        if self.keys.ticket_of_id(rec.id) != key:
            raise InvalidArgument(
                f"submit {rec.id}",
                f"the id does not carry band {key.rsplit('/', 2)[1]} of priority {rec.priority}",
                "make ids with lakeshore.keys.new_id(priority)",
            )

    def fail_corrupt(self, inv: str, err: RecordError, now: float) -> bool:
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

    def fence(self, inv: str, now: float, why: str) -> bool:
        """Fence out a submit judged dead: create the tombstone of ``inv`` (a ``failed``
        record, error type ``SubmitAbandoned``) at its ticket, create-only; True if it landed,
        False if its ticket (or record) exists. A process acts on a dead submit only once this
        landed: the late submitter's own create then meets ``Conflict``, so that invocation can
        never become live. (An id made before 0.4 carries no band, and its submitter wrote
        ``<id>/record`` last: its tombstone goes there.)

        Raises:
            StoreError: the store failed.
        """
        stone = Record(
            id=inv,
            ns=self.keys.ns,
            queue=self.keys.queue,
            fn="?",
            args=Blob(inline=b""),
            state=State.FAILED,
            error={
                "type": ABANDONED,
                "message": f"the submit of {inv} never wrote its ticket: {why}; nothing ran",
                "traceback": "",
            },
            submitted_at=now,
            finished_at=now,
        )
        where = self.keys.ticket_of_id(inv)
        if where is None:
            try:
                self.store.put(self.keys.record(inv), stone.to_bytes(), CREATE)
            except Conflict:
                return False
            return True
        stone = dataclasses.replace(stone, priority=QueueKeys.priority_of(where))
        try:
            etag = self.store.put(where, stone.to_bytes(), CREATE)
        except Conflict:
            return False
        # The caller found neither record nor ticket, but between its two reads the invocation
        # may have been claimed, run and its ticket deleted: then its record exists, and the
        # tombstone (which the record outranks for every reader) is taken back.
        try:
            self.read_record(inv)
        except NotFound:
            return True
        except RecordError:
            pass
        # Best effort: a producer may not delete tickets. A tombstone left beside a record is
        # harmless (readers take the record; claimers leave tombstones alone; gc removes it).
        with contextlib.suppress(Conflict, PermissionDenied):
            self.store.delete(where, if_match=etag)
        return False

    def cancel(self, rec: Record, etag: str, reason: str) -> bool:
        """Move the invocation to ``killed`` (re-reading after a lost race) and free its
        slot; False if it had finished. A running body is stopped by its holder, whose
        next heartbeat meets the changed record."""
        while not rec.terminal:
            killed = lifecycle.cancel(rec, self.store.now(), reason)
            try:
                self.cas(killed, etag)
            except Conflict:
                rec, etag = self.read(rec.id)
                continue
            self.free_slot(killed)
            return True
        return False

    def rerun(self, rec: Record, etag: str, only_if: Callable[[Record], bool] | None = None) -> int:
        """Queue a finished invocation again as a new life (its own ticket, written before
        the record says queued); returns the new attempt's number. With ``only_if``, a
        record read again after a lost race is rerun only if it still passes (a bulk
        retry's filter: whoever won the race may have rerun it, and it may have ended
        again since).

        Raises:
            Conflict: it is still live, or it is a tombstone (nothing was submitted), or
                it no longer passes ``only_if``.
        """
        while True:
            if only_if is not None and not only_if(rec):
                raise Conflict(
                    f"retry {rec.id}",
                    f"the invocation changed meanwhile (now {rec.state})",
                    "someone else moved it first; nothing to do",
                    id=rec.id,
                    state=rec.state,
                )
            if abandoned(rec):
                raise Conflict(
                    f"retry {rec.id}",
                    "the submit of this id was abandoned: nothing was submitted to run again",
                    "submit the call again",
                    id=rec.id,
                    state=rec.state,
                )
            if not rec.terminal:
                raise Conflict(
                    f"retry {rec.id}",
                    f"the invocation is still {rec.state}",
                    "wait for it to finish, or cancel it first",
                    id=rec.id,
                    state=rec.state,
                )
            nxt = lifecycle.rerun(rec, self.store.now())
            self.put_marker(nxt)  # the ticket exists before the record says queued
            try:
                self.cas(nxt, etag)
            except Conflict:
                rec, etag = self.read(rec.id)
                continue
            try:  # a claimer that judged the ticket stale before the CAS may have dropped it
                self.store.get(self.ticket_key(nxt), max_bytes=MAX_SMALL_BYTES)
            except NotFound:
                self.put_marker(nxt)
            return rec.attempt + 1

    def free_slot(self, rec: Record) -> None:
        """After a terminal write: free the admission slot the invocation held, if any (only
        if the slot is still the one it took)."""
        if rec.terminal and rec.slot is not None and rec.slot_etag is not None:
            with contextlib.suppress(Conflict):
                self.store.delete(self.keys.slot(rec.slot), if_match=rec.slot_etag)

    def heartbeat(self, held: Claimed, now: float) -> Claimed:
        """Push the lease out. Raises Conflict when the record changed (cancel, expiry)."""
        rec = lifecycle.heartbeat(held.record, held.token, now)
        return dataclasses.replace(held, record=rec, etag=self.cas(rec, held.etag))

    def finish(
        self,
        held: Claimed,
        final: Record,
        tidy_later: bool = False,
        retry_while: Callable[[], bool] | None = None,
        pause: Callable[[float], object] = time.sleep,
    ) -> str:
        """Write the attempt's outcome (fenced by the last etag), then tidy the ticket.

        Back to queued (a retry, a release): the ticket is rewritten to a marker first, so
        workers that remember the invocation as running look again. Terminal: the ticket (and
        admission slot) are deleted after — by a background thread with ``tidy_later`` (a
        worker: the outcome is visible at once, and a delete lost with the process only
        leaves a stale ticket for claimers to drop; ``flush`` waits for them).
        A write that fails with ``StoreUnavailable`` (the store's own retries spent) is sent
        again, after a growing pause, for as long as ``retry_while()`` says (a worker: while
        the lease still holds): a finished result is not thrown away for one bad minute.

        Raises:
            Conflict: the attempt was fenced out (the result is then dropped).
            StoreUnavailable: the store failed and ``retry_while`` said to stop.
        """
        by = held.by if final.state == State.QUEUED else None
        if by is not None:
            by.forget(self.ticket_key(final))
        etag = self._write_outcome(held, final, retry_while, pause)
        if by is not None:
            # and again: a slot sharing this claimer may have listed the new marker and read
            # the record still running in between, and would pass it over until the lease end
            by.forget(self.ticket_key(final))
        if not final.terminal:
            self.free_slot(final)
        elif tidy_later:
            self.drop_own_ticket(held, until=(final.finished_at or 0.0) + ORPHAN_GRACE_S)
            if final.slot is not None:
                self._tidier.later(lambda: self.free_slot(final))
        else:
            self.drop_own_ticket(held)
            self.free_slot(final)
        return etag

    def _write_outcome(
        self,
        held: Claimed,
        final: Record,
        retry_while: Callable[[], bool] | None,
        pause: Callable[[float], object],
    ) -> str:
        """The outcome's writes (a marker first for a move back to queued, then the record),
        sent again while ``retry_while`` allows. After a failed try a lost condition may be
        our own write that landed unseen: the record holding this write's ``wid`` says so."""
        delay, failed = _OUTCOME_PAUSE_S, False
        while True:
            try:
                if final.state == State.QUEUED:
                    self.put_marker(final)
                return self.cas(final, held.etag)
            except StoreUnavailable:
                if retry_while is None or not retry_while():
                    raise
                failed = True
                log.warning(
                    "outcome of %s not written yet (the store is unavailable): trying again",
                    final.id,
                )
                pause(delay)
                delay = min(delay * 2, _OUTCOME_PAUSE_CAP_S)
            except Conflict:
                if failed:
                    with contextlib.suppress(LakeshoreError):
                        current, etag = self.read(final.id)
                        if current.wid == final.wid:
                            return etag  # an earlier try landed; its answer was lost
                raise

    def flush(self, timeout: float = 30.0) -> bool:
        """Send the pending ticket deletes and wait for background tidying to finish; False
        if ``timeout`` passed first."""
        return self._tidier.flush(timeout)

    def hurry(self) -> None:
        """Send the pending ticket deletes now, without waiting for them."""
        self._tidier.hurry()


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
        state=State.FAILED,
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


def decode_ticket(data: bytes, keys: QueueKeys, ticket: str) -> Record:
    """The queued record a ticket holds. It must be the record of the id at the end of the
    ticket's key, made for the ticket's band, and queued or terminal (a tombstone): a
    producer that can write tickets must not be able to start an invocation anywhere else.

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
    stone = rec.state == State.FAILED and (rec.error or {}).get("type") == ABANDONED
    if (rec.state != State.QUEUED and not stone) or rec.lease is not None or rec.attempt:
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


def write_id_index(store: Store, ns: str, inv: str, queue: str) -> None:
    """Write the id index of an invocation outside the default queue (``_ids/<id>``, create-
    only: ids never move), so a process that does not know its queue finds it. Written before
    the ticket; an index that is already there (a retried submit) is left as it is."""
    with contextlib.suppress(Conflict):
        store.put(id_index(ns, inv), queue.encode(), CREATE)


def read_id_index(store: Store, ns: str, inv: str) -> str:
    """The queue the id index names for ``inv``; empty when there is none. Its content is
    only a hint: the caller still reads the record it points to.

    Raises:
        LakeshoreError: the store failed.
    """
    try:
        raw = store.get(id_index(ns, inv), max_bytes=MAX_SMALL_BYTES)[0]
    except NotFound:
        return ""
    return raw.decode("utf-8", "replace")
