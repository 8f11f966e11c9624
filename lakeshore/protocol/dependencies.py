"""Dependencies on the store: finding a child's parents by id, and judging them.

A child names its parents by id only: they may live in any queue of its namespace, and were
perhaps submitted by a process long gone. :class:`Parents` finds each one where a reader
that knows only the id would (its own queue, the id index, the default queue), remembers
which queue that was (ids never move), and reads the record there. :meth:`Parents.judge`
walks a child's parents from the first one not yet seen done, in growing batches read side
by side, and stops at the first that is not done: what it found is a :class:`Judged`. The
rules of what each state means are :mod:`lakeshore.model.dependencies`'; the writes that
follow (claim, progress, kill) are the claimer's (``claim_examine``).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from lakeshore.errors import InvalidArgument, NotFound, RecordError
from lakeshore.keys import DEFAULT_QUEUE, QueueKeys
from lakeshore.model.dependencies import Standing, parent_standing
from lakeshore.model.record import Record, State
from lakeshore.protocol.steps import QueueOps, read_id_index
from lakeshore.store import MemoryStore, Store

__all__ = ["MAX_BATCH", "NOT_FOUND", "Judged", "Parents"]

T = TypeVar("T")

MAX_BATCH = 32  # parents read side by side, at most (S3Store keeps 64 connections)
_REMEMBERED = 100_000  # parents' queues remembered before the memory starts over

# how a parent that broke its child ended, in the child's error
_WHY = {
    State.FAILED: "failed",
    State.KILLED: "was killed",
    State.TIMEOUT: "timed out",
}
NOT_FOUND = "was not found (collected by gc, or never submitted in this namespace)"


# Where parents were found, per store and namespace, for every Parents of this process: a
# claimer's and a fan-in's read of the results share it. Ids never move, and a queue found
# here is only where to look first (the record read there decides), so it cannot mislead.
_WHERE: weakref.WeakKeyDictionary[Store, dict[str, dict[str, str]]] = weakref.WeakKeyDictionary()
_WHERE_LOCK = threading.Lock()


def _where_on(store: Store, ns: str) -> dict[str, str]:
    with _WHERE_LOCK:
        return _WHERE.setdefault(store, {}).setdefault(ns, {})


@dataclass(frozen=True)
class Judged:
    """What a look at a child's parents found.

    ``done``: parents, in order, seen done (all of them: the child is claimable).
    ``parent``: the first parent not done ("" when all are). ``why``: how it ended, when
    it broke the child (else ""). ``soon``: it waits for a parent that is running, or
    queued and due (or retrying) in the child's queue or another the judging worker serves:
    work to come, which a draining worker waits for. A parent whose first run was delayed
    to later is not: a draining worker does not wait for delayed work.
    """

    done: int
    parent: str = ""
    why: str = ""
    soon: bool = False


class Parents:
    """Reads parents by id for the claimer of ``home``'s queue (a child's parents are
    looked for there first)."""

    def __init__(self, home: QueueOps) -> None:
        self._home = home
        self._store = home.store
        self._ns = home.keys.ns
        self._ops: dict[str, QueueOps] = {home.keys.queue: home}
        self._where = _where_on(home.store, home.keys.ns)  # parent id -> its queue
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def _queue_ops(self, queue: str) -> QueueOps:
        with self._lock:
            ops = self._ops.get(queue)
            if ops is None:
                ops = self._ops[queue] = QueueOps(self._store, QueueKeys(self._ns, queue))
            return ops

    def find(self, inv: str) -> tuple[QueueOps, Record] | None:
        """The record of ``inv`` in any queue of the namespace, with that queue's steps;
        None when there is none. Where to look, cheapest first: the queue it was found in
        before; the ``<id>/record`` of the child's queue and of the default queue (a parent
        that ever moved has one); the queue the id index names; then the whole lookup (the
        ticket as well) in the child's queue and the default queue.

        Raises:
            RecordError: the record is corrupt or of a newer schema. StoreError: the
                store failed.
        """
        home = self._home.keys.queue
        known = self._where.get(inv)
        if known is not None:
            found = self._read(known, inv)
            if found is not None:
                return found
        for queue in dict.fromkeys((home, DEFAULT_QUEUE)):
            if queue != known:
                found = self._read(queue, inv, record_only=True)
                if found is not None:
                    return found
        indexed = read_id_index(self._store, self._ns, inv)
        try:  # the index is a hint anyone who may write could have written
            indexed = QueueKeys(self._ns, indexed).queue if indexed else ""
        except InvalidArgument:
            indexed = ""
        tried = {known} if known is not None else set()
        for queue in dict.fromkeys(q for q in (indexed, home, DEFAULT_QUEUE) if q):
            if queue not in tried:
                found = self._read(queue, inv)
                if found is not None:
                    return found
        return None

    def _read(
        self, queue: str, inv: str, record_only: bool = False
    ) -> tuple[QueueOps, Record] | None:
        ops = self._queue_ops(queue)
        try:
            rec, _ = ops.read_record(inv) if record_only else ops.read(inv)
        except NotFound:
            return None
        with self._lock:
            if len(self._where) >= _REMEMBERED:
                self._where.clear()
            self._where[inv] = queue
        return ops, rec

    def judge(
        self, child: Record, serves: frozenset[str] = frozenset(), now: float = math.inf
    ) -> Judged:
        """Look at ``child``'s parents from the first not seen done, and stop at the first
        that is not done now. Parents are read in batches that double from 1 to
        :data:`MAX_BATCH` while every one is done, so a child whose first parent is still
        running costs one read, and one whose parents all ended costs about one read per
        parent, most of them side by side. ``serves``: the queues the judging worker
        serves besides the child's (see :attr:`Judged.soon`).

        Raises:
            StoreError: the store failed (nothing is concluded).
        """
        done, batch = child.after_done, 1
        while done < len(child.after):
            ids = child.after[done : done + batch]
            for inv, found in zip(ids, self.side_by_side(self._record, ids), strict=True):
                if isinstance(found, RecordError):
                    # corrupt (its claimer will fail it, and then it counts as failed) or of a
                    # newer schema: not judged now
                    return Judged(done, inv)
                state = found.state if found is not None else None
                match parent_standing(state, child.after_failure):
                    case Standing.DONE:
                        done += 1
                    case Standing.WAITING:
                        assert found is not None
                        delayed = found.attempt == 0 and found.not_before > now
                        soon = found.state == State.RUNNING or (
                            (found.queue == child.queue or found.queue in serves) and not delayed
                        )
                        return Judged(done, inv, soon=soon)
                    case Standing.BROKEN:
                        why = NOT_FOUND if found is None else _WHY[found.state]
                        return Judged(done, inv, why=why)
            batch = min(batch * 2, MAX_BATCH)
        return Judged(done)

    def _record(self, inv: str) -> Record | RecordError | None:
        try:
            found = self.find(inv)
        except RecordError as e:
            return e
        return None if found is None else found[1]

    def side_by_side(self, fn: Callable[[str], T], ids: tuple[str, ...]) -> list[T]:
        """``fn`` of each of ``ids``, in order; run side by side (up to :data:`MAX_BATCH`
        at a time) on a store with I/O to overlap.

        Raises:
            whatever ``fn`` raised first, in order.
        """
        if len(ids) <= 1 or isinstance(self._store, MemoryStore):
            return [fn(inv) for inv in ids]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_BATCH, thread_name_prefix="lakeshore-parents")
            pool = self._pool
        return list(pool.map(fn, ids))

    def close(self) -> None:
        """Let the threads that read side by side go (a new batch starts them again)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
