"""The claim scheduler: how one worker finds and takes work from one queue.

A :class:`Claimer` belongs to one worker (its id is in the leases it writes); the worker's
slots share it, so they take different candidates from one listing and never race each
other. Everything it writes goes through :class:`lakeshore.protocol.steps.QueueOps`; what it
keeps is memory: the last listing of the tickets, and per ticket etag what was read
(running until its lease ends, backing off until its retry is due, a tombstone), so that
ticket is skipped without a GET until then or until its etag changes. On its way it
settles what needs no claim: it requeues (or fails) an expired lease, times out a missed
deadline, fails a corrupt record and drops stale tickets.

While claims collide with other processes' (lost CAS, or a record taken since it was
listed), the pick widens from the oldest ticket to a random one of the head of the queue,
and narrows again after a run of clean claims.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import random
import threading
import time
from collections.abc import Callable

from lakeshore.errors import (
    Conflict,
    IllegalTransition,
    NewerRecord,
    NotFound,
    PermissionDenied,
    RecordError,
    StoreError,
)
from lakeshore.keys import QueueKeys
from lakeshore.model import lifecycle
from lakeshore.model.record import Record, State, write_id
from lakeshore.protocol.lanes import HELP_WITHIN_S, STUCK_S, Lanes, ring
from lakeshore.protocol.steps import (
    CLAIM_FENCE_S,
    MARKER_MAX,
    ORPHAN_GRACE_S,
    Claimed,
    QueueOps,
    decode_ticket,
    elapsed,
    unclaimed,
    unclaimed_etag,
)
from lakeshore.store.base import ObjectInfo
from lakeshore.text import inert

__all__ = ["Claimer"]

log = logging.getLogger("lakeshore.worker")

_LISTING = 1000  # candidates kept from one LIST of the tickets (one S3 page)
_LISTING_S = 1.0  # a listing is reused by later claims for this long (bounds priority lag)
# widest random pick over the head of the queue once claims collide: the whole listing. A
# pick another process took since the listing costs a request or two; among P busy processes
# that happens about (claims per listing age) / (candidates) of the time, so the window must
# be much wider than what the others claim while a listing is reused
_MAX_SPREAD = 1000
_SCAN = 5000  # tickets looked at (listed, not read) per LIST at most
_LISTS_PER_CLAIM = 4
_NARROW_AFTER = 16  # clean claims in a row before the spread halves again
_BAD_TICKET_S = 60.0  # a ticket whose examination raised something unexpected: passed over
_SLACK_S = 30.0  # how far two processes' clocks may disagree about a retry's due time
_RERUN_GRACE_S = 30.0  # a ticket of a life the record has not reached: a rerun until this old
_OTHER_SIDE_S = 300.0  # a payload seen by a function worker (or the reverse): passed over
# an invocation another process ended this recently: its own batch delete of the ticket is
# due within a second or so; a delete from every process that lists it meanwhile would cost
# a request each. After this, whoever meets the ticket deletes it (its holder may have died)
_TIDY_GRACE_S = 10.0
_TIDIED = (
    State.SUCCEEDED,
    State.FAILED,
)  # the outcomes whose worker deletes the ticket (a cancel's
# producer does not: a claimer drops that ticket when it meets it)
# a process whose passes have left listed work to other lanes' owners for this long helps
# anyway: liveness must not hang on adoption (a lane's head can look new in every listing
# when the head of the queue is a scan of skipped tickets)
_HELD_MAX_S = 2 * STUCK_S
_TAKEN_WEIGHT = 0.1  # how fast the estimate of picks found taken follows the latest picks

_Claimable = tuple[Record, str, str]  # record, its etag, the ticket's etag


class _Resting(enum.Enum):
    """A fresh listing held only work left to the other lanes' owners (``Lanes.help``)."""

    RESTING = "resting"


_RESTING = _Resting.RESTING


