"""The dashboard's overview: one poller thread reads the store, every tab reads its copy.

However many tabs are open, the store sees one reader: a round every ``interval_s``, and none
while no page has asked for the overview within ``IDLE_AFTER_S``. A round lists each queue's
tickets and the workers' signs of life, never the finished history (throughput is what left
the tickets between two rounds); names and queue records are read every ``discover_s``. It
reads a sign of life again only when its etag changed, and the records of the first
``RECORD_READS`` tickets in claim order (one found running is trusted by its ticket's etag for
at most ``RUNNING_TRUSTED_S``). Beyond those, the split between queued and running comes from
the signs of life and is marked estimated.

Anything read may be anyone's: a planted key, a corrupt sign of life or an unreadable queue
record is passed over or shown as a problem, and never ends a round. What each round reads
and costs: docs/ui.md#what-it-costs.
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

from lakeshore.errors import LakeshoreError, NewerRecord, NotFound, RecordError, StoreError
from lakeshore.keys import (
    QueueKeys,
    id_time,
    is_name,
    namespace_prefix,
    namespaces_prefix,
    workers_prefix,
)
from lakeshore.protocol.census import folder_names, live_tickets, read_sign_of_life
from lakeshore.protocol.queue_record import QueueSettings
from lakeshore.protocol.steps import MARKER_MAX, MAX_SMALL_BYTES, QueueOps, decode_ticket
from lakeshore.store.base import ObjectInfo, Store

__all__ = ["IDLE_AFTER_S", "RECORD_READS", "Overview"]

log = logging.getLogger("lakeshore.ui")

RECORD_READS = 32  # records a round reads per queue (the first tickets: the next claimed)
MAX_NAMESPACES = 16  # namespaces the overview shows (the first found; --ns picks others)
MAX_QUEUES = 64  # queues per namespace it shows
MAX_SIGNS = 1000  # signs of life a round lists per namespace
SIGN_READS = 200  # changed signs of life a round reads per namespace
IDLE_AFTER_S = 60.0  # the poller sleeps when no page asked for the overview this long
RUNNING_TRUSTED_S = 30.0  # a remembered "running" is read again after this
SERIES_POINTS = 180  # points of the throughput/depth chart (15 minutes at 5 s)
_MOVE_SLACK_S = 2.0  # Last-Modified has whole seconds, and clocks differ a little
_LIVE_LIMIT = 100_000  # tickets a round lists per queue at most
_WORKERS_WITHIN_S = 300.0
_FUTURE_S = 60.0


@dataclass
class _Verdict:
    etag: str
    state: str  # "running", or "gone" for a tombstone, "queued" for a full ticket's content
    at: float


@dataclass
class _Queue:
    """What the overview remembers of one queue between rounds."""

    ops: QueueOps
    verdicts: dict[str, _Verdict] = field(default_factory=dict)  # ticket key -> verdict
    live: set[str] | None = None  # ids live at the last round
    series: deque[list[float]] = field(default_factory=lambda: deque(maxlen=SERIES_POINTS))
    config: dict[str, Any] | None = None
    config_error: str | None = None


class Overview:
    """The poller of one store (``namespaces``: those to show; None: every one found)."""

    def __init__(
        self,
        store: Store,
        namespaces: list[str] | None,
        interval_s: float,
        discover_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.fixed = namespaces
        self.interval_s, self.discover_s = interval_s, discover_s
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str], _Queue] = {}
        self._signs: dict[str, tuple[str, dict[str, Any] | None]] = {}  # key -> (etag, data)
        self.names: list[tuple[str, list[str]]] = []
        self._discovered_at: float | None = None
        self._copy: dict[str, Any] = {"namespaces": [], "at": None, "error": None}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._asked_at: float | None = None
        self.rounds = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="lakeshore-ui", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.watched():
                try:
                    self.poll()
                except Exception as e:  # a bug met in one round must not end the rounds
                    log.exception("ui: a round of the overview failed")
                    with self._lock:
                        self._copy = {**self._copy, "error": f"ui: a round failed: {e!r}"[:500]}
                        self.rounds += 1
                self._wake.wait(self.interval_s)
            else:
                self._wake.wait()
            self._wake.clear()

    def watched(self) -> bool:
        """Whether the poller has a round to do: the first, or a page asked lately."""
        asked = self._asked_at
        return self.rounds == 0 or (asked is not None and self.monotonic() - asked < IDLE_AFTER_S)

    def copy(self) -> dict[str, Any]:
        """The last round's overview (nothing is read here: a sleeping poller is woken)."""
        now = self.monotonic()
        idle = self._asked_at is None or now - self._asked_at >= IDLE_AFTER_S
        self._asked_at = now
        if idle:
            self._wake.set()
        with self._lock:
            return {**self._copy, "interval_s": self.interval_s, "rounds": self.rounds}

    def poll(self) -> None:
        """One round (the poller calls it; tests call it directly)."""
        try:
            now = self.store.now()
            now_m = self.monotonic()
            if self._discovered_at is None or now_m - self._discovered_at >= self.discover_s:
                self._discover()
                self._discovered_at = now_m
            spaces = [self._namespace(ns, queues, now) for ns, queues in self.names]
            copy: dict[str, Any] = {"namespaces": spaces, "at": now, "error": None}
        except LakeshoreError as e:  # the store's clock or the names: nothing to show
            log.warning("ui: a round of the overview failed: %s", e)
            copy = {**self._copy, "error": str(e)}
        with self._lock:
            self._copy = copy
            self.rounds += 1

    def _namespace(self, ns: str, queues: list[str], now: float) -> dict[str, Any]:
        problems = []
        try:
            workers = self._workers(ns, now)
        except LakeshoreError as e:  # not ours to list, or a blip: the queues still count
            workers, problems = [], [f"signs of life: {e}"]
        rows = []
        for queue in queues:
            try:
                rows.append(self._count(self.queue(ns, queue), now, workers))
            except LakeshoreError as e:
                rows.append({"queue": queue, "error": str(e)})
        return {"ns": ns, "queues": rows, "workers": workers, "problems": problems}

    def forget(self, ns: str, inv: str) -> None:
        """An action moved ``inv``: what the rounds remembered of its tickets goes."""
        with self._lock:
            queues = [q for (space, _), q in self._queues.items() if space == ns]
        for q in queues:
            for key in [k for k in q.verdicts if QueueKeys.id_of(k) == inv]:
                q.verdicts.pop(key, None)

    # -- names and settings -------------------------------------------------------------------

    def _discover(self) -> None:
        if self.fixed is not None:
            spaces = list(self.fixed)
        else:
            spaces = folder_names(
                self.store, namespaces_prefix(), keep=is_name, limit=MAX_NAMESPACES
            ) or ["default"]
        names = []
        before = dict(self.names)
        for ns in spaces:
            try:
                found = folder_names(
                    self.store, namespace_prefix(ns), keep=_queue_name, limit=MAX_QUEUES
                )
            except LakeshoreError as e:  # one namespace we may not list: keep what we knew
                log.warning("ui: the queues of namespace %s: %s", ns, e)
                found = before.get(ns, [])
            queues = sorted(found) or ["default"]
            names.append((ns, queues))
            for queue in queues:
                self._read_config(self.queue(ns, queue))
        self.names = names
        shown = {(ns, q) for ns, queues in names for q in queues}
        with self._lock:  # queues gone from the store are forgotten, with their charts
            for key in [k for k in self._queues if k not in shown]:
                del self._queues[key]

    def queue(self, ns: str, queue: str) -> _Queue:
        with self._lock:
            found = self._queues.get((ns, queue))
            if found is None:
                found = _Queue(QueueOps(self.store, QueueKeys(ns, queue)))
                self._queues[(ns, queue)] = found
            return found

    def _read_config(self, q: _Queue) -> None:
        keys = q.ops.keys
        try:
            cfg, _ = QueueSettings(self.store, keys.ns).read(keys.queue)
            q.config, q.config_error = cfg.public(), None
        except LakeshoreError as e:  # corrupt, newer, or not ours to read: said on the row
            q.config, q.config_error = None, str(e)

    # -- a round --------------------------------------------------------------------------------

    def _workers(self, ns: str, now: float) -> list[dict[str, Any]]:
        """Signs of life of the last 5 minutes; a sign is read again only when it changed
        (one that cannot be read this round keeps its last copy)."""
        seen = []
        prefix = workers_prefix(ns)
        listed: set[str] = set()
        reads = 0
        for info in self.store.list(prefix):
            if len(listed) >= MAX_SIGNS:
                break  # anyone can write names here: a round reads so many at most
            listed.add(info.key)
            hit = self._signs.get(info.key)
            if hit is None or hit[0] != info.etag:
                if reads >= SIGN_READS:
                    continue  # read at a later round
                reads += 1
                try:
                    data, etag = self.store.get(info.key, max_bytes=MAX_SMALL_BYTES)
                    hit = (etag, read_sign_of_life(data, info.key))
                except NotFound:
                    continue  # gone since the listing
                except LakeshoreError:  # not a sign of life, a planted key, a blip
                    hit = hit or (info.etag, None)
                self._signs[info.key] = hit
            sign = hit[1]
            # a sign from the future (a skewed or made-up clock) is not taken as alive forever
            if sign is not None and -_FUTURE_S <= now - sign["seen_at"] <= _WORKERS_WITHIN_S:
                seen.append({**sign, "age_s": max(0.0, now - sign["seen_at"])})
        for key in [k for k in self._signs if k.startswith(prefix) and k not in listed]:
            del self._signs[key]
        return sorted(seen, key=lambda d: -float(d["seen_at"]))

    def _count(self, q: _Queue, now: float, workers: list[dict[str, Any]]) -> dict[str, Any]:
        keys = q.ops.keys
        tickets, cut = live_tickets(self.store, keys, _LIVE_LIMIT)
        counts = {"queued": 0, "running": 0, "?": 0, "gone": 0}
        reads, oldest, ids = 0, None, set()
        verdicts: dict[str, _Verdict] = {}
        for info in tickets:
            state, reads = self._state(q, info, now, reads, verdicts)
            counts[state] += 1
            if state == "gone":
                continue
            inv = QueueKeys.id_of(info.key)
            ids.add(inv)
            if state != "running" and (oldest is None or inv < oldest):
                oldest = inv  # queued, or not read: it may be the oldest waiting
        q.verdicts = verdicts
        queued, running, unknown = counts["queued"], counts["running"], counts["?"]
        if unknown:  # split what could not be read this round by the workers' own counts
            said = sum(
                int(w.get("running_by_queue", {}).get(keys.queue, 0))
                for w in workers
                if w.get("status") != "stopped"
            )
            extra = min(unknown, max(0, said - running))
            running += extra
            queued += unknown - extra
        left = len(q.live - ids) if q.live is not None else 0
        arrived = len(ids - q.live) if q.live is not None else 0
        q.live = ids
        q.series.append([round(now, 3), len(ids), queued, running, left, arrived])
        oldest_s = None
        if oldest is not None:
            with contextlib.suppress(ValueError):
                oldest_s = max(0.0, now - id_time(oldest))
        return {
            "queue": keys.queue,
            "queued": queued,
            "running": running,
            "live": len(ids),
            "estimated": cut or unknown > 0,
            "oldest_queued_s": oldest_s,
            "config": q.config,
            "config_error": q.config_error,
            "series": list(q.series),
        }

    def _state(
        self, q: _Queue, info: ObjectInfo, now: float, reads: int, verdicts: dict[str, _Verdict]
    ) -> tuple[str, int]:
        """``queued``, ``running``, ``gone`` (over, or a tombstone) or ``?`` (not read this
        round) for one live ticket, and the reads spent so far."""
        known = q.verdicts.get(info.key)
        if known is not None and known.etag != info.etag:
            known = None  # the ticket changed: what was known of it is not
        if known is not None and (
            known.state in ("gone", "?")
            or (known.state == "running" and now - known.at < RUNNING_TRUSTED_S)
        ):
            verdicts[info.key] = known
            return known.state, reads
        if reads >= RECORD_READS:
            if known is not None:
                verdicts[info.key] = known  # keep what the ticket's content said
            return "?", reads
        inv = QueueKeys.id_of(info.key)
        try:
            rec = q.ops.read_record(inv)[0]
        except NotFound:
            if info.size <= MARKER_MAX:
                return "gone", reads + 1  # an orphaned marker, which a claimer drops
            if known is not None:  # its content was decoded before
                verdicts[info.key] = known
                return known.state, reads + 1
            return self._ticket(q, info, now, verdicts), reads + 2
        except (NewerRecord, RecordError):
            return "?", reads + 1  # corrupt (a claimer fails it) or newer: not counted here
        except StoreError:
            return "?", reads + 1
        if rec.state == "running":
            # A full ticket is rewritten (to a marker) by any move back to queued; a marker
            # is rewritten before the record moves, so one written after the attempt
            # started may belong to a move in flight
            started = rec.started_at if rec.started_at is not None else now
            if info.size > MARKER_MAX or info.last_modified < started - _MOVE_SLACK_S:
                verdicts[info.key] = _Verdict(info.etag, "running", now)
            return "running", reads + 1
        return (rec.state if rec.state == "queued" else "gone"), reads + 1

    def _ticket(self, q: _Queue, info: ObjectInfo, now: float, verdicts: dict[str, Any]) -> str:
        """The state a full ticket's own record says (read once per etag: it never changes)."""
        try:
            data, etag = q.ops.read_bounded(info.key)
        except NotFound:
            return "gone"
        except RecordError:  # larger than any ticket: not fetched again
            verdicts[info.key] = _Verdict(info.etag, "?", now)
            return "?"
        except LakeshoreError:
            return "?"  # a blip: read again next round
        try:
            rec = decode_ticket(data, q.ops.keys, info.key)
        except LakeshoreError:  # not a ticket lakeshore reads: not fetched again
            verdicts[info.key] = _Verdict(etag, "?", now)
            return "?"
        state = "queued" if rec.state == "queued" else "gone"  # else a tombstone
        verdicts[info.key] = _Verdict(etag, state, now)
        return state


def _queue_name(name: str) -> bool:
    return not name.startswith("_") and is_name(name)
