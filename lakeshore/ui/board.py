"""What the dashboard shows, read by one poller and cached: the cost of looking.

However many tabs are open, the store sees one reader:

* **The overview** is refreshed by the board's own thread every ``interval_s`` and served
  from memory; when no page asked for it in ``IDLE_AFTER_S``, the thread sleeps until one
  does. A round lists each queue's tickets (one LIST per 1000 live invocations) and
  the workers' signs of life, and reads the records of the first ``RECORD_READS`` tickets
  in claim order (those the next claims take) for the state; a record found running is
  remembered until its ticket changes (leaving ``running`` rewrites or deletes it) or a
  minute passed. Past that many, the split of the rest is taken from what the workers'
  signs of life say they run (and the counts are marked estimated).
  A sign of life is read again only when its etag changed. Names of namespaces and queues,
  queue records and providers are read every ``discover_s``. Finished history is never
  listed: throughput is the number of invocations that left the tickets between rounds.
* **A queue's page and an invocation's page** are read when a page asks, at most once per
  ``interval_s`` (a queue) or ``live_s`` (an invocation) for all tabs together, and at
  most ``max_reads_per_min`` such reads a minute in all; past that budget a page gets the
  copy it had (marked stale) or is asked to come back.

Everything here is data for the page (JSON-able), never markup: the page builds text nodes
from it (see ``static/app.js``). Values of arguments, results and frames are decoded by the
codec (no pickle, bounded) and shown as a ``repr`` clipped to ``MAX_SHOWN`` characters.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lakeshore import codec
from lakeshore.errors import (
    DecodeError,
    InvalidArgument,
    LakeshoreError,
    NewerRecord,
    NotFound,
    RecordError,
    StoreError,
    TooLarge,
)
from lakeshore.keys import (
    QueueKeys,
    check_id,
    check_name,
    id_index,
    is_name,
    namespace_prefix,
    namespaces_prefix,
    workers_prefix,
)
from lakeshore.model.record import Blob, Record
from lakeshore.protocol.census import (
    folder_names,
    id_time,
    list_invocations,
    live_tickets,
    read_sign_of_life,
    summary,
)
from lakeshore.protocol.queue_record import QueueSettings
from lakeshore.protocol.steps import MARKER_MAX, MAX_SMALL_BYTES, QueueOps, corrupt_stub
from lakeshore.store.base import ObjectInfo, Store

__all__ = ["BUSY", "IDLE_AFTER_S", "MAX_SHOWN", "RECORD_READS", "Board"]

log = logging.getLogger("lakeshore.ui")

RECORD_READS = 32  # records a round reads per queue (the first tickets: the next claimed)
MAX_SHOWN = 4096  # characters of a value's repr on a page
MAX_VIEWS = 256  # pages kept in memory (the least recently read go first)
MAX_FRAMES = 1000  # frames an invocation's page keeps (the newest)
MAX_LOG_CHARS = 256 * 1024  # characters of log output an invocation's page keeps (the tail)
MAX_DOWNLOAD = 256 * 1024 * 1024  # bytes of a spilled value the download link serves
SERIES_POINTS = 180  # points of the throughput/depth chart (15 minutes at 5 s)
IDLE_AFTER_S = 60.0  # the poller sleeps when no page asked for the overview this long
_RUNNING_TRUSTED_S = 60.0  # a remembered "running" verdict is read again after this
_LIVE_LIMIT = 100_000  # tickets a round lists per queue at most
_WORKERS_WITHIN_S = 300.0


# what a page gets when the board has read as much as it may this minute and holds no copy
BUSY = {"busy": True, "error": "ui: the dashboard read its budget of the store this minute — wait"}


@dataclass
class _Verdict:
    etag: str
    state: str  # "queued" or "running"
    at: float


@dataclass
class _QueueWatch:
    """What the board remembers of one queue between rounds."""

    ops: QueueOps
    verdicts: dict[str, _Verdict] = field(default_factory=dict)  # ticket key -> verdict
    live: set[str] | None = None  # ids live at the last round
    series: deque[list[float]] = field(default_factory=lambda: deque(maxlen=SERIES_POINTS))
    config: dict[str, Any] | None = None
    config_error: str | None = None
    counts: dict[str, Any] = field(default_factory=dict)


@dataclass
class _View:
    data: dict[str, Any]
    at: float


@dataclass
class _Following:
    """An invocation's stream and logs as read so far (shared by every tab showing it)."""

    attempt: int = 0
    frames: list[dict[str, Any]] = field(default_factory=list)
    journal_after: str | None = None
    logs: list[dict[str, Any]] = field(default_factory=list)  # {attempt, text}
    logs_after: str | None = None
    first_seq: int = 0  # seq of frames[0] (older ones were let go)


