"""Which listed ticket a claim scheduler tries next, and how widely it picks.

Always within the head's priority band, never from a lower band first. Alone on the queue:
the oldest while claims go through; while claims collide with other processes' (a lost
CAS, or a record taken since it was listed) the pick widens from the oldest ticket to a
random one of the head of the queue, and narrows again after a run of clean claims. Among
other workers: by lanes (:mod:`lakeshore.protocol.lanes`), from the first race lost or pick
found taken on. It also keeps a moving average of the picks found taken, above one half of
which a full ticket's record is read before the ticket itself.

The picks are guarded by their claimer's lock (see :mod:`lakeshore.protocol.claim_memory`):
the methods take it.
"""

from __future__ import annotations

import enum
import math
import random
import threading
from collections.abc import Callable

from lakeshore.protocol.claim_listing import LISTING_S, Listing
from lakeshore.protocol.claim_memory import TicketMemory
from lakeshore.protocol.lanes import HELP_WITHIN_S, STUCK_S, Lanes
from lakeshore.store.base import ObjectInfo

__all__ = ["RESTING", "Picker", "Resting"]

# widest random pick over the head of the queue once claims collide: the whole listing. A
# pick another process took since the listing costs a request or two; among P busy processes
# that happens about (claims per listing age) / (candidates) of the time, so the window must
# be much wider than what the others claim while a listing is reused
_MAX_SPREAD = 1000
_NARROW_AFTER = 16  # clean claims in a row before the spread halves again
# a process whose passes have left listed work to other lanes' owners for this long helps
# anyway: liveness must not hang on adoption (a lane's head can look new in every listing
# when the head of the queue is a scan of skipped tickets)
_HELD_MAX_S = 2 * STUCK_S
_TAKEN_WEIGHT = 0.1  # how fast the estimate of picks found taken follows the latest picks


class Resting(enum.Enum):
    """A fresh listing held only work left to the other lanes' owners (``Lanes.help``)."""

    RESTING = "resting"


RESTING = Resting.RESTING


