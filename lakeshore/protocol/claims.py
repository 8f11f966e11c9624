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

The :class:`Claimer` runs a claim's steps and holds its pieces, each of a module of its own,
which share its lock:

- :class:`~lakeshore.protocol.claim_memory.TicketMemory`: what it remembers per ticket, and
  the retries a draining worker waits for;
- :class:`~lakeshore.protocol.claim_listing.Listing`: the listing, its time, where the next
  one starts;
- :class:`~lakeshore.protocol.claim_order.Picker`: which candidate to try (spread, the share
  of picks found taken, :class:`~lakeshore.protocol.lanes.Lanes`);
- :class:`~lakeshore.protocol.claim_examine.Examiner`: what a ticket's record says, and what
  needs no claim.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import assert_never

from lakeshore.errors import Conflict, IllegalTransition, PermissionDenied, StoreError
from lakeshore.model import lifecycle
from lakeshore.model.record import write_id
from lakeshore.protocol.claim_examine import Claimable, Examiner, Read, Seen
from lakeshore.protocol.claim_listing import SCAN, Listing
from lakeshore.protocol.claim_memory import TicketMemory
from lakeshore.protocol.claim_order import RESTING, Picker, Resting
from lakeshore.protocol.lanes import Lanes
from lakeshore.protocol.steps import CLAIM_FENCE_S, Claimed, QueueOps, elapsed, unclaimed
from lakeshore.store.base import ObjectInfo
from lakeshore.text import inert

__all__ = ["Claimer"]

log = logging.getLogger("lakeshore.worker")

_LISTS_PER_CLAIM = 4
_BAD_TICKET_S = 60.0  # a ticket whose examination raised something unexpected: passed over


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
        self._ticks = ticks  # elapsed time, never stepped, counting time suspended
        self._lock = threading.Lock()  # the pieces' one lock
        self._passes: list[float] = []  # store times the passes in flight began
        self.lanes = Lanes(ops.keys, worker, ticks)  # which picks are this process's
        self.memory = TicketMemory(ops, ticks, self._lock)
        self.listing = Listing(ops, self.memory, self.lanes, self._lock)
        # a consumer's claim answers None only when there is nothing to take: it never leaves
        # work to the other lanes' owners (a worker's slot does, and polls again)
        self.order = Picker(
            self.listing, self.memory, self.lanes, ticks, self._lock, eager=payloads
        )
        self.examiner = Examiner(ops, worker, self.memory, self.order, payloads=payloads)

    # -- memory ------------------------------------------------------------------------------

    def _remember(self, info: ObjectInfo, until: float) -> None:
        self.remember(info.key, info.etag, until)

    def remember(self, key: str, etag: str, until: float) -> None:
        """Skip the ticket ``key`` without a GET until ``until`` (store time), unless its
        etag changes."""
        self.memory.remember(key, etag, until)

    def forget(self, key: str) -> None:
        """Look at the ticket ``key`` again at the next listing."""
        self.memory.forget(key)

    def serving(self, queues: Iterable[str]) -> None:
        """This claimer's worker serves ``queues`` too: a waiting child whose parent is
        queued in one of them is work to come for a draining worker."""
        self.examiner.serves = frozenset({self.ops.keys.queue, *queues})

    def retry_pending(self, grace: float = 0.0) -> bool:
        """A retry this worker has read is backing off, or came due and no pass over the
        whole queue that found nothing has judged every ticket since: draining the queue
        includes it (see :meth:`TicketMemory.retry_pending`)."""
        return self.memory.retry_pending(grace)

    def held_back(self, grace: float = 0.0) -> bool:
        """A pass within the last ``grace`` seconds left listed work to the other lanes'
        owners (see :meth:`Picker.held_back`): the queue is not drained."""
        return self.order.held_back(grace)

    def _passed(self, began: float) -> None:
        """A pass that began at ``began`` found nothing to claim. If its listing looked at
        every ticket, each was judged no earlier than the earliest of: this pass's start,
        the listing's own time (another slot's, reused), and any pass still in flight (a
        slot may hold a ticket this pass skipped)."""
        with self._lock:
            if self.listing.whole:
                self.memory.judged(min(began, self.listing.judged_at, *self._passes))

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
            self.order.rested(got is RESTING)
            if got is None or got is RESTING:
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
    ) -> Claimed | Resting | None:
        lists = 0
        while True:
            if stopping is not None and stopping():
                return None
            now = max(now, self.ops.store.now())
            info = self.order.next_candidate(now)
            if info is RESTING:
                return info
            if info is None:
                if lists >= _LISTS_PER_CLAIM:
                    return None  # out of listings for this pass: not a pass over everything
                found = self.listing.refresh(now)
                lists += 1
                if not found and self.listing.at_head():
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
                self.order.tried(info.key)
            if got is not None:
                return got

    def _try_claim(
        self,
        info: ObjectInfo,
        now: float,
        lease_s: float | None = None,
        stopping: Callable[[], bool] | None = None,
        again: bool = False,
    ) -> Claimed | None:
        began = self._ticks()
        match self.examiner.examine(info, now):
            case Claimable(read=seen):
                return self._take(info, seen, began, now, lease_s, stopping, again)
            case Seen.TAKEN:
                self.order.taken_or_over(info.key)
                return None
            case Seen.LEFT | Seen.MOVED:
                return None
            case _ as unreachable:
                assert_never(unreachable)

    def _take(
        self,
        info: ObjectInfo,
        seen: Read,
        began: float,
        now: float,
        lease_s: float | None,
        stopping: Callable[[], bool] | None,
        again: bool,
    ) -> Claimed | None:
        """Claim the record ``seen`` behind the ticket ``info``, claimable when examined
        (the examination began at ``began``, by ``ticks``)."""
        if stopping is not None and stopping():
            return None
        rec, etag, ticket_etag = seen.record, seen.etag, seen.ticket_etag
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
                self.memory.lost_create(info.key, etag)
                theirs = self.order.create_lost(info.key)
                if theirs and not again:
                    # whether that lane's owner is at work (its floor) shows in the record,
                    # not in this create: a frozen owner's expired claim makes it lose too
                    return self._try_claim(info, now, lease_s, stopping, again=True)
                self.order.collided(True, info.key, raced=False)
                if self.lanes.active:  # in its own lane: taken lately, most likely
                    self.order.seen_another(info.key)
                self.order.taken_or_over(info.key)
                return None
            # a record that changed since it was read: a race with a claimer at work now
            self.order.collided(True, info.key)
            self.order.seen_another(info.key)
            self.order.taken_or_over(info.key)
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
        self.order.collided(False)
        assert running.lease is not None
        self._remember(ObjectInfo(info.key, ticket_etag, 0, 0.0), running.lease.expires_at)
        return Claimed(running, new_etag, token, ticket_etag, by=self)

    def reap(self, now: float) -> int:
        """One pass over the tickets: requeue (or fail) running invocations whose lease ran
        out and drop stale tickets. Claims do this on their way, for the head of the queue;
        a pass reads every live record not remembered. Returns how many moved."""
        moved = 0
        for scanned, info in enumerate(list(self.ops.tickets())):
            if scanned >= SCAN:
                break
            if not self.memory.skipped(info, now):
                # the record first: a full ticket may stand for a running invocation (one more GET
                # per fresh submit, which a pass that claims nothing can afford)
                match self.examiner.examine(info, now, record_first=True):
                    case Seen.MOVED | Claimable(moved=True):
                        moved += 1
                    case Seen.LEFT | Seen.TAKEN | Claimable():
                        pass
                    case _ as unreachable:
                        assert_never(unreachable)
        return moved
