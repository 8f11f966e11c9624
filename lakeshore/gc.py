"""Garbage collection: remove finished invocations once their retention has passed.

An invocation *expires* when it is terminal and finished more than the retention ago. The
retention is ``older_than`` (``lakeshore gc --older-than 7d``), but never shorter than the
queue's own ``result_retention_s``: a queue that promises to keep results a month keeps them.

What goes, per expired invocation, in this order:

1. the **record** (one conditional delete on the etag read: an invocation retried or
   rewritten meanwhile is left alone) — from here on the invocation does not exist;
2. everything else under its folder: spilled arguments and results, journals, logs;
3. its hints (ready, lease), its id index entry, and its idempotency key when the key still
   names it (conditional on the key object's etag).

Signs of life of workers not seen within ``older_than`` go too (``prune_workers``), and so do
admission slots whose invocation ended without freeing them (``free_leaked_slots``).

A crash between steps leaves objects without a record; a later run finds them (folders with
no record whose id is older than the cutoff) and removes them too. Such a folder may also be
a submit that is only slow (stalled between its spilled arguments and its record): gc first
creates a tombstone record at the id (``lakeshore.fence``), create-only, and removes the
folder only if it landed, so that submit fails instead of publishing a record whose
arguments are gone. The tombstone is a finished invocation like any other: a later run
collects it once the retention has passed.

A keyed resubmit racing gc never loses its invocation: a key whose record is missing is
never repaired under its old id; the resubmit fences the old id and moves the key to a new
id (see ``lakeshore.submit``), and gc deletes the key only by a delete conditional on the
etag it read, while it still names the expired id.

Cost: ids sort by submission time and an invocation cannot finish before it was submitted,
so only folders with ids older than the cutoff are listed — one LIST walk over those, one
GET per record, one DELETE per object removed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ulid import ULID

from lakeshore.admission import sweep_slots
from lakeshore.census import ids_between, read_sign_of_life
from lakeshore.errors import Conflict, InvalidArgument, LakeshoreError, NotFound, TooLarge
from lakeshore.fence import fence
from lakeshore.keys import id_index, workers_prefix
from lakeshore.protocol import MAX_SMALL_BYTES, ORPHAN_GRACE_S, QueueOps
from lakeshore.queues import QueueSettings
from lakeshore.record import RecordError
from lakeshore.store.base import Store
from lakeshore.submit import parse_key

__all__ = ["GcReport", "collect", "free_leaked_slots", "parse_age", "prune_workers"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` or plain seconds -> seconds.

    Raises:
        InvalidArgument: not an age.
    """
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _UNITS else "s"
    number = raw[:-1] if raw[-1:] in _UNITS else raw
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if value < 0:
        raise InvalidArgument("age", f"{text!r} is not an age", "write e.g. 7d, 12h, 30m or 45s")
    return value


@dataclass
class GcReport:
    """What a collection found (``dry_run``) or removed."""

    expired: list[str] = field(default_factory=list)  # invocation ids
    objects: list[str] = field(default_factory=list)  # keys removed (or that would be)
    orphans: list[str] = field(default_factory=list)  # ids whose record was already gone
    kept_by_retention: int = 0