class Picker:
    """How one claimer picks from ``listing``: its spread, its estimate of picks found taken,
    its ``lanes``, and the tickets its slots are trying now. ``eager``: a claimer that never
    leaves work to the other lanes' owners (a work queue's consumer)."""

    def __init__(
        self,
        listing: Listing,
        memory: TicketMemory,
        lanes: Lanes,
        ticks: Callable[[], float],
        lock: threading.Lock,
        *,
        eager: bool = False,
    ) -> None:
        self._listing = listing
        self._memory = memory
        self.lanes = lanes  # which picks are this process's
        self._ticks = ticks  # elapsed time, never stepped, counting time suspended
        self._lock = lock
        # a consumer's claim answers None only when there is nothing to take: it never leaves
        # work to the other lanes' owners (a worker's slot does, and polls again)
        self._eager = eager
        self._held = -math.inf  # when a pass last left work to the other lanes' owners
        # since when every pass has left work so (None: the last one did not): past
        # _HELD_MAX_S this process helps anyway, whatever kept the lanes from adoption
        self._held_since: float | None = None
        self._spread = 1  # 1: strict order (FIFO per priority); grows while claims collide
        self._clean = 0  # claims won since the last lost race
        # the share of recent picks another process had taken already (a moving average):
        # above one half, a full ticket's record is read before the ticket itself
        self._taken = 0.0
        self._trying: set[str] = set()  # ticket keys a slot of this worker is reading now

    def mostly_taken(self) -> bool:
        """Most of the recent picks had been taken by other processes since their listing.
        (One float read: not under the lock.)"""
        return self._taken > 0.5

    def next_candidate(self, now: float) -> ObjectInfo | Resting | None:
        """Take a candidate from the listing. Alone on the queue: the oldest while claims go
        through, a random one of the head while they collide. Among other workers: by lanes
        (:mod:`lakeshore.protocol.lanes`). The pick stays inside the head's priority band:
        never a lower band first."""
        with self._lock:
            listing = self._listing
            if listing.age() > LISTING_S:
                listing.clear()
            lanes = self.lanes.active
            head: list[int] = []
            band = None
            for i, info in enumerate(listing.items):
                if info.key in self._trying or self._memory.skipped(info, now):
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
                listing.clear()
                return None
            if lanes:
                listed = [listing.items[i] for i in head]
                mine = self.lanes.pick(listed)
                if mine is None and listing.age() > HELP_WITHIN_S:
                    listing.clear()  # help other lanes only from a fresh listing
                    return None
                if mine is None:
                    held = self._held_since
                    eager = self._eager or (
                        held is not None and self._ticks() - held >= _HELD_MAX_S
                    )
                    mine = self.lanes.help(listed, eager=eager)
                    if mine is None:
                        return RESTING
                pick = head[mine]
            else:
                pick = random.choice(head)
            info = listing.take(pick)
            self._trying.add(info.key)
            return info

    def tried(self, key: str) -> None:
        """A slot is done with the candidate ``key``."""
        with self._lock:
            self._trying.discard(key)

    def collided(self, lost: bool, key: str = "", raced: bool = True) -> None:
        """A claim went through (``lost`` False) or met another process's: a race lost on
        ``key`` (``raced``), or ``key`` found taken since it was listed."""
        # widen fast, narrow slowly: among busy workers the spread stays wide (few races);
        # a worker left alone is back to strict order after a run of clean claims
        with self._lock:
            self._taken += _TAKEN_WEIGHT * (lost - self._taken)
            if lost and raced:
                self.lanes.collided(key)
            elif lost:
                self.lanes.contended(key or None)
            if lost:
                self._spread, self._clean = min(self._spread * 4, _MAX_SPREAD), 0
            else:
                self._clean += 1
                if self._clean % _NARROW_AFTER == 0:
                    self._spread = max(1, self._spread // 2)

    def seen_another(self, key: str) -> None:
        """Another process claims from this queue (the ticket ``key`` was claimed since it
        was listed): if the census counted nobody else, or ``key`` is of this process's own
        lane (the other counted differently: one of the two counted before the other
        announced itself), and the census is due (see :meth:`Lanes.contended`), list again,
        taking the census with the listing. Consumers (``eager``) have no signs of life
        to count."""
        with self._lock:
            lanes = self.lanes
            if self._eager or not lanes.census_due():
                return
            if lanes.count == 1 or lanes.lane(key) == lanes.index:
                self._listing.clear()

    def taken_or_over(self, key: str) -> None:
        """The ticket ``key`` could not be claimed. In another process's lane, whose owner
        takes the oldest first, what is older than it is most likely taken or over too:
        left out of this listing."""
        with self._lock:
            lanes = self.lanes
            if not lanes.active:
                return
            lanes.missed(key)
            lane = lanes.lane(key)
            if lane != lanes.index:
                self._listing.keep(lambda i: i.key > key or lanes.lane(i.key) != lane)

    def create_lost(self, key: str) -> bool:
        """A create of the record behind the full ticket ``key`` met a record that existed
        already: another process claims here. Whether ``key`` is of another process's lane
        (and lanes apply)."""
        with self._lock:
            self.lanes.contended(key)
            lanes = self.lanes
            return lanes.active and lanes.lane(key) != lanes.index

    # -- passes that left work to the other lanes' owners ---------------------------------------

    def rested(self, resting: bool) -> None:
        """A pass ended: ``resting`` when what was listed was left to the other lanes'
        owners."""
        with self._lock:
            if resting:  # what is listed is left to the other lanes' owners
                self._held = self._ticks()
                if self._held_since is None:
                    self._held_since = self._held
            else:
                self._held_since = None

    def held_back(self, grace: float = 0.0) -> bool:
        """A pass within the last ``grace`` seconds left listed work to the other lanes'
        owners (their lanes were short, or a pick to help had just been found taken): the
        queue is not drained, and a worker waiting to drain it stays (should an owner be
        gone, its lane is adopted after ``STUCK_S``)."""
        with self._lock:
            return self._ticks() - self._held < grace
