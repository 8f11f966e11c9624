"""Lanes: how the worker processes that share a queue keep out of each other's way.

Every process claims from its own listing of the same tickets, and a listing cannot show
which tickets another process has taken since: a pick that was taken costs a request or two
(the ticket's read and a lost create, or the record's read). With many processes on one
queue, and a queue running short, such picks would be most of the requests. So each process
numbers the workers of its namespace — a listing of their signs of life, keys and times
only, taken again after 1, 2, 4 … and then every 30 seconds — and gives each a lane: the
workers' names are hashed to points on a ring (``POINTS`` each, fewer among thousands), and
a ticket belongs to the worker whose point follows the hash of its key. A worker that comes
or goes moves only the tickets next to its own points, so two processes whose censuses
differ by a worker (one started a moment ago) disagree about few tickets. A process claims

1. the oldest ticket of its own lane, or of a lane it adopted;
2. with its own lanes empty in a listing at most ``HELP_WITHIN_S`` old (else it lists again
   first), a random one of the newest quarter of the lane with the most tickets (the lane's
   owner works from the older end, where what it took lingers until its batch delete).

A lane whose oldest ticket stayed the same for ``STUCK_S`` (its owner runs long bodies, has
stopped, or serves other queues) is adopted: claimed oldest first, as one's own, until a
claim on it collides with another process (its owner is back) or it runs empty.

Only the order of the picks depends on lanes: every claim is still one conditional write,
so a census that is stale, or that two processes took differently, costs races, never an
invocation run twice or left behind.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import random
from collections.abc import Callable

from lakeshore.errors import LakeshoreError
from lakeshore.keys import QueueKeys, worker_key, workers_prefix
from lakeshore.store.base import ObjectInfo, Store

__all__ = ["HELP_WITHIN_S", "STUCK_S", "Lanes"]

log = logging.getLogger("lakeshore.worker")

FRESH_S = 100.0  # a sign of life written this recently counts (workers write one every 30 s)
CENSUS_MAX_S = 30.0  # the longest interval between two censuses
_CENSUS_KEYS = 10_000  # keys looked at per census at most
STUCK_S = 5.0  # a lane whose oldest ticket has not moved for this long is adopted
HELP_WITHIN_S = 0.25  # another lane is helped from a listing at most this old
POINTS = 64  # points of each worker on the ring: lanes of about equal size (within ±20 %)
_RING_MAX = 16_384  # points in all: among thousands of workers, fewer each


def _hash(text: str) -> int:
    # well mixed: names and keys that differ in a character or two land far apart
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Lanes:
    """The lanes of one worker process on one queue. Not thread-safe: the caller holds its
    lock around everything but ``survey`` (which sends the request)."""

    def __init__(self, keys: QueueKeys, worker: str, ticks: Callable[[], float]) -> None:
        self._prefix = workers_prefix(keys.ns)
        self._me = worker_key(keys.ns, worker)[len(self._prefix) :]
        self._ticks = ticks
        self.index, self.count = 0, 1
        self._names: list[str] = []
        self._points: list[int] = []  # the ring, sorted
        self._owners: list[int] = []  # the lane of each point
        self._census_due = -math.inf
        self._census_every = 1.0
        self._counted = False  # no census taken yet
        self._heads: dict[int, tuple[str, float]] = {}  # lane -> its oldest ticket, since when
        self._adopted: set[int] = set()

    def survey(self, store: Store, now: float) -> list[str] | None:
        """The names of the workers seen lately, if a census is due (one LIST of their signs
        of life); else None."""
        if self._ticks() < self._census_due:
            return None
        self._census_due = self._ticks() + self._census_every  # one survey at a time
        names = [self._me]
        try:
            for seen, info in enumerate(store.list(self._prefix)):
                if seen >= _CENSUS_KEYS:
                    break
                if info.last_modified >= now - FRESH_S:
                    names.append(info.key[len(self._prefix) :])
        except LakeshoreError as e:  # no census: the order of the picks is all it changes
            log.debug("worker census failed: %s", e)
        return names

    def number(self, names: list[str]) -> None:
        """Take the census ``names`` (from :meth:`survey`)."""
        ranked = sorted(set(names))
        if ranked != self._names or not self._counted:
            self._names = ranked
            self.index, self.count = ranked.index(self._me), len(ranked)
            ring = sorted(
                (_hash(f"{name}/{v}"), lane)
                for lane, name in enumerate(ranked)
                for v in range(max(8, min(POINTS, _RING_MAX // len(ranked))))
            )
            self._points = [point for point, _ in ring]
            self._owners = [lane for _, lane in ring]
            self._heads.clear()
            self._adopted.clear()
            self._census_every = 1.0  # workers come in waves: look again soon
            self._counted = True
        else:
            self._census_every = min(self._census_every * 2, CENSUS_MAX_S)
        self._census_due = self._ticks() + self._census_every

    def lane(self, key: str) -> int:
        if self.count == 1:
            return 0
        at = bisect.bisect(self._points, _hash(key))
        return self._owners[at % len(self._owners)]

    def observe(self, listing: list[ObjectInfo]) -> None:
        """A new listing (in claim order, without what this process skips): note each lane's
        oldest ticket, adopting lanes whose oldest ticket has not moved for ``STUCK_S``."""
        now = self._ticks()
        heads: dict[int, tuple[str, float]] = {}
        for info in listing:
            lane = self.lane(info.key)
            if lane not in heads:
                was = self._heads.get(lane)
                heads[lane] = (info.key, was[1] if was is not None and was[0] == info.key else now)
        self._heads = heads
        self._adopted = {
            lane
            for lane, (_, since) in heads.items()
            if lane != self.index and (lane in self._adopted or now - since >= STUCK_S)
        }

    def pick(self, candidates: list[ObjectInfo]) -> int | None:
        """Which of ``candidates`` (in claim order) to claim: the index of the oldest of this
        process's lanes; None when there is none (see :meth:`help`)."""
        for i, info in enumerate(candidates):
            lane = self.lane(info.key)
            if lane == self.index or lane in self._adopted:
                return i
        return None

    def help(self, candidates: list[ObjectInfo]) -> int:
        """Which of ``candidates`` (not empty, none of this process's lanes) to claim: its
        index. Only from a fresh listing: in an old one, the other lanes hold what their
        owners have taken since."""
        members: dict[int, list[int]] = {}
        for i, info in enumerate(candidates):
            members.setdefault(self.lane(info.key), []).append(i)
        fullest = max(members.values(), key=len)
        # its owner takes the oldest first, and what it took or ended lingers at that end
        # of the listing until its batch delete: the newest quarter is the safest to help with
        return random.choice(fullest[len(fullest) - max(1, len(fullest) // 4) :])

    def collided(self, key: str) -> None:
        """A claim of ``key`` met another process's: its lane is served by someone."""
        self._adopted.discard(self.lane(key))
