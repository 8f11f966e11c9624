"""What is in a queue, at a cost that does not grow with its history.

Counts come from the tickets, which exist only for live invocations (one LIST page per 1000):
up to ``EXACT_UP_TO`` live, their records are read for exact queued and running counts;
beyond, ``running`` is what the workers' signs of life report. The oldest queued age is the
smallest ticket id (ULIDs carry their submit time). Recent outcomes and ``ls`` list invocation
folders backwards in time windows that double, so only those windows are read. The module also
writes and reads workers' signs of life, and gives the scaler its count of live tickets
(:func:`live_tickets`), which stops where a larger count would change nothing.

Anything read may have been written by someone else: an undecodable record counts as
``failed`` (the stub a claimer would write), a malformed sign of life is skipped or stripped
to its well-formed fields, and a folder name that is not an id is passed over. One bad object
never stops a listing. What each part costs: docs/operations.md#what-status-and-ls-cost.
"""

from __future__ import annotations

import contextlib
import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ulid import ULID

from lakeshore import codec
from lakeshore.errors import InvalidArgument, LakeshoreError, NewerRecord, NotFound, RecordError
from lakeshore.keys import QueueKeys, id_time, is_name, past_folder, worker_key, workers_prefix
from lakeshore.model.record import LIVE, Record, State
from lakeshore.protocol.steps import MAX_SMALL_BYTES, QueueOps, corrupt_stub
from lakeshore.store.base import OVERWRITE, ObjectInfo, Store

__all__ = [
    "EXACT_UP_TO",
    "Page",
    "QueueStatus",
    "folder_names",
    "list_invocations",
    "live_ids",
    "live_tickets",
    "newest_ids",
    "queue_status",
    "read_sign_of_life",
    "records",
    "summary",
    "workers_seen",
    "write_sign_of_life",
]

_FIRST_WINDOW_MS = 60_000
EXACT_UP_TO = 256  # live invocations whose records status reads for exact counts
# how far past the scaler's horizon an id's time must lie for its ticket to be left out
# unread: a producer's clock may run this far ahead of the store's
ID_SLACK_S = 600.0
MAX_SCAN = 200_000  # ticket keys a scaler's count lists at most (200 LIST pages)


def _floor(ms: int) -> str:
    """The smallest id of millisecond ``ms``."""
    return str(ULID.from_bytes(max(0, ms).to_bytes(6, "big") + bytes(10)))


def _is_id(name: str) -> bool:
    try:
        return str(ULID.from_str(name)) == name
    except ValueError:
        return False


def ids_between(store: Store, keys: QueueKeys, lo: str | None, hi: str) -> Iterator[str]:
    """Ids of invocation folders with ``lo <= id < hi`` (no lower bound when ``lo`` is None),
    ascending. One LIST walk over just those folders; a folder whose name is not an id (not
    lakeshore's) is passed over."""
    base = keys.ids_prefix
    last = None
    for info in store.list(base, start_after=f"{base}{lo}" if lo else None):
        inv = info.key[len(base) :].split("/", 1)[0]
        if inv >= hi or inv.startswith("_"):
            return  # the "_" folders (and later ids) come after every id in the window
        if inv != last:
            last = inv
            if _is_id(inv):
                yield inv


def folder_names(
    store: Store, prefix: str, keep: Callable[[str], bool] | None = None, limit: int = 256
) -> list[str]:
    """The names of the folders right under ``prefix`` that ``keep`` accepts (the first
    ``limit`` of them, in listing order). Each folder found costs one LIST: the next listing
    starts past it, so what the folders hold costs nothing (namespaces with long
    histories, too); objects right under ``prefix`` are read past in the same listing.
    Folders ``keep`` refuses (anyone may plant names) count towards ``4 × limit`` listings
    at most, so they cannot make the walk endless or hide the rest for long.

    Raises:
        StoreError: the store failed.
    """
    names: list[str] = []
    after: str | None = None
    for _ in range(4 * limit):
        listing = store.list(prefix, start_after=after)
        found = None
        try:
            for info in listing:
                name, slash, _ = info.key[len(prefix) :].partition("/")
                if slash and name not in names:
                    found = name
                    break
                after = info.key  # an object right under the prefix, or a key past the skip
        finally:
            close = getattr(listing, "close", None)
            if close is not None:
                close()
        if found is None or len(names) >= limit:
            return names
        if keep is None or keep(found):
            names.append(found)
            if len(names) >= limit:
                return names
        after = past_folder(prefix, found)
    return names


