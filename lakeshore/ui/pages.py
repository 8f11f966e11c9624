"""The dashboard's pages read on demand: a queue's invocations, an invocation, a download.

Every tab showing one page shares one read: a page is read at most once per ``interval_s``
(a queue), ``live_s`` (a live invocation) or ``DONE_S`` (a finished one, which only a
retry changes). The reads go through a store that counts each request against a budget of
``max_requests_per_min``: past it, a page gets its last copy marked stale, or ``BUSY``.
That store refuses writes: nothing the pages read can change the store.

What a page shows is data (JSON-able), never markup. Values are decoded by the codec (no
pickle, bounded) and shown as a clipped ``repr``; a spilled value is read only from its own
invocation's key, and its shown form is kept by (key, sha256): it never changes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lakeshore import codec
from lakeshore.errors import (
    InvalidArgument,
    LakeshoreError,
    NewerRecord,
    NotFound,
    PermissionDenied,
    RecordError,
    StoreError,
    StoreUnavailable,
)
from lakeshore.keys import QueueKeys, check_id, check_name, id_index, id_time, is_name
from lakeshore.model.dependencies import parents_line
from lakeshore.model.record import STATES, TERMINAL, Blob, Record
from lakeshore.protocol.census import list_invocations, summary
from lakeshore.protocol.steps import MAX_SMALL_BYTES, QueueOps, corrupt_stub
from lakeshore.store.base import OVERWRITE, ObjectInfo, PutMode, Store
from lakeshore.ui.following import MAX_SEGMENT_READ, Following, shown

__all__ = ["BUSY", "DONE_S", "MAX_DOWNLOAD", "Budget", "Metered", "Pages"]

DONE_S = 30.0  # a finished invocation's page is read again after this (a retry changes it)
MAX_DOWNLOAD = 256 * 1024 * 1024  # bytes of a value the download link serves
MAX_VALUE_SHOWN = 1 << 20  # a spilled value larger than this is offered for download only
MAX_VIEWS = 256  # pages kept in memory (the least recently read go first)
MAX_FOLLOWED = 64  # invocations whose stream and logs are kept (the least recently read go)
# what a page gets when the minute's budget is spent and no copy is at hand
BUSY = {"busy": True, "error": "ui: the dashboard read its budget of the store this minute — wait"}


class Budget:
    """Store requests in the last minute, against a maximum."""

    def __init__(self, per_min: int, monotonic: Callable[[], float]) -> None:
        self.per_min = per_min
        self.monotonic = monotonic
        self._spent: deque[float] = deque()
        self._lock = threading.Lock()

    def _trim(self, now: float) -> None:
        while self._spent and now - self._spent[0] >= 60.0:
            self._spent.popleft()

    def left(self) -> bool:
        with self._lock:
            self._trim(self.monotonic())
            return len(self._spent) < self.per_min

    def spend(self, n: int = 1) -> None:
        with self._lock:
            now = self.monotonic()
            self._trim(now)
            self._spent.extend([now] * n)

    def spent(self) -> int:
        with self._lock:
            self._trim(self.monotonic())
            return len(self._spent)


class Metered(Store):
    """The store as the pages read it: every request counted against ``budget``, and
    refused once it is spent (reads running side by side cannot overshoot it together);
    writes refused (the pages only read).

    Raises:
        StoreUnavailable: the budget is spent (``spent`` says so).
    """

    def __init__(self, inner: Store, budget: Budget) -> None:
        self.inner, self.url, self.budget = inner, inner.url, budget

    def _spend(self, op: str) -> None:
        if not self.budget.left():
            raise StoreUnavailable(op, "the dashboard spent its requests of this minute", "wait")
        self.budget.spend()

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self._spend("get")
        return self.inner.get(key, max_bytes)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        self._spend("list")
        for n, info in enumerate(self.inner.list(prefix, start_after), 1):
            if n % 1000 == 0:
                self._spend("list")  # the next page
            yield info

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        raise PermissionDenied("ui", f"the dashboard does not write ({key})", "")

    def delete(self, key: str, if_match: str | None = None) -> None:
        raise PermissionDenied("ui", f"the dashboard does not delete ({key})", "")

    def delete_many(self, keys: Sequence[str]) -> None:
        raise PermissionDenied("ui", "the dashboard does not delete", "")

    def now(self) -> float:
        return self.inner.now()


@dataclass
class _View:
    data: dict[str, Any]
    at: float


class Pages:
    """The pages of one store, read on demand (``namespaces``: the only ones shown; None:
    every one; no journal or log segment over ``max_segment_bytes`` is fetched)."""

    def __init__(
        self,
        store: Store,
        namespaces: list[str] | None,
        *,
        interval_s: float,
        live_s: float,
        max_requests_per_min: int,
        max_segment_bytes: int = MAX_SEGMENT_READ,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_segment_bytes = max_segment_bytes
        self.budget = Budget(max_requests_per_min, monotonic)
        self.store = Metered(store, self.budget)
        self.namespaces = namespaces
        self.interval_s, self.live_s = interval_s, live_s
        self.monotonic = monotonic
        self._lock = threading.Lock()  # the dicts below
        self._stripes = [threading.Lock() for _ in range(32)]  # one read of a page at a time
        self._views: OrderedDict[tuple[Any, ...], _View] = OrderedDict()
        self._following: OrderedDict[tuple[str, str], Following] = OrderedDict()
        self._values: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._where: dict[tuple[str, str], str] = {}  # (ns, id) -> queue: ids never move

    # -- caching --------------------------------------------------------------------------

    def _cached(
        self,
        key: tuple[Any, ...],
        max_age: Callable[[dict[str, Any]], float],
        read: Callable[[], dict[str, Any]],
    ) -> dict[str, Any]:
        """The page ``key``, no older than ``max_age(page)``, read at most once for every
        tab asking; other pages are read meanwhile (a slow read holds up its stripe)."""

        def fresh() -> dict[str, Any] | None:
            with self._lock:
                view = self._views.get(key)
                if view is not None and self.monotonic() - view.at < max_age(view.data):
                    self._views.move_to_end(key)
                    return view.data
                return None

        hit = fresh()
        if hit is not None:
            return hit
        with self._stripe(key):
            hit = fresh()  # read by the tab this one waited for
            if hit is not None:
                return hit
            if self.budget.left():
                try:
                    data = read()
                except StoreUnavailable:
                    if self.budget.left():
                        raise  # the store's own trouble, not the budget
                    data = None
            else:
                data = None
            if data is None:  # the budget is spent: what this tab saw last, or come back
                with self._lock:
                    view = self._views.get(key)
                return {**view.data, "stale": True} if view is not None else dict(BUSY)
            with self._lock:
                self._views[key] = _View(data, self.monotonic())
                self._views.move_to_end(key)
                while len(self._views) > MAX_VIEWS:
                    self._views.popitem(last=False)
            return data

    def _shown(self, ns: str) -> str:
        """``ns``, when this dashboard shows it.

        Raises:
            InvalidArgument: not a namespace name. NotFound: a namespace not shown here.
        """
        check_name(ns, "namespace")
        if self.namespaces is not None and ns not in self.namespaces:
            raise NotFound("ui", f"namespace {ns!r} is not shown here", "see the overview")
        return ns

    def _stripe(self, key: tuple[Any, ...]) -> threading.Lock:
        return self._stripes[hash(key) % len(self._stripes)]

    def forget(self, ns: str, inv: str) -> None:
        """Drop the copy of an invocation's page (an action changed it)."""
        with self._lock:
            self._views.pop(("inv", ns, inv), None)

    # -- a queue ---------------------------------------------------------------------------

    def queue(
        self,
        ns: str,
        queue: str,
        *,
        state: str | None = None,
        fn: str | None = None,
        before: str | None = None,
        limit: int = 25,
    ) -> dict[str, Any]:
        """One page of a queue's invocations, newest first: ``list_invocations``, reading
        at most ``4 × limit`` records (a short page then says where to go on).

        Raises:
            InvalidArgument: a bad name, state, id or limit. StoreError: the store failed.
        """
        keys = QueueKeys(self._shown(ns), queue)
        if state and state not in STATES:
            raise InvalidArgument("ui", f"unknown state {state[:40]!r}", f"one of {STATES}")
        if before:
            before = check_id(before)
        if not 1 <= limit <= 200:
            raise InvalidArgument("ui", "limit must be 1..200", "e.g. 25")
        fn = fn[:1024] if fn else None

        def read() -> dict[str, Any]:
            now = self.store.now()
            page = list_invocations(
                QueueOps(self.store, keys),
                now,
                state=state,
                fn=fn,
                before=before,
                limit=limit,
                max_read=4 * limit,
            )
            return {
                "ns": ns,
                "queue": queue,
                "at": now,
                "invocations": [summary(r) for r in page.records],
                "next_before": page.next_before,
            }

        key = ("queue", ns, queue, state, fn, before, limit)
        return self._cached(key, lambda _: self.interval_s, read)

    # -- an invocation ---------------------------------------------------------------------

    def invocation(self, ns: str, inv: str) -> dict[str, Any]:
        """An invocation: the record field by field, its attempts, error, values, and its
        stream's and logs' state (the frames come from :meth:`frames`).

        Raises:
            InvalidArgument: a bad name or id. NotFound: no such invocation.
            StoreError: the store failed.
        """
        self._shown(ns)
        inv = check_id(inv)

        def read() -> dict[str, Any]:
            try:
                return self._read(ns, inv)
            except NotFound as e:  # kept like a page: asking again costs nothing for a while
                return {"missing": str(e)}

        def age(page: dict[str, Any]) -> float:
            if "missing" in page:
                return self.interval_s
            return DONE_S if page.get("record", {}).get("state") in TERMINAL else self.live_s

        page = self._cached(("inv", ns, inv), age, read)
        if "missing" in page:
            raise NotFound(f"ui {inv}", page["missing"], "check the id and the namespace")
        return page

    def _read(self, ns: str, inv: str) -> dict[str, Any]:
        ops, rec = self._locate(ns, inv)
        key = (ns, inv)
        with self._lock:
            f = self._following.get(key)
            if f is None or f.attempt != rec.attempt:
                f = self._following[key] = Following(rec.attempt, self.max_segment_bytes)
            self._following.move_to_end(key)
            while len(self._following) > MAX_FOLLOWED:
                self._following.popitem(last=False)
        f.read(self.store, ops, rec)
        return {
            "ns": ns,
            "at": self.store.now(),
            "record": _fields(rec),
            "history": [list(t) for t in rec.history],
            "error": rec.error,
            "args": self._value(ops, rec, "args"),
            "result": self._value(ops, rec, "result") if rec.result else None,
            "stream": {"attempt": f.attempt, "problem": f.journal_problem},
            "logs": list(f.logs),
            "logs_problem": f.logs_problem,
        }

    def frames(self, ns: str, inv: str, after: int) -> dict[str, Any]:
        """The frames of the invocation's current attempt with seq > ``after`` (the page's
        cursor: it resumes where it stopped), and the stream's state.

        Raises:
            InvalidArgument: a bad name or id. NotFound: no such invocation.
            StoreError: the store failed.
        """
        page = self.invocation(ns, inv)  # brings the shared copy up to date (at most once)
        if page.get("busy"):
            return page
        inv = check_id(inv)
        with self._lock:
            f = self._following.get((ns, inv))
        with self._stripe(("inv", ns, inv)):  # not while a read of the page appends to it
            frames = [x for x in (f.frames if f else []) if x["seq"] > after][:500]
        return {
            "attempt": page["stream"]["attempt"],
            "state": page["record"]["state"],
            "problem": page["stream"]["problem"],
            "frames": frames,
        }

    def _locate(self, ns: str, inv: str) -> tuple[QueueOps, Record]:
        """Find an invocation's queue: where it was found before, else the id index (every
        submit to another queue than ``default`` writes it before its ticket), else the
        default queue.

        Raises:
            NotFound: in none of them. NewerRecord: written by a newer lakeshore.
            StoreError: the store failed.
        """
        found = self._where.get((ns, inv))
        if found is not None:
            ops = QueueOps(self.store, QueueKeys(ns, found))
            with contextlib.suppress(NotFound):  # removed since: look again
                return ops, _record(ops, inv)
        queues = []
        with contextlib.suppress(NotFound):
            raw = self.store.get(id_index(ns, inv), max_bytes=MAX_SMALL_BYTES)[0]
            named = raw.decode("utf-8", "replace")
            if is_name(named):
                queues.append(named)
        queues.append("default")
        for queue in dict.fromkeys(queues):
            ops = QueueOps(self.store, QueueKeys(ns, queue))
            try:
                rec = _record(ops, inv)
            except NotFound:
                continue
            with self._lock:
                if len(self._where) > 10_000:
                    self._where.clear()
                self._where[(ns, inv)] = queue
            return ops, rec
        raise NotFound(
            f"ui {inv}",
            f"no invocation with this id in namespace {ns!r}",
            "check the id and the namespace",
        )

    def _value(self, ops: QueueOps, rec: Record, what: str) -> dict[str, Any]:
        """A value for the page: its shown form when small enough to read, its size, and
        whether it was spilled."""
        blob = rec.args if what == "args" else rec.result
        assert blob is not None
        out: dict[str, Any] = {"spilled": blob.ref is not None, "size": _size(blob), "shown": None}
        if blob.ref is not None and blob.size > MAX_VALUE_SHOWN:
            return out
        if not _owned(ops, rec, blob, what):
            out["problem"] = "the record points outside its invocation: not read"
            return out
        memo = (blob.ref, blob.sha256) if blob.ref is not None else None
        with self._lock:
            known = self._values.get(memo) if memo else None
        if known is not None:
            out["shown"] = known
            return out
        try:
            out["shown"] = shown(codec.decode(ops.get_blob(blob, what, MAX_DOWNLOAD), what))
        except LakeshoreError as e:
            out["problem"] = str(e)
            return out
        if memo is not None:  # a spilled value never changes: its key and digest say which
            with self._lock:
                self._values[memo] = out["shown"]
                while len(self._values) > 128:
                    self._values.popitem(last=False)
        return out

    def download(self, ns: str, inv: str, what: str) -> tuple[bytes, str] | None:
        """The stored bytes of an invocation's arguments or result (msgpack) and a file
        name; None when the budget is spent.

        Raises:
            InvalidArgument: a bad name, id or ``what``. NotFound: no such value.
            StoreError: the store failed, the record names another key, or the value is
                larger than ``MAX_DOWNLOAD``.
        """
        found = self._blob(ns, inv, what)
        if found is None:
            return None
        ops, blob = found
        return ops.get_blob(blob, what, MAX_DOWNLOAD), f"{check_id(inv)}-{what}.msgpack"

    def download_size(self, ns: str, inv: str, what: str) -> tuple[int, str] | None:
        """What :meth:`download` would send, its size and file name, from the record alone
        (the value is not read); None when the budget is spent.

        Raises:
            as :meth:`download`.
        """
        found = self._blob(ns, inv, what)
        if found is None:
            return None
        _, blob = found
        return _size(blob), f"{check_id(inv)}-{what}.msgpack"

    def _blob(self, ns: str, inv: str, what: str) -> tuple[QueueOps, Blob] | None:
        """The value ``what`` of an invocation as its record names it (read from the record
        only); None when the budget is spent.

        Raises:
            as :meth:`download`.
        """
        self._shown(ns)
        inv = check_id(inv)
        if what not in ("args", "result"):
            raise InvalidArgument("ui", "download args or result", "what=args|result")
        if not self.budget.left():
            return None
        try:
            ops, rec = self._locate(ns, inv)
        except StoreUnavailable:
            if self.budget.left():
                raise
            return None
        blob = rec.args if what == "args" else rec.result
        if blob is None:
            raise NotFound(f"ui {inv}", f"the invocation has no {what}", "wait for it")
        if not _owned(ops, rec, blob, what):
            raise StoreError(
                f"ui {inv}", "the record names a value outside its invocation", "inspect it"
            )
        if blob.ref is not None and blob.size > MAX_DOWNLOAD:
            raise StoreError(
                f"ui {inv}",
                f"the {what} value is {blob.size} bytes, more than the dashboard serves "
                f"({MAX_DOWNLOAD})",
                "read it in Python through Dispatch (`lakeshore result` for a result)",
            )
        return ops, blob


