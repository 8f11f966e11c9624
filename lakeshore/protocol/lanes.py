"""Lanes: how the worker processes that share a queue keep out of each other's way.

A listing cannot show which tickets another process took since, and each pick that was taken
costs a request or two; with many processes on a queue running short, such picks would be
most of the requests. So each process numbers the namespace's workers from their signs of
life (keys and times only) and hashes their names to points on a ring: a ticket belongs to the
worker whose point follows its key's hash, and a worker that comes or goes moves only the
tickets next to its points. A process takes the oldest ticket of its own lane or of a lane it
adopted (its head stuck for ``STUCK_S``), else helps the fullest lane from its newest end.

Lanes apply only while another process was seen claiming from the queue within
``CONTENDED_S``; alone, a process claims in strict order. Only the order of picks depends on
lanes: every claim is still one conditional write, so a stale or differing census costs
races, never an invocation run twice or left behind. The timings and the limits on helping:
docs/protocol.md#claim-order.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from lakeshore.errors import LakeshoreError
from lakeshore.keys import QueueKeys, worker_key, workers_prefix
from lakeshore.store.base import ObjectInfo, Store

__all__ = [
    "CONTENDED_S",
    "FLOOR_S",
    "HELP_MIN",
    "HELP_WAIT_S",
    "HELP_WITHIN_S",
    "PAUSE_S",
    "RECOUNT_S",
    "STUCK_S",
    "Lanes",
    "Ring",
    "ring",
]

log = logging.getLogger("lakeshore.worker")

FRESH_S = 100.0  # a sign of life written this recently counts (workers write one every 30 s)
CENSUS_MAX_S = 30.0  # the longest interval between two censuses
RECOUNT_S = 0.25  # a census that counted nobody else, while another claims here: taken again
# signs of life looked at per census at most (a LIST page is 1,000; gc --older-than prunes
# the keys of workers long gone): past it, the census is cut short
_CENSUS_KEYS = 100_000
_NAMES_MAX = 10_000  # workers numbered at most (the rest only take waiting tickets)
_FUTURE_S = 30.0  # a sign of life dated later than now by more than this does not count
STUCK_S = 5.0  # a lane whose oldest ticket has not moved for this long is adopted
CONTENDED_S = 120.0  # lanes apply while another process was seen claiming this recently
_CACHE_MAX = 8192  # lanes of ticket keys remembered (until the census changes)
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")  # what worker_key leaves of a name
HELP_WITHIN_S = 0.25  # another lane is helped from a listing at most this old
# a lane is helped only with this many tickets listed: in a shorter one, what a helper would
# take is what its owner takes next (and the tail of a drain is where helpers would race)
HELP_MIN = 4
HELP_WAIT_S = 0.25  # unless its oldest ticket has been the lane's head this long
# after a pick to help was found taken or over, no lane is helped for this long: the fullest
# lane was tried first, so the others most likely hold what their owners took or ended too
PAUSE_S = 0.5
FLOOR_S = 2.0  # how long a lane's tickets up to one found taken are not helped with
POINTS = 64  # points of each worker on the ring: lanes of about equal size (within ±20 %)
_RING_MAX = 16_384  # points in all: among thousands of workers, fewer each


def _hash(text: str) -> int:
    # well mixed: names and keys that differ in a character or two land far apart; a key
    # listed from a shared folder may hold any code point (surrogatepass: never an error)
    data = text.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@dataclass(frozen=True)
class Ring:
    """A census on the hash ring: the names (sorted), each point and the lane it starts."""

    names: tuple[str, ...]
    points: tuple[int, ...]
    owners: tuple[int, ...]


def ring(names: list[str]) -> Ring:
    """The ring of the workers ``names`` (pure; thousands of names take a fraction of a
    second, so the caller builds it outside its lock)."""
    ranked = sorted(set(names))
    each = max(8, min(POINTS, _RING_MAX // max(1, len(ranked))))
    pairs = sorted(
        (_hash(f"{name}/{v}"), lane) for lane, name in enumerate(ranked) for v in range(each)
    )
    return Ring(tuple(ranked), tuple(p for p, _ in pairs), tuple(lane for _, lane in pairs))


def _band(key: str) -> str:
    """The priority band of a ticket key (``…/_tickets/<band>/<id>``): keys compare in time
    order only within one."""
    return key.rsplit("/", 2)[-2] if key.count("/") >= 2 else ""


class Lanes:
    """The lanes of one worker process on one queue. Not thread-safe: the caller holds its
    lock around everything but ``survey`` (which sends the request) and :func:`ring`."""

    def __init__(self, keys: QueueKeys, worker: str, ticks: Callable[[], float]) -> None:
        self._prefix = workers_prefix(keys.ns)
        self.me = worker_key(keys.ns, worker)[len(self._prefix) :]
        self._ticks = ticks
        self.index, self.count = 0, 1
        self._ring = Ring((self.me,), (), ())
        self._census_due = -math.inf
        self._census_every = 1.0
        self._surveyed = -math.inf  # when the last census was taken
        self._counted = False  # no census taken yet
        self._cache: dict[str, int] = {}  # ticket key -> its lane, for this census
        self._since: dict[str, float] = {}  # a lane's oldest listed ticket -> since when
        self._adopted: set[int] = set()  # lanes whose oldest ticket did not move for STUCK_S
        self._wary: dict[int, float] = {}  # lane -> until when its owner is deemed back
        # lane -> the newest of its tickets a pick to help found taken or over (its owner,
        # which takes the oldest first, took the older ones of that band too), until when
        self._floor: dict[int, tuple[str, float]] = {}
        self._pause_until = -math.inf  # no lane is helped before then
        self._contended = -math.inf  # when another process was last seen claiming here
        self._recount_every = RECOUNT_S  # wait after a miss in its own lane (see contended)
        self._recounting = False  # the next census is for such a miss

    @property
    def active(self) -> bool:
        """Whether lanes order the picks: other workers are counted, and one of them was
        seen claiming from this queue lately."""
        return self.count > 1 and self._ticks() - self._contended < CONTENDED_S

    def contended(self, key: str | None = None) -> None:
        """Another process claims from this queue: a race lost, or a pick found taken (of
        the ticket ``key``). With nobody else in the census, the census is taken again at
        the next listing, at most every ``RECOUNT_S``. In this process's own lane (a process
        that counted differently: one of the two counted before the other announced itself,
        as when many start together; or a helper, an adopter), likewise, but each census
        that finds nothing new doubles that wait, up to ``CENSUS_MAX_S``: helpers at work
        do not have the census taken every 0.25 s."""
        now = self._ticks()
        self._contended = now
        if self.count == 1:
            self._census_due = min(self._census_due, self._surveyed + RECOUNT_S)
        elif key is not None and self.lane(key) == self.index:
            self._census_due = min(self._census_due, self._surveyed + self._recount_every)
            self._recounting = True

    def census_due(self) -> bool:
        """Whether the next :meth:`survey` takes a census."""
        return self._ticks() >= self._census_due

    def survey(self, store: Store, now: float) -> list[str] | None:
        """The names of the workers seen lately, if a census is due (a LIST of their signs
        of life, a page per 1,000); else None."""
        if not self.census_due():
            return None
        self._surveyed = self._ticks()
        self._census_due = self._surveyed + self._census_every  # one survey at a time
        names = [self.me]
        try:
            for seen, info in enumerate(store.list(self._prefix)):
                if seen >= _CENSUS_KEYS:
                    log.debug("worker census cut short at %d signs of life", seen)
                    break
                name = info.key[len(self._prefix) :]
                # a time far ahead is a skewed clock or a forged key: it would count forever
                fresh = now - FRESH_S <= info.last_modified <= now + _FUTURE_S
                if fresh and _NAME.fullmatch(name) and len(names) < _NAMES_MAX:
                    names.append(name)
        except LakeshoreError as e:  # no census: the order of the picks is all it changes
            log.debug("worker census failed: %s", e)
        return names

    def changed(self, names: list[str]) -> bool:
        """Whether the census ``names`` differs from the one in use (then build its
        :func:`ring` and :meth:`number` it)."""
        return not self._counted or tuple(sorted(set(names))) != self._ring.names

    def number(self, census: Ring | None) -> None:
        """Take a census: its ring, or None when it did not change."""
        if census is not None:
            self._ring = census
            self.index, self.count = census.names.index(self.me), len(census.names)
            self._cache.clear()
            self._wary.clear()
            self._adopted.clear()  # lanes are numbered anew; the heads' times are kept
            self._floor.clear()
            self._census_every = 1.0  # workers come in waves: look again soon
            self._counted = True
            self._recount_every = RECOUNT_S
        else:
            self._census_every = min(self._census_every * 2, CENSUS_MAX_S)
            if self._recounting:  # taken for a miss in its own lane, and nothing new
                self._recount_every = min(self._recount_every * 2, CENSUS_MAX_S)
        self._recounting = False
        self._census_due = self._ticks() + self._census_every

    def lane(self, key: str) -> int:
        if self.count == 1:
            return 0
        lane = self._cache.get(key)
        if lane is None:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            at = bisect.bisect(self._ring.points, _hash(key))
            lane = self._cache[key] = self._ring.owners[at % len(self._ring.owners)]
        return lane

    def observe(self, listing: list[ObjectInfo]) -> None:
        """A new listing (in claim order, without what this process skips): note each lane's
        oldest ticket and since when it has been, adopting the lanes where that stayed the
        same for ``STUCK_S`` (an adopted lane stays adopted while it has tickets listed)."""
        now = self._ticks()
        self._wary = {lane: until for lane, until in self._wary.items() if until > now}
        heads: dict[int, str] = {}
        for info in listing:
            heads.setdefault(self.lane(info.key), info.key)
        # a head keeps its time while it is listed, head or not: a census that changes moves
        # it into another lane and back, and its owner has not taken it meanwhile
        listed = {info.key for info in listing}
        since = {key: at for key, at in self._since.items() if key in listed}
        for key in heads.values():
            since.setdefault(key, now)
        self._since = since
        self._adopted = {
            lane
            for lane, key in heads.items()
            if lane != self.index
            and lane not in self._wary
            and (lane in self._adopted or now - self._since[key] >= STUCK_S)
        }

    def _mine(self, key: str) -> bool:
        lane = self.lane(key)
        return lane == self.index or lane in self._adopted

    def pick(self, candidates: list[ObjectInfo]) -> int | None:
        """Which of ``candidates`` (in claim order) to claim: the index of the oldest of this
        process's lane or of a lane it adopted; None when there is none (see :meth:`help`)."""
        for i, info in enumerate(candidates):
            if self._mine(info.key):
                return i
        return None

    def help(self, candidates: list[ObjectInfo], eager: bool = False) -> int | None:
        """Which of ``candidates`` (not empty, none of this process's lanes) to claim: its
        index, or None when no lane has ``HELP_MIN`` tickets newer than its floor (see
        :meth:`missed`) or helping pauses — unless ``eager`` (a caller that must take what
        there is), which then helps the fullest lane anyway. Only from a fresh listing: in
        an old one, the other lanes hold what their owners have taken since."""
        now = self._ticks()
        members: dict[int, list[int]] = {}
        for i, info in enumerate(candidates):
            lane = self.lane(info.key)
            if not self._below_floor(lane, info.key, now):
                members.setdefault(lane, []).append(i)
        # a short lane is left to its owner, unless its oldest ticket has stayed there for
        # HELP_WAIT_S: an owner at work takes it sooner (a frozen one never does)
        members = {
            lane: picks
            for lane, picks in members.items()
            if len(picks) >= HELP_MIN
            or now - self._since.get(candidates[picks[0]].key, now) >= HELP_WAIT_S
        }
        fullest = max(members.values(), key=len, default=[])
        if not fullest or now < self._pause_until:
            if not eager:
                return None
            if not fullest:  # every one listed is below its lane's floor: they may be back
                for i, info in enumerate(candidates):
                    members.setdefault(self.lane(info.key), []).append(i)
                fullest = max(members.values(), key=len)
        # its owner takes the oldest first, and what it took or ended lingers at that end
        # of the listing until its batch delete: the newest quarter is the safest to help with
        return random.choice(fullest[len(fullest) - max(1, len(fullest) // 4) :])

    def _below_floor(self, lane: int, key: str, now: float) -> bool:
        floor = self._floor.get(lane)
        if floor is None or floor[1] <= now:
            return False
        return _band(key) == _band(floor[0]) and key <= floor[0]

    def missed(self, key: str) -> None:
        """A pick of ``key`` found it taken or over: if it was another lane's, that lane's
        tickets of its band up to it are not helped with for ``FLOOR_S`` (see :meth:`help`):
        by then its owner's batch delete has taken the finished ones out of the listings;
        and no lane is helped for ``PAUSE_S``."""
        lane = self.lane(key)
        if lane != self.index:
            floor = self._floor.get(lane)
            now = self._ticks()
            if floor is None or floor[1] <= now or _band(floor[0]) != _band(key) or key > floor[0]:
                floor = (key, now + FLOOR_S)
            self._floor[lane] = floor
            self._pause_until = self._ticks() + PAUSE_S

    def collided(self, key: str) -> None:
        """A claim of ``key`` lost a race: its lane's owner is back, so the lane is left to it
        (not adopted) for ``STUCK_S``."""
        self.contended(key)
        lane = self.lane(key)
        if lane != self.index:
            self._wary[lane] = self._ticks() + STUCK_S
            self._adopted.discard(lane)