def newest_ids(store: Store, keys: QueueKeys, before: str | None, now: float) -> Iterator[str]:
    """Ids of the queue, newest first (older than ``before`` when given). Lists backwards
    in time windows of doubling length, so finding the newest N costs about what listing N
    does, however long the history. An invocation nothing has moved yet has no folder, only
    its ticket: the tickets (one LIST page per 1000 live invocations) are merged in. A
    delayed invocation's id carries its due time, later than now: the first page takes
    every ticket, those included, and the folders from now on back."""
    hi = before or _floor(int(now * 1000) + 60_000)
    ticketed = {QueueKeys.id_of(info.key) for info in store.list(keys.tickets_prefix)}
    unmoved = sorted(
        (i for i in ticketed if (before is None or i < hi) and _is_id(i)), reverse=True
    )
    last = None
    for inv in heapq.merge(_folders_newest(store, keys, hi), unmoved, reverse=True):
        if inv != last:  # a moved invocation has both
            last = inv
            yield inv


def _folders_newest(store: Store, keys: QueueKeys, hi: str) -> Iterator[str]:
    oldest = next(ids_between(store, keys, None, hi), None)
    if oldest is None:
        return
    oldest_ms = ULID.from_str(oldest).milliseconds
    hi_ms, window = ULID.from_str(hi).milliseconds, _FIRST_WINDOW_MS
    while True:
        lo_ms = max(hi_ms - window, oldest_ms)
        lo = _floor(lo_ms)
        yield from reversed(list(ids_between(store, keys, lo, hi)))
        if lo_ms <= oldest_ms:
            return
        hi, hi_ms, window = lo, lo_ms, window * 2


def records(ops: QueueOps, ids: list[str], threads: int = 16) -> list[Record]:
    """The records of ``ids`` (read in parallel), skipping missing ones and those of a newer
    schema. A record that cannot be decoded comes back as the failed ``CorruptRecord`` stub
    a claimer would replace it with (nothing is written here).

    Raises:
        StoreError: the store failed.
    """

    def one(inv: str) -> Record | None:
        try:
            return ops.read(inv)[0]
        except (NotFound, NewerRecord, InvalidArgument):
            return None
        except RecordError as e:
            with contextlib.suppress(ValueError):
                return corrupt_stub(ops.keys, inv, e, None, submitted_at=id_time(inv))
            return None

    with ThreadPoolExecutor(max(1, min(threads, len(ids)))) as pool:
        return [r for r in pool.map(one, ids) if r is not None]


@dataclass
class QueueStatus:
    queue: str
    queued: int = 0
    running: int = 0
    oldest_queued_s: float | None = None
    recent: Counter[str] = field(default_factory=Counter)
    recent_n: int = 0
    estimated: bool = False  # queued/running split from workers' signs of life

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "queued": self.queued,
            "running": self.running,
            "oldest_queued_s": self.oldest_queued_s,
            "estimated": self.estimated,
            "recent": {"invocations": self.recent_n, **dict(self.recent)},
        }


def live_ids(store: Store, keys: QueueKeys) -> list[str]:
    """The ids of the queue's live (queued or running) invocations, ascending: its tickets,
    one LIST page per 1000 of them, however many have finished.

    Raises:
        StoreError: the store failed.
    """
    return sorted(QueueKeys.id_of(info.key) for info in _live(store, keys))