def _record(ops: QueueOps, inv: str) -> Record:
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


def _owned(ops: QueueOps, rec: Record, blob: Blob, what: str) -> bool:
    """A spilled value is read only from its own key: the invocation's ``args``, or the
    result of its current attempt; a record naming any other key is not followed."""
    if blob.ref is None:
        return True
    own = ops.keys.args(rec.id) if what == "args" else ops.keys.result(rec.id, rec.attempt)
    return blob.ref == own


def _size(blob: Blob) -> int:
    return blob.size if blob.ref is not None else len(blob.inline or b"")


def _fields(r: Record) -> dict[str, Any]:
    """The record field by field, as the page shows it (the lease's token left out)."""
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
        "scheduled_at": r.scheduled_at,
        "deadline_at": r.deadline_at,
        "timeout_s": r.timeout_s,
        "lease_s": r.lease_s,
        "lease": (
            {"worker": r.lease.worker, "expires_at": r.lease.expires_at} if r.lease else None
        ),
        "journal": (
            {k: r.journal.get(k) for k in ("attempt", "frames", "ended")} if r.journal else None
        ),
        "slot": r.slot,
        "pickled": r.fn_pickle is not None,
        "rev": r.rev,
        **({"parents": _parents(r)} if r.after or r.after_pass else {}),
    }


def _parents(r: Record) -> str:
    return parents_line(
        len(r.after), r.after_done, r.state == "queued", r.after_failure, r.after_pass
    )
