"""A claim scheduler's listing of the tickets: one LIST, reused by its slots' claims.

The listing walks the tickets in key order (claim order), looks at no more than ``SCAN``
of them and keeps up to ``_LISTING`` that the process does not remember. It is reused for
``LISTING_S`` (each claim takes a different candidate out of it), which bounds how long a
newly submitted ticket of a higher priority goes unseen. A listing that scanned ``SCAN``
tickets it skips makes the next one start past them, so they cannot hide the work behind
them. The census of the workers (:mod:`lakeshore.protocol.lanes`) is taken with a listing.

Its age is read from ``time.monotonic()``. The listing is guarded by its claimer's lock (see
:mod:`lakeshore.protocol.claim_memory`): :meth:`Listing.refresh` takes it; ``age``, ``items``,
``take``, ``clear`` and ``keep`` are called under it (by the picks); ``at_head`` is read
without it, by the pass that just listed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from lakeshore.protocol.claim_memory import TicketMemory
from lakeshore.protocol.lanes import Lanes, ring
from lakeshore.protocol.steps import QueueOps
from lakeshore.store.base import ObjectInfo

__all__ = ["LISTING_S", "SCAN", "Listing"]

_LISTING = 1000  # candidates kept from one LIST of the tickets (one S3 page)
LISTING_S = 1.0  # a listing is reused by later claims for this long (bounds priority lag)
SCAN = 5000  # tickets looked at (listed, not read) per LIST at most


class Listing:
    """The last listing of ``ops``'s tickets, less what ``memory`` skips; ``lanes`` takes its
    census with it and notes each lane's head."""

    def __init__(
        self, ops: QueueOps, memory: TicketMemory, lanes: Lanes, lock: threading.Lock
    ) -> None:
        self._ops = ops
        self._memory = memory
        self._lanes = lanes
        self._lock = lock
        self._listing_lock = threading.Lock()  # one LIST in flight per worker
        self.judged_at = -math.inf  # the store time the listing was judged at
        self.whole = False  # and whether it looked at every ticket
        self._items: list[ObjectInfo] = []
        self.listed_at = -1e9  # time.monotonic() of the listing
        # where the next listing starts (None: at the head): past the last key of a listing
        # that scanned SCAN tickets it skips, so they cannot hide the work behind them
        self._resume: str | None = None
        self._resumed = False  # the last listing began past the head

    def refresh(self, now: float) -> bool:
        """List the head of the queue (what is not skipped); False when there is none.
        One slot lists at a time: slots that ran dry together wait for its listing instead
        of each sending the same LIST."""
        asked = time.monotonic()
        with self._listing_lock:
            with self._lock:
                if self.listed_at >= asked:  # another slot listed while we waited
                    return bool(self._items)
            names = self._lanes.survey(self._ops.store, now)
            if names is not None:
                census = ring(names) if self._lanes.changed(names) else None
                with self._lock:
                    self._lanes.number(census)
            fresh: list[ObjectInfo] = []
            seen: set[str] = set()
            start, resume, last = self._resume, None, None
            whole = start is None
            for scanned, info in enumerate(self._ops.tickets(start)):
                if len(fresh) >= _LISTING:
                    whole = False
                    break
                if scanned >= SCAN:
                    # a scan's worth of tickets this process skips (not due, running, or
                    # planted): the next listing starts past them instead of at the head
                    whole, resume = False, last
                    break
                seen.add(info.key)
                last = info.key
                if not self._memory.skipped(info, now):
                    fresh.append(info)
            with self._lock:
                self._memory.prune(now, seen if start is None else None)
                self._resume, self._resumed = resume, start is not None
                self._items = fresh
                self._lanes.observe(fresh)
                self.listed_at = time.monotonic()
                self.judged_at, self.whole = now, whole
            return bool(fresh)

    def at_head(self) -> bool:
        """The last listing began at the head of the queue, and so does the next one."""
        return not self._resumed and self._resume is None

    # -- under the lock ------------------------------------------------------------------------

    def age(self) -> float:
        """Seconds since the listing was made (``time.monotonic()``)."""
        return time.monotonic() - self.listed_at

    @property
    def items(self) -> list[ObjectInfo]:
        """The candidates left, in claim order (not to be changed but by the methods here)."""
        return self._items

    def take(self, i: int) -> ObjectInfo:
        """Take the candidate at ``i`` out: no other slot picks it from this listing."""
        return self._items.pop(i)

    def clear(self) -> None:
        """Drop what is left: the next pick lists again."""
        self._items = []

    def keep(self, wanted: Callable[[ObjectInfo], bool]) -> None:
        """Keep only the candidates ``wanted`` (the others are most likely taken or over)."""
        self._items = [i for i in self._items if wanted(i)]