class Board:
    """The dashboard's reader of one store (``namespaces``: those to show; None: every
    namespace found in the store).

    Raises:
        InvalidArgument: a bad namespace name or interval.
    """

    def __init__(
        self,
        store: Store,
        namespaces: list[str] | None = None,
        *,
        interval_s: float = 5.0,
        live_s: float = 1.0,
        discover_s: float = 60.0,
        max_reads_per_min: int = 240,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (interval_s > 0 and live_s > 0 and discover_s > 0 and max_reads_per_min > 0):
            raise InvalidArgument(
                "ui", "the intervals and the read budget must be positive", "e.g. interval 5"
            )
        self.store = store
        self.fixed = [check_name(n, "namespace") for n in namespaces] if namespaces else None
        self.interval_s, self.live_s, self.discover_s = interval_s, live_s, discover_s
        self.max_reads_per_min = max_reads_per_min
        self.monotonic = monotonic
        self._lock = threading.RLock()  # the board's state
        self._reading = threading.Lock()  # the views, their locks, the budget, the followed
        self._view_locks: dict[tuple[Any, ...], threading.Lock] = {}
        self._queues: dict[tuple[str, str], _QueueWatch] = {}
        self._signs: dict[str, tuple[str, dict[str, Any] | None]] = {}  # key -> (etag, data)
        self._names: list[tuple[str, list[str]]] = []
        self._discovered_at: float | None = None
        self._overview: dict[str, Any] = {"namespaces": [], "at": None, "error": None}
        self._views: dict[tuple[Any, ...], _View] = {}
        self._following: dict[tuple[str, str], _Following] = {}
        self._where: dict[tuple[str, str], str] = {}  # (ns, id) -> queue: ids never move
        self._reads: deque[float] = deque()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._asked_at: float | None = None  # when a page last asked for the overview
        self._round_at: float | None = None
        self.rounds = 0

    # -- the poller ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the poller thread (one round at once, then every ``interval_s``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="lakeshore-ui", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        """A round every ``interval_s`` while a page watches; none once no page asked for
        ``IDLE_AFTER_S`` (nobody looking costs nothing), until one asks again."""
        while not self._stop.is_set():
            asked = self._asked_at
            if self.rounds == 0 or (asked is not None and self.monotonic() - asked < IDLE_AFTER_S):
                self.poll()
                self._wake.wait(self.interval_s)
            else:
                self._wake.wait()
            self._wake.clear()

    def watched(self) -> bool:
        """Whether the poller has a round to do: the first, or a page asked lately."""
        asked = self._asked_at
        return self.rounds == 0 or (asked is not None and self.monotonic() - asked < IDLE_AFTER_S)

    def poll(self) -> None:
        """One round of the overview (the poller calls it; tests call it directly)."""
        now_m = self.monotonic()
        try:
            now = self.store.now()
            if self._discovered_at is None or now_m - self._discovered_at >= self.discover_s:
                self._discover()
                self._discovered_at = now_m
            namespaces = []
            for ns, queues in self._names:
                workers = self._workers(ns, now)
                rows = [self._count(self._watch(ns, q), now, workers) for q in queues]
                namespaces.append({"ns": ns, "queues": rows, "workers": workers})
            overview = {"namespaces": namespaces, "at": now, "error": None}
        except LakeshoreError as e:
            log.warning("ui: a round of the overview failed: %s", e)
            overview = {**self._overview, "error": str(e)}
        with self._lock:
            self._overview = overview
            self.rounds += 1

    def overview(self) -> dict[str, Any]:
        """The last round's overview (nothing is read here: a sleeping poller is woken)."""
        now = self.monotonic()
        idle = self._asked_at is None or now - self._asked_at >= IDLE_AFTER_S
        self._asked_at = now
        if idle:
            self._wake.set()
        with self._lock:
            return {
                **self._overview,
                "interval_s": self.interval_s,
                "rounds": self.rounds,
            }

    def _discover(self) -> None:
        if self.fixed is not None:
            spaces = list(self.fixed)
        else:
            spaces = [n for n in folder_names(self.store, namespaces_prefix()) if is_name(n)]
            spaces = spaces or ["default"]
        names = []
        for ns in spaces:
            found = folder_names(self.store, namespace_prefix(ns))
            queues = sorted({q for q in found if not q.startswith("_") and is_name(q)})
            names.append((ns, queues or ["default"]))
            for q in queues:
                self._read_config(self._watch(ns, q))
        self._names = names

    def _watch(self, ns: str, queue: str) -> _QueueWatch:
        key = (ns, queue)
        with self._lock:
            watch = self._queues.get(key)
            if watch is None:
                watch = _QueueWatch(QueueOps(self.store, QueueKeys(ns, queue)))
                self._queues[key] = watch
            return watch

    def _read_config(self, watch: _QueueWatch) -> None:
        keys = watch.ops.keys
        try:
            cfg, _ = QueueSettings(self.store, keys.ns).read(keys.queue)
            watch.config, watch.config_error = cfg.public(), None
        except RecordError as e:
            watch.config, watch.config_error = None, str(e)

    def _workers(self, ns: str, now: float) -> list[dict[str, Any]]:
        """Signs of life of the last 5 minutes; a sign is read again only when it changed."""
        seen = []
        prefix = workers_prefix(ns)
        listed = set()
        for info in self.store.list(prefix):
            listed.add(info.key)
            hit = self._signs.get(info.key)
            if hit is None or hit[0] != info.etag:
                try:
                    data, etag = self.store.get(info.key, max_bytes=MAX_SMALL_BYTES)
                    hit = (etag, read_sign_of_life(data, info.key))
                except (NotFound, TooLarge, DecodeError):  # gone, or not a sign of life
                    hit = (info.etag, None)
                self._signs[info.key] = hit
            sign = hit[1]
            if sign is not None and now - sign["seen_at"] <= _WORKERS_WITHIN_S:
                seen.append({**sign, "age_s": max(0.0, now - sign["seen_at"])})
        for key in [k for k in self._signs if k.startswith(prefix) and k not in listed]:
            del self._signs[key]
        return sorted(seen, key=lambda d: -float(d["seen_at"]))

    def _count(
        self, watch: _QueueWatch, now: float, workers: list[dict[str, Any]]
    ) -> dict[str, Any]:
        ops = watch.ops
        tickets, cut = live_tickets(self.store, ops.keys, _LIVE_LIMIT)
        queued = running = unknown = 0
        reads = 0
        oldest: str | None = None
        ids = set()
        verdicts: dict[str, _Verdict] = {}
        for info in tickets:
            inv = QueueKeys.id_of(info.key)
            ids.add(inv)
            state, reads = self._state(watch, info, now, reads, verdicts)
            if state == "running":
                running += 1
            elif state == "queued":
                queued += 1
                oldest = inv if oldest is None or inv < oldest else oldest
            elif state == "?":
                unknown += 1
        watch.verdicts = verdicts
        estimated = cut or unknown > 0
        if unknown:  # split what could not be read this round by the workers' own counts
            said = sum(
                int(w.get("running_by_queue", {}).get(ops.keys.queue, 0))
                for w in workers
                if w.get("status") != "stopped"
            )
            extra = min(unknown, max(0, said - running))
            running += extra
            queued += unknown - extra
        left = len(watch.live - ids) if watch.live is not None else 0
        arrived = len(ids - watch.live) if watch.live is not None else 0
        watch.live = ids
        watch.series.append([round(now, 3), len(ids), queued, running, left, arrived])
        oldest_s = None
        if oldest is not None:
            with contextlib.suppress(ValueError):
                oldest_s = max(0.0, now - id_time(oldest))
        return {
            "queue": ops.keys.queue,
            "queued": queued,
            "running": running,
            "live": len(ids),
            "estimated": estimated,
            "oldest_queued_s": oldest_s,
            "config": watch.config,
            "config_error": watch.config_error,
            "series": list(watch.series),
        }

    def _state(
        self,
        watch: _QueueWatch,
        info: ObjectInfo,
        now: float,
        reads: int,
        verdicts: dict[str, _Verdict],
    ) -> tuple[str, int]:
        """The state of one live ticket's invocation: ``queued``, ``running``, ``gone``
        (its record says it is over: a stale ticket) or ``?`` (not read this round).

        A ticket does not say whether its invocation runs (the first claim leaves it as it
        is), so the record is read; one found running is remembered by the ticket's etag,
        since leaving ``running`` rewrites the ticket (back to queued) or deletes it (over),
        for a minute at most (a ticket whose deletion was lost in a crash)."""
        known = watch.verdicts.get(info.key)
        if known and known.etag == info.etag and now - known.at < _RUNNING_TRUSTED_S:
            verdicts[info.key] = known
            return known.state, reads
        if reads >= RECORD_READS:
            return "?", reads
        inv = QueueKeys.id_of(info.key)
        try:
            rec = watch.ops.read_record(inv)[0]
        except NotFound:
            # nothing moved it yet (a full ticket), or an orphaned marker a claimer drops
            return ("queued" if info.size > MARKER_MAX else "gone"), reads + 1
        except RecordError:
            return "?", reads + 1  # corrupt (a claimer fails it) or newer: not counted here
        if rec.state == "running":
            verdicts[info.key] = _Verdict(info.etag, "running", now)
        return (rec.state if rec.state in ("queued", "running") else "gone"), reads + 1

    # -- pages read on demand --------------------------------------------------------------

    def _spend(self) -> bool:
        """Take one read from this minute's budget (False: none left)."""
        now = self.monotonic()
        while self._reads and now - self._reads[0] >= 60.0:
            self._reads.popleft()
        if len(self._reads) >= self.max_reads_per_min:
            return False
        self._reads.append(now)
        return True

    def _cached(
        self, key: tuple[Any, ...], max_age: float, read: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """A view no older than ``max_age``, read at most once for all askers: tabs asking
        for one view wait for one read; other views are read meanwhile (a slow request
        holds up only the view that made it)."""
        with self._reading:
            view = self._views.get(key)
            if view is not None and self.monotonic() - view.at < max_age:
                return view.data
            lock = self._view_locks.setdefault(key, threading.Lock())
        with lock:
            with self._reading:
                view = self._views.get(key)
                if view is not None and self.monotonic() - view.at < max_age:
                    return view.data  # read by the tab this one waited for
                if not self._spend():
                    return {**view.data, "stale": True} if view is not None else dict(BUSY)
            data = read()
            with self._reading:
                self._views[key] = _View(data, self.monotonic())
                if len(self._views) > MAX_VIEWS:  # forget the views nobody asked for lately
                    oldest = sorted(self._views.items(), key=lambda kv: kv[1].at)
                    for k, _ in oldest[: MAX_VIEWS // 2]:
                        self._views.pop(k, None)
                        self._view_locks.pop(k, None)
            return data

    def queue_page(
        self,
        ns: str,
        queue: str,
        *,
        state: str | None = None,
        fn: str | None = None,
        before: str | None = None,
        limit: int = 25,
    ) -> dict[str, Any]:
        """One page of a queue's invocations, newest first (``list_invocations``'s cost).

        Raises:
            InvalidArgument: a bad name, state, id or limit.
            StoreError: the store failed.
        """
        from lakeshore.model.record import STATES

        keys = QueueKeys(ns, queue)
        if state and state not in STATES:
            raise InvalidArgument("ui", f"unknown state {state[:40]!r}", f"one of {STATES}")
        if before:
            before = check_id(before)
        if not 1 <= limit <= 200:
            raise InvalidArgument("ui", "limit must be 1..200", "e.g. 25")
        fn = fn[:1024] if fn else None

        def read() -> dict[str, Any]:
            ops = QueueOps(self.store, keys)
            now = self.store.now()
            page = list_invocations(ops, now, state=state, fn=fn, before=before, limit=limit)
            return {
                "ns": ns,
                "queue": queue,
                "at": now,
                "invocations": [summary(r) for r in page.records],
                "next_before": page.next_before,
            }

        return self._cached(("queue", ns, queue, state, fn, before, limit), self.interval_s, read)

    def forget(self, ns: str, inv: str) -> None:
        """Drop the cached copy of an invocation (an action changed it)."""
        with self._reading:
            self._views.pop(("inv", ns, inv), None)

    def invocation(self, ns: str, inv: str) -> dict[str, Any]:
        """An invocation: the record field by field, its attempts, error, values, and the
        stream's and logs' state (frames come from :meth:`frames`).

        Raises:
            InvalidArgument: a bad name or id. NotFound: no such invocation.
            StoreError: the store failed.
        """
        check_name(ns, "namespace")
        inv = check_id(inv)
        return self._cached(("inv", ns, inv), self.live_s, lambda: self._read_invocation(ns, inv))

    def _locate(self, ns: str, inv: str) -> tuple[QueueOps, Record]:
        """Find an invocation's queue: the id index, then every queue of the namespace."""
        found = self._where.get((ns, inv))
        if found is not None:
            ops = QueueOps(self.store, QueueKeys(ns, found))
            with contextlib.suppress(NotFound):  # gc'd since: look again
                return ops, self._read(ops, inv)
        queues = ["default"]
        try:
            raw = self.store.get(id_index(ns, inv), max_bytes=MAX_SMALL_BYTES)[0]
            named = raw.decode("utf-8", "replace")
            if is_name(named):
                queues.insert(0, named)
        except NotFound:
            pass
        for ns_name, known in self._names:
            if ns_name == ns:
                queues += known
        for queue in dict.fromkeys(queues):
            ops = QueueOps(self.store, QueueKeys(ns, queue))
            try:
                rec = self._read(ops, inv)
            except NotFound:
                continue
            if len(self._where) > 10_000:
                self._where.clear()
            self._where[(ns, inv)] = queue
            return ops, rec
        raise NotFound(
            f"ui {inv}",
            f"no invocation with this id in namespace {ns!r}",
            "check the id and the namespace",
        )

    @staticmethod
    def _read(ops: QueueOps, inv: str) -> Record:
        """The record; a corrupt one as the failed stub a claimer would write instead.

        Raises:
            NotFound: not in this queue. NewerRecord: written by a newer lakeshore.
        """
        try:
            return ops.read(inv)[0]
        except NewerRecord:
            raise
        except RecordError as e:
            return corrupt_stub(ops.keys, inv, e, None, submitted_at=id_time(inv))

    def _read_invocation(self, ns: str, inv: str) -> dict[str, Any]:
        ops, rec = self._locate(ns, inv)
        follow = self._follow(ops, rec)
        return {
            "ns": ns,
            "at": self.store.now(),
            "record": _fields(rec),
            "history": [list(t) for t in rec.history],
            "error": rec.error,
            "args": self._value(ops, rec.args, "args"),
            "result": self._value(ops, rec.result, "result") if rec.result else None,
            "stream": {
                "attempt": follow.attempt,
                "first_seq": follow.first_seq,
                "count": follow.first_seq + len(follow.frames),
            },
            "logs": follow.logs[-50:],
        }

    def _value(self, ops: QueueOps, blob: Blob, what: str) -> dict[str, Any]:
        """A value for the page: its repr (clipped) when small enough to read, and whether
        it was spilled (then the page offers a download)."""
        out: dict[str, Any] = {"spilled": blob.ref is not None, "size": _size(blob)}
        if blob.ref is not None and blob.size > 1 << 20:
            out["shown"] = None
            return out
        try:
            data = ops.get_blob(blob, what, MAX_DOWNLOAD) if self._owned(ops, blob) else None
            out["shown"] = _shown(codec.decode(data, what)) if data is not None else None
            if data is None:
                out["problem"] = "the record points outside its invocation: not read"
        except LakeshoreError as e:
            out["shown"], out["problem"] = None, str(e)
        return out

    @staticmethod
    def _owned(ops: QueueOps, blob: Blob) -> bool:
        """A spilled value lives in its invocation's folder: a record naming any other key
        (another namespace, another bucket folder) is not followed."""
        if blob.ref is None:
            return True
        return (
            blob.ref.startswith(ops.keys.ids_prefix) and "/" in blob.ref[len(ops.keys.ids_prefix) :]
        )

    def download(self, ns: str, inv: str, what: str) -> tuple[bytes, str] | None:
        """The encoded bytes of an invocation's arguments or result, and a file name (None:
        no reads left this minute).

        Raises:
            InvalidArgument: a bad name, id or ``what``. NotFound: no such value.
            StoreError: the store failed, or the object is not its own.
        """
        check_name(ns, "namespace")
        inv = check_id(inv)
        if what not in ("args", "result"):
            raise InvalidArgument("ui", "download args or result", "what=args|result")
        with self._reading:
            if not self._spend():
                return None
        ops, rec = self._locate(ns, inv)
        blob = rec.args if what == "args" else rec.result
        if blob is None:
            raise NotFound(f"ui {inv}", f"the invocation has no {what}", "it has not finished")
        expected = ops.keys.args(inv) if what == "args" else ops.keys.result(inv, rec.attempt)
        if blob.ref is not None and blob.ref != expected:
            raise StoreError(
                f"ui {inv}", "the record names a value outside its invocation", "inspect it"
            )
        data = ops.get_blob(blob, what, MAX_DOWNLOAD)
        return data, f"{inv}-{what}.msgpack"

    # -- stream and logs -------------------------------------------------------------------

    def _follow(self, ops: QueueOps, rec: Record) -> _Following:
        """Read what the journal and logs of the invocation gained since the last read."""
        from lakeshore.running.logs import read_logs
        from lakeshore.streams.journal import VALUE, read_segments

        key = (ops.keys.ns, rec.id)
        with self._reading:
            f = self._following.get(key)
            if f is None or f.attempt != rec.attempt:
                f = _Following(attempt=rec.attempt)
                if len(self._following) > 64:
                    self._following.pop(next(iter(self._following)))
                self._following[key] = f
        if rec.attempt > 0:
            try:
                for seg_key, _, first, frames in read_segments(
                    self.store, ops.keys.journal_prefix(rec.id, rec.attempt), f.journal_after
                ):
                    f.journal_after = seg_key
                    for i, (tag, payload) in enumerate(frames):
                        if tag != VALUE:
                            continue
                        f.frames.append({"seq": first + i, "value": _shown_bytes(payload)})
            except LakeshoreError as e:
                f.frames.append({"seq": -1, "value": f"(unreadable journal: {e})"})
                f.journal_after = "\uffff"  # read no further: the page says why
            if len(f.frames) > MAX_FRAMES:
                drop = len(f.frames) - MAX_FRAMES
                del f.frames[:drop]
                f.first_seq += drop
        try:
            for seg_key, att, text in read_logs(
                self.store, ops.keys, rec.id, None, f.logs_after or ""
            ):
                f.logs_after = seg_key
                if f.logs and f.logs[-1]["attempt"] == att:
                    f.logs[-1]["text"] = (f.logs[-1]["text"] + text)[-MAX_LOG_CHARS:]
                else:
                    f.logs.append({"attempt": att, "text": text[-MAX_LOG_CHARS:]})
        except LakeshoreError as e:
            f.logs.append({"attempt": rec.attempt, "text": f"(unreadable logs: {e})"})
            f.logs_after = "\uffff"
        return f

    def frames(self, ns: str, inv: str, after: int) -> dict[str, Any]:
        """The frames of the invocation's current attempt with seq > ``after`` (the page's
        cursor: it resumes where it stopped), and the state the stream is in.

        Raises:
            InvalidArgument: a bad name or id. NotFound: no such invocation.
            StoreError: the store failed.
        """
        data = self.invocation(ns, inv)  # refreshes the shared copy at most every live_s
        if data.get("busy"):
            return data
        with self._reading:
            f = self._following.get((ns, check_id(inv)))
            lock = self._view_locks.get(("inv", ns, check_id(inv)))
        with lock or threading.Lock():  # not while the view's read appends to it
            frames = [x for x in (f.frames if f else []) if x["seq"] > after]
        return {
            "attempt": data["stream"]["attempt"],
            "state": data["record"]["state"],
            "frames": frames[:500],
        }


def _size(blob: Blob) -> int:
    return blob.size if blob.ref is not None else len(blob.inline or b"")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + f"… ({len(text)} characters)"


def _shown_bytes(payload: bytes) -> str:
    try:
        return _shown(codec.decode(payload, "frame"))
    except LakeshoreError as e:
        return f"(undecodable frame: {e})"


def _fields(r: Record) -> dict[str, Any]:
    """The record field by field, as the page shows it (bytes and blobs summarised)."""
    return {
        "id": r.id,
        "ns": r.ns,
        "queue": r.queue,
        "fn": r.fn,
        "state": r.state,
        "attempt": r.attempt,
        "max_attempts": r.max_attempts,
        "released": r.released,
        "reruns": r.reruns,
        "priority": r.priority,
        "key": r.key,
        "prefix": r.prefix,
        "submitted_at": r.submitted_at,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "not_before": r.not_before,
        "deadline_at": r.deadline_at,
        "timeout_s": r.timeout_s,
        "lease_s": r.lease_s,
        "lease": (
            {"worker": r.lease.worker, "expires_at": r.lease.expires_at} if r.lease else None
        ),
        "journal": r.journal,
        "slot": r.slot,
        "pickled": r.fn_pickle is not None,
        "rev": r.rev,
    }
