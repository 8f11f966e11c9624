"""The queue protocol on the store: each step is a few store requests in a fixed order.

The record is the truth; the ready hint ``_ready/<band>/<id>`` is derived and may be stale.
One invariant carries the protocol: **every live (queued or running) record has its ready
hint**. The hint is written before the record is created and deleted only after the record
is terminal, so a job is always found by listing ``_ready/`` — also a running one whose
worker died, which is how expired leases are found (no separate lease hints). The orders
below keep the invariant through any crash between two requests:

* **submit**: [args object] → [id index] → ready hint → record (create-only). A hint whose
  record is missing is either in flight or orphaned: claimers look again after as long as it
  has existed, and delete it once it is older than ``ORPHAN_GRACE_S``. A submit whose two
  writes took longer than ``SLOW_SUBMIT_S`` rewrites the hint after its record landed.
* **claim**: list ready hints → get record → CAS record to running. Nothing else: the hint
  stays while the job runs. One listing serves several claims of this process (for up to
  ``_LISTING_S``), and the process's slots take different candidates from it.
* **back to queued** (retry, release, expiry): rewrite the ready hint (a new etag tells
  other workers to look again) → CAS record to queued.
* **complete**: [result object] → CAS record to terminal (fenced by the etag of the attempt's
  last write) → delete the ready hint, if it is still the one claimed (``if_match``). A
  fenced-out attempt's result is dropped.
* **stale hints**: a hint is deleted only when its record is terminal and the hint is older
  than ``_RERUN_GRACE_S`` (a younger one may be a rerun between its hint and its record
  write), or when the record is missing for longer than ``ORPHAN_GRACE_S``; always with
  ``if_match`` on the etag that was listed, so a hint rewritten meanwhile survives.
* **expired leases**: a claimer that reads a running record whose lease has run out (in the
  store's clock) requeues or fails it by CAS; the holder's late writes are then fenced.

What a worker has read is remembered per hint etag (running until its lease ends, backing
off until its retry is due, a submit in flight): the hint is skipped without a GET until
then, or until the hint's etag changes. Heartbeats CAS the record itself (lease pushed out):
one request that also notices cancellation, because a cancel changes the record.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from lakeshore import lifecycle
from lakeshore.errors import (
    Conflict,
    LakeshoreError,
    NotFound,
    PermissionDenied,
    StoreError,
    TooLarge,
)
from lakeshore.keys import QueueKeys
from lakeshore.record import (
    MAX_INLINE_BYTES,
    Blob,
    NewerRecord,
    Record,
    RecordError,
    write_id,
)
from lakeshore.store.base import CREATE, OVERWRITE, ObjectInfo, Store, if_match

__all__ = [
    "ABANDONED",
    "MAX_RECORD_BYTES",
    "ORPHAN_GRACE_S",
    "SLOW_SUBMIT_S",
    "Claimed",
    "QueueOps",
    "corrupt_stub",
]

log = logging.getLogger("lakeshore.worker")

ABANDONED = "SubmitAbandoned"  # error type of a record whose submit was judged dead
# Every free-form field of a record has a cap (lakeshore.record.LIMITS): two inline blobs
# and a pickled callable of 1 MiB each, an error map of 8 texts of 64 KiB, small names.
# They add up to under 4 MiB; the rest is room for fields of newer schemas. Larger is not read.
MAX_RECORD_BYTES = 8 << 20
# Keys, slots, hints, index entries, queue records, signs of life: small by construction.
MAX_SMALL_BYTES = 1 << 20
ORPHAN_GRACE_S = 60.0  # a ready hint without its record is in flight until this old
# A submit whose hint and record writes took longer than this writes the hint once more.
# Far below ORPHAN_GRACE_S: a claimer that judges the hint an orphan before a faster submit's
# record lands would need a clock 60 - 10 - 1 s (whole-second last_modified) = 49 s ahead
# of the store's, beyond the 30 s of skew the suite tests.
SLOW_SUBMIT_S = 10.0
_monotonic = time.monotonic  # the submit's stopwatch (tests replace it)
_RERUN_GRACE_S = 30.0  # a ready hint beside a terminal record may be a rerun until this old
_LISTING = 1000  # candidates kept from one LIST of the ready hints (one S3 page)
_LISTING_S = 1.0  # a listing is reused by later claims for this long (bounds priority lag)
_MAX_SPREAD = 64  # widest random pick over the head of the queue once claims collide
_SCAN = 5000  # ready hints looked at (listed, not read) per LIST at most
_LISTS_PER_CLAIM = 4
_NARROW_AFTER = 16  # clean claims in a row before the spread halves again
_BAD_HINT_S = 60.0  # a hint whose examination raised something unexpected: passed over this long


_Claimable = tuple[Record, str, str]  # record, its etag, the ready hint's etag


@dataclass
class Claimed:
    """A running attempt held by this worker: the record as written and its etag, and the
    ready hint's etag as listed (deleted with ``if_match`` once the record is terminal)."""

    record: Record
    etag: str
    token: str
    hint_etag: str | None = None


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
        # hint key -> (its etag, when to look again): read and found not claimable, skipped
        # without a GET until then or until the hint changes, so long-running jobs and
        # retries backing off at the head of the queue never hide the work behind them
        self._later: dict[str, tuple[str, float]] = {}
        self._listing: list[ObjectInfo] = []
        self._listed_at = -1e9  # time.monotonic() of the listing
        self._trying: set[str] = set()  # hint keys a slot of this process is reading now
        self._misses: dict[str, int] = {}  # hint key -> times its record was not there yet
        self._tidy: queue.SimpleQueue[Callable[[], object]] | None = None
        self._tidy_cond = threading.Condition()
        self._tidy_pending = 0

    # -- records -----------------------------------------------------------------------------

    def read(self, inv: str) -> tuple[Record, str]:
        """The record and its etag.

        Raises:
            NotFound: no such invocation in this queue.
            RecordError: the object is corrupt, of a newer schema, or larger than any
                record lakeshore writes (``MAX_RECORD_BYTES``; then it is not read).
        """
        key = self.keys.record(inv)
        try:
            data, etag = self.store.get(key, max_bytes=MAX_RECORD_BYTES)
        except TooLarge as e:
            raise RecordError(
                f"read {key}",
                f"the object is {e.details.get('size')} bytes, more than any record "
                f"({MAX_RECORD_BYTES})",
                "it was not read; delete it or cancel the invocation",
            ) from None
        return _decode(data, self.keys, inv), etag

    def cas(self, rec: Record, etag: str) -> str:
        """Write ``rec`` over the version ``etag``; Conflict when someone wrote first."""
        return self.store.put(self.keys.record(rec.id), rec.to_bytes(), if_match(etag))

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

    # -- hints -------------------------------------------------------------------------------

    def put_ready(self, rec: Record) -> str:
        """Write the ready hint of ``rec``; returns its etag."""
        # The hint's bytes are the record write id: unique, so its etag is never reused (ABA).
        return self.store.put(self.keys.ready(rec.priority, rec.id), rec.wid.encode(), OVERWRITE)

    def drop_hint(self, info: ObjectInfo) -> None:
        """Delete a stale hint, unless it was rewritten since we listed it."""
        self._forget(info.key)
        with contextlib.suppress(Conflict):
            self.store.delete(info.key, if_match=info.etag)

    def drop_own_hint(self, held: Claimed) -> None:
        """After the held attempt's terminal write: delete the hint it was claimed by, unless
        it was rewritten since (a rerun queued the invocation again)."""
        key = self.keys.ready(held.record.priority, held.record.id)
        self._forget(key)
        etag = held.hint_etag
        if etag is None:  # claimed without a listing (tests, tools): read it first
            try:
                etag = self.store.get(key, max_bytes=MAX_SMALL_BYTES)[1]
            except NotFound:
                return
        with contextlib.suppress(Conflict):
            self.store.delete(key, if_match=etag)

    def ready_hints(self) -> Iterator[ObjectInfo]:
        return self.store.list(self.keys.ready_prefix)

    def _remember(self, info: ObjectInfo, until: float) -> None:
        with self._lock:
            self._later[info.key] = (info.etag, until)

    def _forget(self, key: str) -> None:
        with self._lock:
            self._later.pop(key, None)
            self._misses.pop(key, None)

    def _skipped(self, info: ObjectInfo, now: float) -> bool:
        seen = self._later.get(info.key)
        return seen is not None and seen[0] == info.etag and seen[1] > now

    # -- steps ---------------------------------------------------------------------------------

    def submit(self, rec: Record) -> bool:
        """Publish a new invocation: ready hint, then the record (create-only). Returns
        False when another record holds the id already (a tombstone: the submit was judged
        dead and fenced out); True once the record is ours.

        A claimer drops a hint whose record is missing once the hint is ``ORPHAN_GRACE_S``
        old. When the two writes took longer than ``SLOW_SUBMIT_S``, the hint is written
        again after the record, with new bytes (a new etag, also where the etag is a content
        hash): a claimer's conditional delete of the old hint then fails, and a hint it
        already deleted is back. A fast submit costs nothing extra. If that rewrite fails,
        the record is ended as abandoned (it may have no hint: no worker would find it) and
        the error is raised.

        Raises:
            StoreError: the store failed (the invocation was not published).
        """
        started = _monotonic()
        self.put_ready(rec)
        where = self.keys.record(rec.id)
        try:
            etag = self.store.put(where, rec.to_bytes(), CREATE)
        except Conflict:
            try:  # our own write, retried by the store after a lost answer?
                rec_now, etag = self.read(rec.id)
            except (NotFound, RecordError):
                return False
            if rec_now.wid != rec.wid:
                return False
        if _monotonic() - started > SLOW_SUBMIT_S:
            key = self.keys.ready(rec.priority, rec.id)
            try:
                self.store.put(key, f"{rec.wid}.{write_id()}".encode(), OVERWRITE)
            except LakeshoreError:
                gone = rec.next_write(
                    state="failed",
                    error={
                        "type": ABANDONED,
                        "message": "the submit stalled and could not write its ready hint "
                        "again; nothing ran",
                        "traceback": "",
                    },
                    finished_at=self.store.now(),
                )
                with contextlib.suppress(LakeshoreError):
                    self.cas(gone, etag)
                    self.settle(gone)
                raise
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
                raise  # the store's trouble, not this hint's: the caller decides
            except Exception:
                # A bug or a shape nobody foresaw: one object must not stop the worker. Pass
                # this hint over for a while (until it changes) and serve the others.
                log.exception("claim on %s: passing over %s for now", self.keys.queue, info.key)
                self._remember(info, now + _BAD_HINT_S)
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
            for scanned, info in enumerate(self.ready_hints()):
                if scanned >= _SCAN or len(fresh) >= _LISTING:
                    break
                if not self._skipped(info, now):
                    fresh.append(info)
            with self._lock:
                self._later = {k: v for k, v in self._later.items() if v[1] > now}
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
        """Read the record behind a hint and settle what needs no claim: drop a stale hint,
        requeue an expired lease, time out a missed deadline, remember what is not due.
        Returns the record, its etag and the hint's etag when it is claimable now, and
        whether an expired lease was ended."""
        moved = False
        inv = QueueKeys.id_of(info.key)
        try:
            rec, etag = self.read(inv)
        except NotFound:
            if info.last_modified < now - ORPHAN_GRACE_S:
                self.drop_hint(info)  # its submitter died before writing the record
            else:  # a submit in flight (its record comes next), or an orphan: look again
                # soon, then less and less often, so a young one is picked up at once and an
                # orphan costs a dozen GETs until it can be dropped. (Not from the hint's age:
                # listings give last-modified times in whole seconds.)
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
                self.drop_hint(info)  # the record is failed now: its hint is stale
            return None, moved
        if self._misses:
            with self._lock:
                self._misses.pop(info.key, None)
        hint_etag = info.etag
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
                hint_etag = self.put_ready(nxt)  # before the record says queued
            try:
                etag = self.cas(nxt, etag)
            except Conflict:
                return None, moved  # the holder renewed or someone else reaped
            self.settle(nxt)
            rec, moved = nxt, True
        if rec.terminal:
            if not moved and info.last_modified > now - _RERUN_GRACE_S:
                # a young hint next to a terminal record may be a rerun in flight (hint
                # written, record not yet queued): look again once it is older
                self._remember(info, info.last_modified + _RERUN_GRACE_S)
                return None, moved
            self.drop_hint(ObjectInfo(info.key, hint_etag, info.size, info.last_modified))
            return None, moved
        if lifecycle.past_deadline(rec, now):
            ended = lifecycle.time_out(rec, now)
            try:
                self.cas(ended, etag)
            except Conflict:
                return None, moved
            self.settle(ended)
            self.drop_hint(ObjectInfo(info.key, hint_etag, info.size, info.last_modified))
            return None, moved
        if rec.not_before > now:
            # backing off before a retry; the hint stays
            self._remember(ObjectInfo(info.key, hint_etag, 0, 0.0), rec.not_before)
            return None, moved
        return (rec, etag, hint_etag), moved

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
        rec, etag, hint_etag = seen
        token = write_id()
        # The lease counts from the clock read right before the write, not from when the
        # claim began: a slow read or a long walk past running records must not eat into it.
        now = max(now, self.store.now())
        try:
            running = lifecycle.claim(rec, worker, token, now, lease_s)
        except lifecycle.IllegalTransition:
            return None  # its start deadline passed meanwhile: the next claim ends it
        try:
            new_etag = self.cas(running, etag)
        except Conflict:
            self._collided(True)
            # someone else claimed it (or cancelled it): look again when a lease would end
            self._remember(ObjectInfo(info.key, hint_etag, 0, 0.0), now + running.lease_s)
            return None
        self._collided(False)
        assert running.lease is not None
        self._remember(ObjectInfo(info.key, hint_etag, 0, 0.0), running.lease.expires_at)
        return Claimed(running, new_etag, token, hint_etag)

    def _fail_corrupt(self, inv: str, err: RecordError, now: float) -> bool:
        """Overwrite an unreadable record with a failed one that says why; True if done."""
        key = self.keys.record(inv)
        try:
            data, etag = self.store.get(key, max_bytes=MAX_RECORD_BYTES)
        except NotFound:
            return False
        except TooLarge:  # never read: its etag comes from a listing
            found = [i for i in self.store.list(key) if i.key == key]
            if not found or found[0].size <= MAX_RECORD_BYTES:
                return False  # gone, or rewritten meanwhile
            data, etag = b"", found[0].etag
        if data and _usable(data, self.keys, inv):
            return False  # rewritten meanwhile (or of a newer schema): not ours to fail
        stub = corrupt_stub(self.keys, inv, err, now)
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
        return Claimed(rec, self.cas(rec, held.etag), held.token, held.hint_etag)

    def finish(self, held: Claimed, final: Record, tidy_later: bool = False) -> str:
        """Write the attempt's outcome (fenced by the last etag), then tidy the hint.

        Back to queued (a retry, a release): the ready hint is rewritten first, so workers
        that remember the job as running look again. Terminal: the hint (and admission
        slot) are deleted after — by a background thread with ``tidy_later`` (a worker:
        the outcome is visible at once, and a delete lost with the process only leaves a
        stale hint for claimers to drop; ``flush`` waits for them).
        Raises Conflict when the attempt was fenced out (the result is then dropped).
        """
        if final.state == "queued":
            self._forget(self.keys.ready(final.priority, final.id))
            self.put_ready(final)
        etag = self.cas(final, held.etag)
        if not final.terminal:
            self.settle(final)
        elif tidy_later:

            def tidy() -> None:
                self.drop_own_hint(held)
                self.settle(final)

            self._later_do(tidy)
        else:
            self.drop_own_hint(held)
            self.settle(final)
        return etag

    def _later_do(self, fn: Callable[[], object]) -> None:
        with self._tidy_cond:
            if self._tidy is None:
                self._tidy = queue.SimpleQueue()
                threading.Thread(
                    target=self._tidy_loop, args=(self._tidy,), name="lakeshore-tidy", daemon=True
                ).start()
            self._tidy_pending += 1
            self._tidy.put(fn)

    def _tidy_loop(self, jobs: queue.SimpleQueue[Callable[[], object]]) -> None:
        while True:
            fn = jobs.get()
            try:
                fn()
            except LakeshoreError as e:  # a stale hint stays: claimers drop it later
                log.debug("tidying after a finished attempt failed: %s", e)
            finally:
                with self._tidy_cond:
                    self._tidy_pending -= 1
                    self._tidy_cond.notify_all()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait for background tidying to finish; False if ``timeout`` passed first."""
        with self._tidy_cond:
            return self._tidy_cond.wait_for(lambda: self._tidy_pending == 0, timeout)

    def reap(self, now: float) -> int:
        """One pass over the live hints: requeue (or fail) running invocations whose lease
        ran out and drop stale hints. Claims do this on their way, for the head of the
        queue; a pass reads every live record not remembered. Returns how many moved."""
        moved = 0
        for scanned, info in enumerate(list(self.ready_hints())):
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


def _usable(data: bytes, keys: QueueKeys, inv: str) -> bool:
    """True unless ``data`` is a corrupt record (a newer schema is not corrupt)."""
    try:
        _decode(data, keys, inv)
    except NewerRecord:
        return True
    except RecordError:
        return False
    return True