def _live(
    store: Store,
    keys: QueueKeys,
    scanned: list[int] | None = None,
    limit: int | None = None,
    later: float | None = None,
) -> Iterator[ObjectInfo]:
    """The first ticket of each live invocation, as the tickets are listed: a rerun's ticket
    may sit beside an earlier life's stale one, and a name that is not an id is not
    lakeshore's. ``scanned`` counts the keys listed; listing stops once more than ``limit``
    were. A first life's ticket whose id's time is after ``later`` is passed over (a rerun's
    ticket of the same id, listed right after it, is not)."""
    seen: set[str] = set()
    for info in store.list(keys.tickets_prefix):
        if scanned is not None:
            scanned[0] += 1
            if limit is not None and scanned[0] > limit:
                return
        inv = QueueKeys.id_of(info.key)
        if (
            later is not None
            and QueueKeys.reruns_of(info.key) == 0
            and _is_id(inv)
            and id_time(inv) > later
        ):
            continue
        if inv not in seen and _is_id(inv):
            seen.add(inv)
            yield info


def live_tickets(
    store: Store, keys: QueueKeys, enough: int, due_by: float | None = None
) -> tuple[list[ObjectInfo], bool]:
    """The first ticket of each live invocation, and whether the listing stopped early
    (then take the count as *at least* ``enough``: a scaler needs no more). With
    ``due_by`` (store time), a delayed invocation that comes due well after it is left
    out: its id carries its due time, so this costs no read, and no worker is started for
    work that cannot run yet. Only a first life's ticket whose id lies ``ID_SLACK_S``
    beyond ``due_by`` is left out: a plain submit's id comes from its producer's own clock,
    which may run fast, and a rerun's ticket keeps the id of a life that was delayed.

    It stops at ``enough`` invocations, and also after ``2 × enough + 1000`` keys (at most
    ``MAX_SCAN``): a ticket name that is no id counts for nothing, but listing it costs, and
    planted names must not make a count endless.

    Raises:
        StoreError: the store failed.
    """
    found: list[ObjectInfo] = []
    scanned, limit = [0], min(2 * enough + 1000, MAX_SCAN)
    later = None if due_by is None else due_by + ID_SLACK_S
    for info in _live(store, keys, scanned, limit, later):
        found.append(info)
        if len(found) >= enough:
            return found, True
    return found, scanned[0] > limit


def queue_status(ops: QueueOps, now: float, recent: int = 100) -> QueueStatus:
    """Counts for one queue (see the module docstring for what each costs)."""
    st = QueueStatus(ops.keys.queue)
    live = live_ids(ops.store, ops.keys)
    oldest = None
    if len(live) <= EXACT_UP_TO:
        for r in records(ops, live):
            if r.state == State.RUNNING:
                st.running += 1
            elif r.state == State.QUEUED:
                st.queued += 1
                oldest = r.id if oldest is None or r.id < oldest else oldest
    else:
        st.estimated = True
        st.running = sum(
            int(w.get("running_by_queue", {}).get(ops.keys.queue, 0))
            for w in workers_seen(ops.store, ops.keys.ns, now)
        )
        st.queued = max(0, len(live) - st.running)
        oldest = live[0]
    if oldest is not None:
        with contextlib.suppress(ValueError):
            st.oldest_queued_s = max(0.0, now - id_time(oldest))
    if recent > 0:
        ids = []
        for inv in newest_ids(ops.store, ops.keys, None, now):
            ids.append(inv)
            if len(ids) >= recent:
                break
        recs = records(ops, ids)
        st.recent_n = len(recs)
        st.recent = Counter(r.state for r in recs)
    return st


@dataclass
class Page:
    """One page of a queue's invocations, newest first; ``next_before`` is the cursor of the
    next page (None: nothing older)."""

    records: list[Record]
    next_before: str | None