class Claimer:
    """The claim scheduler of worker ``worker`` on the queue of ``ops``. A function worker
    claims function invocations only; a work queue's consumer (``payloads=True``) claims
    payloads only. Each passes the other's over (expired leases are still ended)."""

    def __init__(
        self,
        ops: QueueOps,
        worker: str,
        ticks: Callable[[], float] = elapsed,
        *,
        payloads: bool = False,
    ) -> None:
        self.ops = ops
        self.worker = worker  # its own leases are no collision
        self.payloads = payloads
        # a consumer's claim answers None only when there is nothing to take: it never leaves
        # work to the other lanes' owners (a worker's slot does, and polls again)
        self._eager = payloads
        self._held = -math.inf  # when a pass last left work to the other lanes' owners
        # since when every pass has left work so (None: the last one did not): past
        # _HELD_MAX_S this process helps anyway, whatever kept the lanes from adoption
        self._held_since: float | None = None
        self._ticks = ticks  # elapsed time, never stepped, counting time suspended
        self._lock = threading.Lock()
        self._listing_lock = threading.Lock()  # one LIST in flight per worker
        self._spread = 1  # 1: strict order (FIFO per priority); grows while claims collide
        self._clean = 0  # claims won since the last lost race
        # the share of recent picks another process had taken already (a moving average):
        # above one half, a full ticket's record is read before the ticket itself
        self._taken = 0.0
        # ticket key -> (its etag, when to look again): read and found not claimable, skipped
        # without a GET until then or until the ticket changes, so long-running invocations and
        # retries backing off at the head of the queue never hide the work behind them
        self._later: dict[str, tuple[str, float]] = {}
        # when the last retry this worker read backing off comes due (store time), and when
        # it was read (monotonic): a worker draining the queue does not leave before a pass
        # that began after it was due (``retry_pending``)
        self._retry_due = 0.0
        self._retry_read = 0.0
        self._retry_wait = 0.0  # how far off it was due when read
        # the store time by which every ticket had been judged in a pass that found nothing
        # to claim in the whole queue (see _passed)
        self._polled = -math.inf
        self._passes: list[float] = []  # store times the passes in flight began
        self._listing_now = -math.inf  # the store time the listing was judged at
        self._listing_whole = False  # and whether it looked at every ticket
        self._listing: list[ObjectInfo] = []
        self._listed_at = -1e9  # time.monotonic() of the listing
        # where the next listing starts (None: at the head): past the last key of a listing
        # that scanned _SCAN tickets it skips, so they cannot hide the work behind them
        self._resume: str | None = None
        self._resumed = False  # the last listing began past the head
        self._trying: set[str] = set()  # ticket keys a slot of this worker is reading now
        self._misses: dict[str, int] = {}  # ticket key -> times its record was not there yet
        # full tickets whose record exists (a create of it failed): read the record first
        self._promoted: set[str] = set()
        self._lanes = Lanes(ops.keys, worker, ticks)  # which picks are this process's

    # -- memory ------------------------------------------------------------------------------

    def _remember(self, info: ObjectInfo, until: float) -> None:
        self.remember(info.key, info.etag, until)

    def remember(self, key: str, etag: str, until: float) -> None:
        """Skip the ticket ``key`` without a GET until ``until`` (store time), unless its
        etag changes."""
        with self._lock:
            self._later[key] = (etag, until)

    def forget(self, key: str) -> None:
        """Look at the ticket ``key`` again at the next listing."""
        with self._lock:
            self._later.pop(key, None)
            self._misses.pop(key, None)
            self._promoted.discard(key)

    def retry_pending(self, grace: float = 0.0) -> bool:
        """A retry this worker has read is backing off, or came due and no pass over the
        whole queue that found nothing has judged every ticket since: draining the queue
        includes it. Held at most as long as it had to wait when read, plus a clock's slack
        and ``grace`` (the caller's longest pause between polls), so a store clock that
        steps back cannot hold a worker for long; a record claiming a later time than a
        real backoff is not waited for at all."""
        with self._lock:
            return (
                self._retry_due > 0.0
                and self._polled <= self._retry_due
                and self._ticks() - self._retry_read < self._retry_wait + _SLACK_S + grace
            )

    def held_back(self, grace: float = 0.0) -> bool:
        """A pass within the last ``grace`` seconds left listed work to the other lanes'
        owners (their lanes were short, or a pick to help had just been found taken): the
        queue is not drained, and a worker waiting to drain it stays (should an owner be
        gone, its lane is adopted after ``STUCK_S``)."""
        with self._lock:
            return self._ticks() - self._held < grace

    def _passed(self, began: float) -> None:
        """A pass that began at ``began`` found nothing to claim. If its listing looked at
        every ticket, each was judged no earlier than the earliest of: this pass's start,
        the listing's own time (another slot's, reused), and any pass still in flight (a
        slot may hold a ticket this pass skipped)."""
        with self._lock:
            if self._listing_whole:
                judged = min(began, self._listing_now, *self._passes)
                self._polled = max(self._polled, judged)

    def _skipped(self, info: ObjectInfo, now: float) -> bool:
        seen = self._later.get(info.key)
        if seen is not None and seen[0] == info.etag and seen[1] > now:
            return True
        return self.ops.tidying(info, now)  # over, its delete pending in this process

    def _drop(self, info: ObjectInfo, if_match: str | None = None) -> None:
        self.forget(info.key)
        self.ops.drop_ticket(info, if_match)

    # -- claiming ----------------------------------------------------------------------------

    def claim(
        self,
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
        now = max(now, self.ops.store.now())
        began = now
        with self._lock:
            self._passes.append(began)
        try:
            got = self._pass(now, began, lease_s, stopping)
            with self._lock:
                if got is _RESTING:  # what is listed is left to the other lanes' owners
                    self._held = self._ticks()
                    if self._held_since is None:
                        self._held_since = self._held
                else:
                    self._held_since = None
            if got is None or got is _RESTING:
                self.ops.hurry()  # nothing to claim: this process's finished tickets go now
                return None
            return got
        finally:
            with self._lock:
                self._passes.remove(began)

    def _pass(
        self,
        now: float,
        began: float,
        lease_s: float | None,
        stopping: Callable[[], bool] | None,
    ) -> Claimed | _Resting | None:
        lists = 0
        while True:
            if stopping is not None and stopping():
                return None
            now = max(now, self.ops.store.now())
            info = self._next_candidate(now)
            if info is _RESTING:
                return info
            if info is None:
                if lists >= _LISTS_PER_CLAIM:
                    return None  # out of listings for this pass: not a pass over everything
                found = self._list(now)
                lists += 1
                if not found and not self._resumed and self._resume is None:
                    self._passed(began)
                    return None
                # a listing that stopped at the scan limit is followed by one past it, and
                # one that began past the head by one from the head
                continue
            try:
                got = self._try_claim(info, now, lease_s, stopping)
            except (StoreError, PermissionDenied):
                raise  # the store's trouble, not this ticket's: the caller decides
            except Exception:
                # A bug or a shape nobody foresaw: one object must not stop the worker. Pass
                # this ticket over for a while (until it changes) and serve the others.
                shown = inert(info.key)  # a listed key: anyone who can write may have made it
                log.exception("claim on %s: passing over %s for now", self.ops.keys.queue, shown)
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
            names = self._lanes.survey(self.ops.store, now)
            if names is not None:
                census = ring(names) if self._lanes.changed(names) else None
                with self._lock:
                    self._lanes.number(census)
            fresh: list[ObjectInfo] = []
            seen: set[str] = set()
            start, resume, last = self._resume, None, None
            whole = start is None
            for scanned, info in enumerate(self.ops.tickets(start)):
                if len(fresh) >= _LISTING:
                    whole = False
                    break
                if scanned >= _SCAN:
                    # a scan's worth of tickets this process skips (not due, running, or
                    # planted): the next listing starts past them instead of at the head
                    whole, resume = False, last
                    break
                seen.add(info.key)
                last = info.key
                if not self._skipped(info, now):
                    fresh.append(info)
            with self._lock:
                self._later = {k: v for k, v in self._later.items() if v[1] > now}
                if start is None:
                    self._promoted &= seen
                self._resume, self._resumed = resume, start is not None
                self._listing = fresh
                self._lanes.observe(fresh)
                self._listed_at = time.monotonic()
                self._listing_now, self._listing_whole = now, whole
            return bool(fresh)

    def _next_candidate(self, now: float) -> ObjectInfo | _Resting | None:
        """Take a candidate from the listing. Alone on the queue: the oldest while claims go
        through, a random one of the head while they collide. Among other workers: by lanes
        (:mod:`lakeshore.protocol.lanes`). The pick stays inside the head's priority band:
        never a lower band first."""
        with self._lock:
            if time.monotonic() - self._listed_at > _LISTING_S:
                self._listing = []
            lanes = self._lanes.active
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
                if not lanes and len(head) >= self._spread:
                    break
            if not head:
                self._listing = []
                return None
            if lanes:
                listed = [self._listing[i] for i in head]
                mine = self._lanes.pick(listed)
                if mine is None and time.monotonic() - self._listed_at > HELP_WITHIN_S:
                    self._listing = []  # help other lanes only from a fresh listing
                    return None
                if mine is None:
                    held = self._held_since
                    eager = self._eager or (
                        held is not None and self._ticks() - held >= _HELD_MAX_S
                    )
                    mine = self._lanes.help(listed, eager=eager)
                    if mine is None:
                        return _RESTING
                pick = head[mine]
            else:
                pick = random.choice(head)
            info = self._listing.pop(pick)
            self._trying.add(info.key)
            return info

    def _collided(self, lost: bool, key: str = "", raced: bool = True) -> None:
        """A claim went through (``lost`` False) or met another process's: a race lost on
        ``key`` (``raced``), or ``key`` found taken since it was listed."""
        # widen fast, narrow slowly: among busy workers the spread stays wide (few races);
        # a worker left alone is back to strict order after a run of clean claims
        with self._lock:
            self._taken += _TAKEN_WEIGHT * (lost - self._taken)
            if lost and raced:
                self._lanes.collided(key)
            elif lost:
                self._lanes.contended(key or None)
            if lost:
                self._spread, self._clean = min(self._spread * 4, _MAX_SPREAD), 0
            else:
                self._clean += 1
                if self._clean % _NARROW_AFTER == 0:
                    self._spread = max(1, self._spread // 2)

    def _seen_another(self, key: str) -> None:
        """Another process claims from this queue (the ticket ``key`` was claimed since it
        was listed): if the census counted nobody else, or ``key`` is of this process's own
        lane (the other counted differently: one of the two counted before the other
        announced itself), and the census is due (see :meth:`Lanes.contended`), list again,
        taking the census with the listing. Consumers (``payloads``) have no signs of life
        to count."""
        with self._lock:
            lanes = self._lanes
            if self._eager or not lanes.census_due():
                return
            if lanes.count == 1 or lanes.lane(key) == lanes.index:
                self._listing = []

    def _examine(
        self, info: ObjectInfo, now: float, record_first: bool = False
    ) -> tuple[_Claimable | None, bool, bool]:
        """Read the record behind a ticket and settle what needs no claim: drop a stale
        ticket, requeue an expired lease, time out a missed deadline, remember what is not
        due. Returns the record, its etag and the ticket's etag when it is claimable now;
        whether an expired lease was ended; and whether another process holds it or it is
        over (what tells of its lane's owner at work: a retry backing off, a lease this
        process ended or a record being written does not)."""
        moved = False
        inv = QueueKeys.id_of(info.key)
        try:
            got = self._read_listed(info, inv, record_first)
        except NotFound:
            if info.last_modified < now - ORPHAN_GRACE_S:
                self._drop(info)  # a marker whose record is gone (gc, by hand)
            else:  # a record being written or deleted: look again soon, then less and less
                # often, so a young one is picked up at once and an orphan costs a dozen
                # GETs until it can be dropped. (Not from the ticket's age: listings give
                # last-modified times in whole seconds.)
                with self._lock:
                    misses = self._misses[info.key] = self._misses.get(info.key, 0) + 1
                wait = min(0.005 * 2 ** min(misses, 12), 5.0)
                self._remember(info, min(now + wait, info.last_modified + ORPHAN_GRACE_S))
            return None, moved, False
        except NewerRecord:
            self._remember(info, now + ORPHAN_GRACE_S)  # for a newer lakeshore's workers
            return None, moved, False
        except RecordError as e:
            if self.ops.fail_corrupt(inv, e, now):
                self._drop(info)  # the record is failed now: its ticket is stale
            return None, moved, False
        if got is None:
            return None, moved, False
        rec, etag, ticket_etag = got
        if self._misses:
            with self._lock:
                self._misses.pop(info.key, None)
        if unclaimed(etag) and rec.terminal:
            # a tombstone (a submit fenced out): it stays, so the late submit cannot land;
            # gc removes it with the finished invocations
            self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), math.inf)
            return None, moved, False
        life = QueueKeys.reruns_of(info.key)
        if life is None or rec.reruns > life:
            self._drop(info)  # a ticket of an earlier life (or not one we write)
            return None, moved, False
        if rec.reruns < life:
            # a rerun between its ticket and its record write, or a ticket nobody should
            # have written: look again once it is older than a rerun takes
            if info.last_modified > now - _RERUN_GRACE_S:
                self._remember(info, info.last_modified + _RERUN_GRACE_S)
            else:  # unless a rerun rewrote it since it was read (its record may be queued now)
                self._drop(info, if_match=ticket_etag)
            return None, moved, False
        why = None if rec.terminal else lifecycle.implausible(rec, now)
        if why is not None:
            # a time no honest writer puts there: waiting for it would park the ticket at
            # the head of the queue for good, so the record is failed and the ticket dropped
            refused = lifecycle.refuse(rec, now, why)
            try:
                self.ops.cas(refused, etag)
            except Conflict:
                self._lost_create(info.key, etag)
                return None, moved, False
            log.warning("claim on %s: failed %s: %s", self.ops.keys.queue, inv, inert(why))
            self.ops.free_slot(refused)
            self._drop(info)
            return None, moved, False
        if rec.state == State.RUNNING:
            expires = rec.lease.expires_at if rec.lease is not None else now
            if expires >= now:
                self._remember(info, expires)  # its worker holds it: look again at expiry
                holder = rec.lease.worker if rec.lease is not None else self.worker
                if holder != self.worker:
                    # taken by another process since we listed it: spread out as after a
                    # lost race, or this process keeps walking just behind the other
                    self._collided(True, info.key, raced=False)
                    self._seen_another(info.key)
                return None, moved, holder != self.worker
            nxt = lifecycle.expire(rec, now)
            if nxt.state == State.QUEUED:
                ticket_etag = self.ops.put_marker(nxt)  # before the record says queued
            try:
                etag = self.ops.cas(nxt, etag)
            except Conflict:
                return None, moved, True  # the holder renewed or someone else reaped
            self.ops.free_slot(nxt)
            rec, moved = nxt, True
        if rec.terminal:  # in this ticket's life: it is over (a rerun writes its own ticket)
            over = rec.finished_at or 0.0
            # (a time ahead of a clock's slack is a skewed or forged one: not waited for)
            if not moved and rec.state in _TIDIED and now - _TIDY_GRACE_S < over <= now + _SLACK_S:
                # a worker ended it just now: its batch delete is on the way
                self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), over + _TIDY_GRACE_S)
                return None, moved, True
            # its holder may have died between the terminal write and its tidying: the
            # admission slot goes first (producers no longer repair slots), then the ticket
            self.ops.free_slot(rec)
            self._drop(info)
            return None, moved, not moved
        if lifecycle.past_deadline(rec, now):
            ended = lifecycle.time_out(rec, now)
            try:
                self.ops.cas(ended, etag)
            except Conflict:
                self._lost_create(info.key, etag)
                return None, moved, False
            self.ops.free_slot(ended)
            self._drop(info)
            return None, moved, False
        if rec.not_before > now:
            # backing off before a retry; the ticket stays
            self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), rec.not_before)
            # no later than a real backoff, give or take the clocks of two processes
            if rec.not_before <= now + lifecycle.MAX_BACKOFF_S + _SLACK_S:
                with self._lock:
                    if rec.not_before > self._retry_due:
                        self._retry_due, self._retry_read = rec.not_before, self._ticks()
                        self._retry_wait = rec.not_before - now
            return None, moved, False
        if rec.is_payload != self.payloads:
            # the other side's (a queue both use): look again only if the ticket changes
            self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), now + _OTHER_SIDE_S)
            return None, moved, False
        return (rec, etag, ticket_etag), moved, False

    def _read_listed(
        self, info: ObjectInfo, inv: str, record_first: bool = False
    ) -> tuple[Record, str, str] | None:
        """The record behind a listed ticket, its etag and the ticket's etag; None for a
        stray ticket (dropped). A ticket that holds a record is read itself (one GET for a
        fresh submit), unless a create of its record already failed; a marker's record is
        read directly.

        Raises:
            NotFound: a marker (or a ticket whose record existed) and no record.
            RecordError: neither the ticket nor the record can be used.
        """
        full = info.size > MARKER_MAX and info.key not in self._promoted
        if full and (record_first or self._taken > 0.5):
            # Most of this process's recent picks had been claimed by others since its
            # listing: this full ticket's record most likely exists, and it tells so for one
            # GET, where reading the ticket and trying to create the record would be two.
            with contextlib.suppress(NotFound):
                rec, rec_etag = self.ops.read_record(inv)
                return rec, rec_etag, info.etag
        if full:
            data, etag = self.ops.read_bounded(info.key)  # NotFound: gone since the listing
            if len(data) > MARKER_MAX:
                try:
                    return decode_ticket(data, self.ops.keys, info.key), unclaimed_etag(etag), etag
                except NewerRecord:
                    raise
                except RecordError as err:
                    if self.ops.keys.ticket_of_id(inv) != info.key:
                        # not where lakeshore puts this id's ticket: no invocation's (yet:
                        # a rerun may overwrite it with its ticket before this delete)
                        self._drop(info, if_match=etag)
                        return None
                    try:  # a record that exists is the truth; its ticket is only a marker
                        rec, rec_etag = self.ops.read_record(inv)
                    except NotFound:
                        raise err from None  # nothing to run: _fail_corrupt records why
                    return rec, rec_etag, etag
            info = ObjectInfo(info.key, etag, len(data), info.last_modified)
        try:
            rec, rec_etag = self.ops.read_record(inv)
        except NotFound:
            if info.size > MARKER_MAX and info.key in self._promoted:
                # a full ticket whose record was deleted again (a claim undone after it
                # could not prove its ticket): the ticket holds the invocation once more
                with self._lock:
                    self._promoted.discard(info.key)
                return self._read_listed(info, inv)
            raise
        return rec, rec_etag, info.etag

    def _taken_or_over(self, key: str) -> None:
        """The ticket ``key`` could not be claimed. In another process's lane, whose owner
        takes the oldest first, what is older than it is most likely taken or over too:
        left out of this listing."""
        with self._lock:
            lanes = self._lanes
            if not lanes.active:
                return
            lanes.missed(key)
            lane = lanes.lane(key)
            if lane != lanes.index:
                self._listing = [
                    i for i in self._listing if i.key > key or lanes.lane(i.key) != lane
                ]

    def _lost_create(self, key: str, etag: str) -> None:
        """A write over a ticket's content lost: the record exists now; read it next time."""
        if unclaimed(etag):
            with self._lock:
                self._promoted.add(key)

    def _try_claim(
        self,
        info: ObjectInfo,
        now: float,
        lease_s: float | None = None,
        stopping: Callable[[], bool] | None = None,
        again: bool = False,
    ) -> Claimed | None:
        began = self._ticks()
        seen, _, taken = self._examine(info, now)
        if seen is None:
            if taken:
                self._taken_or_over(info.key)
            return None
        if stopping is not None and stopping():
            return None
        rec, etag, ticket_etag = seen
        token = write_id()
        # The lease counts from the clock read right before the write, not from when the
        # claim began: a slow read or a long walk past running records must not eat into it.
        now = max(now, self.ops.store.now())
        try:
            running = lifecycle.claim(rec, self.worker, token, now, lease_s)
        except IllegalTransition:
            return None  # its start deadline passed meanwhile: the next claim ends it
        try:
            new_etag = self.ops.cas(running, etag)
        except Conflict:
            if unclaimed(etag):
                # a record that existed already: created by a claim at any time since the
                # ticket was written, by a process at work now or by one long gone
                self._lost_create(info.key, etag)
                with self._lock:
                    self._lanes.contended(info.key)
                    lanes = self._lanes
                    theirs = lanes.active and lanes.lane(info.key) != lanes.index
                if theirs and not again:
                    # whether that lane's owner is at work (its floor) shows in the record,
                    # not in this create: a frozen owner's expired claim makes it lose too
                    return self._try_claim(info, now, lease_s, stopping, again=True)
                self._collided(True, info.key, raced=False)
                if lanes.active:  # in its own lane: taken lately, most likely
                    self._seen_another(info.key)
                self._taken_or_over(info.key)
                return None
            # a record that changed since it was read: a race with a claimer at work now
            self._collided(True, info.key)
            self._seen_another(info.key)
            self._taken_or_over(info.key)
            # someone else claimed it (or cancelled it): look again when a lease would end
            self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), now + running.lease_s)
            return None
        # a claim so slow that the invocation may have ended and been collected meanwhile
        # (its record gone and created again just now) proves its ticket before it runs
        if (
            unclaimed(etag)
            and self._ticks() - began >= CLAIM_FENCE_S
            and self.ops.unclaim_if_stale(info.key, ticket_etag, running, new_etag)
        ):
            self.forget(info.key)
            return None
        self._collided(False)
        assert running.lease is not None
        self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), running.lease.expires_at)
        return Claimed(running, new_etag, token, ticket_etag, by=self)

    def reap(self, now: float) -> int:
        """One pass over the tickets: requeue (or fail) running invocations whose lease ran
        out and drop stale tickets. Claims do this on their way, for the head of the queue;
        a pass reads every live record not remembered. Returns how many moved."""
        moved = 0
        for scanned, info in enumerate(list(self.ops.tickets())):
            if scanned >= _SCAN:
                break
            if not self._skipped(info, now):
                # the record first: a full ticket may stand for a running invocation (one more GET
                # per fresh submit, which a pass that claims nothing can afford)
                moved += self._examine(info, now, record_first=True)[1]
        return moved