def collect(
    ops: QueueOps,
    settings: QueueSettings,
    older_than_s: float | None,
    now: float,
    dry_run: bool = False,
) -> GcReport:
    """Collect one queue. See the module docstring.

    Raises:
        InvalidArgument: no retention at all (neither ``older_than_s`` nor the queue's).
        StoreError: the store failed (what was removed so far stays removed).
    """
    conf = settings.read(ops.keys.queue)[0]
    keep = [r for r in (older_than_s, conf.result_retention_s) if r is not None]
    if not keep:
        raise InvalidArgument(
            f"gc {ops.keys.queue}",
            "no retention given and the queue sets none",
            "pass --older-than (e.g. 7d) or set the queue's result_retention_s",
        )
    cutoff = now - max(keep)
    report = GcReport()
    # ids up to the asked-for cutoff: those between it and the queue's are counted as kept
    scan_to = now - min(keep)
    top = str(ULID.from_bytes(int(scan_to * 1000).to_bytes(6, "big") + bytes(10)))
    for inv in list(ids_between(ops.store, ops.keys, None, top)):
        try:
            rec, etag = ops.read(inv)
        except NotFound:
            # younger: a submit in flight. Older: a submit that is only slow must not publish
            # a record whose arguments are gone, so its id is fenced first (and the folder
            # left alone if the record landed just now)
            old = now - ULID.from_str(inv).timestamp > ORPHAN_GRACE_S
            if old and (dry_run or fence(ops, inv, now, "gc found its folder without a record")):
                report.orphans.append(inv)
                _remove_folder(ops, inv, report, dry_run)
            continue
        except RecordError:
            continue  # corrupt or newer: never ours to delete
        if not rec.terminal or rec.finished_at is None:
            continue
        if rec.finished_at >= cutoff:
            if older_than_s is not None and rec.finished_at < now - older_than_s:
                report.kept_by_retention += 1
            continue
        report.expired.append(inv)
        record_key = ops.keys.record(inv)
        if dry_run:
            report.objects.append(record_key)
        else:
            try:
                ops.store.delete(record_key, if_match=etag)
            except Conflict:
                report.expired.pop()  # changed since we read it (a retry?): keep it
                continue
            report.objects.append(record_key)
        _remove_folder(ops, inv, report, dry_run)
        _remove_satellites(ops, inv, rec.priority, rec.key, rec.queue, report, dry_run)
    report.objects += free_leaked_slots(ops, now, dry_run)
    return report


def free_leaked_slots(ops: QueueOps, now: float, dry_run: bool = False) -> list[str]:
    """Free the admission slots (``max_depth``) whose invocation ended without freeing them —
    a worker that died between its terminal write and its slot delete — or never got a
    record (fenced first). Slots of live invocations, and slots younger than
    ``SLOT_REPAIR_AGE_S`` (a submit in flight), stay. Returns the slot keys freed.

    Raises:
        StoreError: the store failed.
    """
    return sweep_slots(ops, now, dry_run)


def prune_workers(store: Store, ns: str, older_than_s: float, now: float, dry_run: bool) -> int:
    """Remove the signs of life of workers not seen for ``older_than_s``; returns how many."""
    gone = 0
    for info in list(store.list(workers_prefix(ns))):
        try:
            life = read_sign_of_life(store.get(info.key, max_bytes=MAX_SMALL_BYTES)[0], info.key)
            seen = life["seen_at"] if life is not None else 0.0
        except LakeshoreError:
            seen = 0.0  # unreadable: as good as never seen
        if seen < now - older_than_s:
            if not dry_run:
                with contextlib.suppress(Conflict):
                    store.delete(info.key, if_match=info.etag)  # unless it just came back
            gone += 1
    return gone


def _remove_folder(ops: QueueOps, inv: str, report: GcReport, dry_run: bool) -> None:
    for info in list(ops.store.list(ops.keys.invocation_prefix(inv))):
        if info.key == ops.keys.record(inv):
            continue  # only ever deleted conditionally, above
        if not dry_run:
            ops.store.delete(info.key)
        report.objects.append(info.key)


def _remove_satellites(
    ops: QueueOps,
    inv: str,
    priority: int,
    key: str | None,
    queue: str,
    report: GcReport,
    dry_run: bool,
) -> None:
    store = ops.store
    candidates = [ops.keys.ready(priority, inv)]
    if queue != "default":
        candidates.append(id_index(ops.keys.ns, inv))
    for k in candidates:
        try:
            store.get(k)
        except NotFound:
            continue
        if not dry_run:
            store.delete(k)
        report.objects.append(k)
    if key is not None:
        idem = ops.keys.idem(key)
        try:
            data, etag = store.get(idem, max_bytes=MAX_SMALL_BYTES)
        except NotFound:
            return
        except TooLarge:
            return  # not a key lakeshore wrote: left alone, like any key it cannot parse
        held = parse_key(data)
        if held is None or held[0] != inv:
            return  # the key was taken again by a newer invocation (or is not one of ours)
        if not dry_run:
            with contextlib.suppress(Conflict):
                store.delete(idem, if_match=etag)
        report.objects.append(idem)