def list_invocations(
    ops: QueueOps,
    now: float,
    *,
    state: str | None = None,
    fn: str | None = None,
    before: str | None = None,
    limit: int = 20,
    max_read: int = 1000,
) -> Page:
    """The newest ``limit`` invocations older than ``before``, in ``state`` and of function
    ``fn`` when given. Live states read only the tickets (their cost does not grow with
    history); otherwise folders are listed backwards in time (see :func:`newest_ids`).
    At most ``max_read`` records are read: a filter that matches little returns a short
    page whose cursor goes on from the last invocation read, so no page costs more.

    Raises:
        StoreError: the store failed.
    """
    candidates: Iterator[str]
    if state in LIVE:
        live = reversed(live_ids(ops.store, ops.keys))
        candidates = (i for i in live if before is None or i < before)
    else:
        candidates = newest_ids(ops.store, ops.keys, before, now)
    found: list[Record] = []
    read, last, batch = 0, None, []
    exhausted = True
    for inv in candidates:
        batch.append(inv)
        if len(batch) < 64 and read + len(batch) < max_read:
            continue
        found += _matching(ops, batch, state, fn)
        read, last, batch = read + len(batch), batch[-1], []
        if len(found) >= limit or read >= max_read:
            exhausted = False
            break
    if batch:  # the listing ran out: nothing is left past it
        found += _matching(ops, batch, state, fn)
    found = sorted(found, key=lambda r: r.id, reverse=True)
    if len(found) > limit:
        return Page(found[:limit], found[limit - 1].id)
    if exhausted:
        return Page(found, None)
    return Page(found, found[-1].id if len(found) == limit else last)


def _matching(ops: QueueOps, ids: list[str], state: str | None, fn: str | None) -> list[Record]:
    return [
        r for r in records(ops, ids) if (not state or r.state == state) and (not fn or r.fn == fn)
    ]


def workers_seen(
    store: Store, ns: str, now: float, within_s: float = 300.0
) -> list[dict[str, Any]]:
    """Signs of life written in the last ``within_s`` seconds, newest first; each reduced to
    its well-formed fields (see :func:`read_sign_of_life`)."""
    seen = []
    for info in store.list(workers_prefix(ns)):
        try:
            data = read_sign_of_life(store.get(info.key, max_bytes=MAX_SMALL_BYTES)[0], info.key)
        except LakeshoreError:
            continue
        if data is not None and now - data["seen_at"] <= within_s:
            seen.append(data)
    return sorted(seen, key=lambda d: -float(d["seen_at"]))


def write_sign_of_life(store: Store, ns: str, worker: str, info: dict[str, Any]) -> None:
    """Write ``worker``'s sign of life (``_workers/<name>``), overwriting its last one: what
    ``status``, the dashboard, the scaler and other workers' lanes read (see
    :func:`read_sign_of_life` for its fields).

    Raises:
        LakeshoreError: the store failed (a sign of life is best effort: callers go on).
    """
    store.put(worker_key(ns, worker), codec.encode(info), OVERWRITE)


def read_sign_of_life(data: bytes, where: str = "sign of life") -> dict[str, Any] | None:
    """A worker's sign of life, keeping only the fields of the right type: ``seen_at``
    (a number, required: None without it), ``worker``, ``host``, ``status`` (str), ``pid``,
    ``running``, ``done``, ``failed`` (int >= 0; ``failed`` counts the attempts of ``done``
    whose body raised or timed out), ``queues`` (queue names) and ``running_by_queue``
    (queue name -> int >= 0).

    Raises:
        DecodeError: the bytes are not a lakeshore value.
    """
    obj = codec.decode(data, where)
    if type(obj) is not dict:
        return None
    seen_at: Any = obj.get("seen_at")
    if type(seen_at) not in (int, float) or not math.isfinite(seen_at):
        return None
    out: dict[str, Any] = {"seen_at": float(seen_at)}
    for name in ("worker", "host", "status"):
        if type(obj.get(name)) is str:
            out[name] = obj[name]
    for name in ("pid", "running", "done", "failed"):
        if type(obj.get(name)) is int and obj[name] >= 0:
            out[name] = obj[name]
    queues = obj.get("queues")
    if type(queues) is list:
        out["queues"] = [name for name in queues if is_name(name)]
    by_queue = obj.get("running_by_queue")
    if type(by_queue) is dict:
        out["running_by_queue"] = {
            name: n for name, n in by_queue.items() if is_name(name) and type(n) is int and n >= 0
        }
    return out


def summary(r: Record) -> dict[str, Any]:
    """One line of a listing (``lakeshore ls --json``, the dashboard's queue page)."""
    return {
        "id": r.id,
        "state": r.state,
        "attempt": r.attempt,
        "fn": r.fn,
        "submitted_at": r.submitted_at,
        "finished_at": r.finished_at,
        "not_before": r.not_before,
    }
