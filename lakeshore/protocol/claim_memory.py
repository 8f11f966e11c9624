"""What a claim scheduler remembers of the tickets it has read.

Per ticket key and etag, a time until which the ticket is passed over in a listing without a
GET (running until its lease ends, backing off until its retry is due, a tombstone, ...):
long-running invocations and retries backing off at the head of the queue then never hide
the work behind them, and an entry counts only while the ticket keeps its etag. Besides:
how often a marker's record was missing (looked at again less and less often), which full
tickets turned out to have a record (read the record first), and the latest retry read
backing off, which a worker draining the queue waits for (:meth:`TicketMemory.retry_pending`).

The memory is guarded by its claimer's lock (one :class:`threading.Lock` that the claimer
shares with its listing and its picks): the methods take it, but the few marked "the caller
holds the lock", which a step that changes the listing too calls under it, and the lookups
``skipped`` and ``promoted``, made without it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from lakeshore.model import lifecycle
from lakeshore.protocol.steps import QueueOps, unclaimed
from lakeshore.store.base import ObjectInfo

__all__ = ["SLACK_S", "WAIT_FIRST_S", "WAIT_MAX_S", "TicketMemory"]

SLACK_S = 30.0  # how far two processes' clocks may disagree about a retry's due time
# a child waiting for its parents is looked at again after this, doubling up to the maximum
WAIT_FIRST_S = 0.5
WAIT_MAX_S = 30.0
_WAITS_PRUNE = 100_000


class TicketMemory:
    """What one claimer (one worker on one queue) has read behind the tickets of ``ops``'s
    queue. ``ticks`` is the claimer's elapsed time; ``lock`` its lock."""

    def __init__(self, ops: QueueOps, ticks: Callable[[], float], lock: threading.Lock) -> None:
        self._ops = ops
        self._ticks = ticks  # elapsed time, never stepped, counting time suspended
        self._lock = lock
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
        # to claim in the whole queue (see judged)
        self._polled = -math.inf
        self._misses: dict[str, int] = {}  # ticket key -> times its record was not there yet
        # ticket key -> looks at a child that found it waiting for a parent, since one was
        # last seen done: the next look is later and later (docs/dependencies.md)
        self._waits: dict[str, int] = {}
        # full tickets whose record exists (a create of it failed): read the record first
        self._promoted: set[str] = set()

    # -- per ticket --------------------------------------------------------------------------

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
            self._waits.pop(key, None)
            self._promoted.discard(key)

    def waiting(self, key: str, advanced: bool) -> float:
        """The child behind the ticket ``key`` waits for a parent (``advanced``: one more
        parent was seen done by this look): seconds until the next look, from
        :data:`WAIT_FIRST_S` doubling to :data:`WAIT_MAX_S`, and back to the first after
        progress. A child whose parents run long costs one read every 30 s at most."""
        with self._lock:
            before = self._waits.get(key)
            looks = 0 if advanced or before is None else before + 1
            if len(self._waits) >= _WAITS_PRUNE:
                self._waits.clear()  # forgetting only makes some looks come sooner
            self._waits[key] = looks
        return float(min(WAIT_FIRST_S * 2 ** min(looks, 16), WAIT_MAX_S))

    def skipped(self, info: ObjectInfo, now: float) -> bool:
        """Whether the listed ticket ``info`` is passed over at store time ``now``: remembered
        with this etag until later, or over with its delete pending in this process. (One
        dict lookup: not under the lock, as a listing walks many tickets.)"""
        seen = self._later.get(info.key)
        if seen is not None and seen[0] == info.etag and seen[1] > now:
            return True
        return self._ops.tidying(info, now)  # over, its delete pending in this process

    def missed(self, key: str) -> int:
        """The record behind the ticket ``key`` was not there (yet): how many times now."""
        with self._lock:
            misses = self._misses[key] = self._misses.get(key, 0) + 1
        return misses

    def found(self, key: str) -> None:
        """The record behind the ticket ``key`` was read: its misses are over."""
        if self._misses:
            with self._lock:
                self._misses.pop(key, None)

    def promoted(self, key: str) -> bool:
        """Whether the full ticket ``key`` is known to have its record (read that first).
        (A set lookup: not under the lock.)"""
        return key in self._promoted

    def lost_create(self, key: str, etag: str) -> None:
        """A write over a ticket's content lost: the record exists now; read it next time."""
        if unclaimed(etag):
            with self._lock:
                self._promoted.add(key)

    def demote(self, key: str) -> None:
        """The record of the full ticket ``key`` is gone again: read the ticket next time."""
        with self._lock:
            self._promoted.discard(key)

    def prune(self, now: float, listed: set[str] | None) -> None:
        """A new listing at store time ``now``: what ran out by then is forgotten, and, for a
        listing from the head (``listed``: every key it saw), the full tickets that are no
        longer listed. The caller holds the lock."""
        self._later = {k: v for k, v in self._later.items() if v[1] > now}
        if listed is not None:
            self._promoted &= listed

    # -- retries a draining worker waits for --------------------------------------------------

    def backing_off(self, due: float, now: float) -> None:
        """A retry read at store time ``now`` comes due at ``due``."""
        # no later than a real backoff, give or take the clocks of two processes
        if due <= now + lifecycle.MAX_BACKOFF_S + SLACK_S:
            with self._lock:
                if due > self._retry_due:
                    self._retry_due, self._retry_read = due, self._ticks()
                    self._retry_wait = due - now

    def judged(self, at: float) -> None:
        """Every ticket of the queue was judged by store time ``at`` in a pass that found
        nothing to claim. The caller holds the lock."""
        self._polled = max(self._polled, at)

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
                and self._ticks() - self._retry_read < self._retry_wait + SLACK_S + grace
            )
