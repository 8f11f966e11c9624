"""Garbage collection: remove finished invocations once their retention has passed.

Nothing but gc deletes a finished invocation: its record, spilled objects, journals, logs, id
index entry and idempotency key. The retention is ``older_than``, never shorter than the
queue's ``result_retention_s``. gc also prunes old signs of life (``prune_workers``) and frees
admission slots their invocation leaked (``free_leaked_slots``).

It never collects a live invocation, and trusts no number it reads: tickets, records and keys
are deleted only on the etag gc read, and an invocation with a ticket of a later life (a rerun
in flight) is left alone. Stale tickets go before their record, and records no sooner than
``CLAIM_FENCE_S`` after their tickets were last seen, so a stalled claim cannot run a finished
invocation again. A folder without a record goes only once its newest object is
``ORPHAN_GRACE_S`` old and a tombstone has fenced its id (its submit may be only slow).

Order, reasons and cost: docs/operations.md#garbage-collection.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ulid import ULID

from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    LakeshoreError,
    NotFound,
    RecordError,
    TooLarge,
)
from lakeshore.keys import QueueKeys, check_id, id_index, namespace_prefix, workers_prefix
from lakeshore.model.record import Record
from lakeshore.protocol.admission import sweep_slots
from lakeshore.protocol.census import ids_between, read_sign_of_life
from lakeshore.protocol.idempotency import parse_key
from lakeshore.protocol.queue_record import QueueSettings
from lakeshore.protocol.steps import (
    CLAIM_FENCE_S,
    MAX_RECORD_BYTES,
    MAX_SMALL_BYTES,
    ORPHAN_GRACE_S,
    QueueOps,
    elapsed,
    unclaimed,
)
from lakeshore.store.base import Store

__all__ = [
    "GcReport",
    "collect",
    "free_leaked_slots",
    "parse_age",
    "prune_workers",
    "queue_names",
    "retention_of",
]

_PAST = "\ufffd"  # sorts after every ASCII character, in UTF-8 bytes and in code points
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
    # nan and inf (also "1e400", which float() reads as inf) would crash the cutoff's arithmetic
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(
            "age",
            f"{text!r} is not an age (a finite number >= 0 with an optional unit)",
            "write e.g. 7d, 12h, 30m or 45s",
        )
    return value


def queue_names(store: Store, ns: str) -> Iterator[str]:
    """The queues of namespace ``ns``, in the store's listing order: every folder directly
    under it whose name does not start with ``_`` (``_topics``, ``_ids``, ``_workers``).

    The store contract has no delimiter listing, so this skips instead of walking: it takes
    the first key after the previous folder, then starts the next listing just past that
    folder, at ``<name>/`` followed by U+FFFD, which sorts after every key lakeshore writes
    in it (they are ASCII). That cursor is past the folder in both listing orders a store may
    have: byte order (S3, where ``a-b/`` comes before ``a/``) and directory-walk order
    (SeaweedFS, where ``a/`` and everything in it come before ``a-b/``). Keys of a folder
    that sort after the cursor (non-ASCII ones anyone allowed to write the namespace could
    put there) are read past, never listed again. One LIST per folder:
    the cost grows with the number of queues and top-level folders, never with the records,
    topic posts or index entries inside them.

    Raises:
        StoreError: the store failed.
    """
    base = namespace_prefix(ns)
    after: str | None = None
    done: str | None = None  # the folder the cursor was just moved past
    while True:
        first = None
        for info in store.list(base, start_after=after):
            head, sep, _ = info.key[len(base) :].partition("/")
            if not (sep and head == done):
                first = info
                break
            # a key of that folder sorting after the cursor (not one lakeshore writes: an
            # emoji, U+FFFF): read past it rather than list the same folder again for ever
        if first is None:
            return
        head, sep, _ = first.key[len(base) :].partition("/")
        if not sep:
            after = first.key  # an object right under the namespace: not a folder
            continue
        if not head.startswith("_"):
            yield head
        after, done = f"{base}{head}/{_PAST}", head


def retention_of(
    ops: QueueOps, settings: QueueSettings, older_than_s: float | None
) -> tuple[float, float] | None:
    """``(longest, shortest)`` of ``older_than_s`` and the queue's ``result_retention_s``;
    None when neither is set (nothing of that queue can expire).

    Raises:
        InvalidArgument: ``older_than_s`` is not a finite number >= 0.
        RecordError: the queue record is corrupt, newer, or holds a non-finite retention.
        StoreError: the store failed.
    """
    if older_than_s is not None and not (
        isinstance(older_than_s, int | float) and math.isfinite(older_than_s) and older_than_s >= 0
    ):
        raise InvalidArgument(
            f"gc {ops.keys.queue}",
            f"older_than_s must be a finite number >= 0, got {older_than_s!r}",
            "pass seconds, e.g. 7 * 86400",
        )
    conf = settings.read(ops.keys.queue)[0]
    keep = [r for r in (older_than_s, conf.result_retention_s) if r is not None]
    return (max(keep), min(keep)) if keep else None


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
    only: set[str] | None = None,
    ticks: Callable[[], float] = elapsed,
    sleep: Callable[[float], object] = time.sleep,
) -> GcReport:
    """Collect one queue. See the module docstring. With ``only``, ids outside it are left
    alone (a run confirmed by a person removes no more than the dry run showed). ``ticks``
    and ``sleep`` time the claim fence (step 2).

    Raises:
        InvalidArgument: no retention at all (neither ``older_than_s`` nor the queue's), or
            an ``older_than_s`` that is not a finite number >= 0.
        RecordError: the queue record is corrupt, newer, or holds a non-finite retention.
        StoreError: the store failed (what was removed so far stays removed).
    """
    keep = retention_of(ops, settings, older_than_s)
    if keep is None:
        raise InvalidArgument(
            f"gc {ops.keys.queue}",
            "no retention given and the queue sets none",
            "pass --older-than (e.g. 7d) or set the queue's result_retention_s",
        )
    longest, shortest = keep
    cutoff = now - longest
    report = GcReport()
    # ids up to the asked-for cutoff: those between it and the queue's are counted as kept;
    # a retention longer than the epoch's age lists nothing (and a ULID cannot go negative)
    scan_ms = min(max(0, int((now - shortest) * 1000)), 2**48 - 1)
    top = str(ULID.from_bytes(scan_ms.to_bytes(6, "big") + bytes(10)))
    # an invocation with no folder (never claimed, nothing spilled: a tombstone) has a ticket
    ticketed: dict[str, list[str]] = {}
    for info in ops.tickets():
        ticketed.setdefault(QueueKeys.id_of(info.key), []).append(info.key)
    # a ticket missing from the listing ended before this moment; one deleted below, later
    tickets_seen = ticks()
    records: list[tuple[str, Record, str]] = []  # deleted after the fence: see _fence_claims
    found = set(ids_between(ops.store, ops.keys, None, top))
    found |= {inv for inv in ticketed if inv < top and _is_id(inv)}
    for inv in sorted(found):
        if only is not None and inv not in only:
            continue
        try:
            rec, etag = ops.read(inv)
        except NotFound:
            _sweep_orphan(ops, inv, now, report, dry_run)
            continue
        except RecordError:
            continue  # corrupt or newer: never ours to delete
        if not rec.terminal or rec.finished_at is None:
            continue
        if rec.finished_at >= cutoff:
            if older_than_s is not None and rec.finished_at < now - older_than_s:
                report.kept_by_retention += 1
            continue
        lives = (QueueKeys.reruns_of(t) for t in ticketed.get(inv, []))
        if not unclaimed(etag) and any(n is not None and n > rec.reruns for n in lives):
            continue  # a rerun between its ticket and its record write: live, or about to be
        report.expired.append(inv)
        if unclaimed(etag):  # the record is the ticket's content (a tombstone): one delete
            if not _delete_in_order(
                ops, [(ops.ticket_key(rec), etag[len("ticket:") :])], report, dry_run
            ):
                report.expired.pop()  # changed since we read it: keep it
                continue
            _remove_folder(ops, inv, report, dry_run)
            _remove_satellites(ops, inv, rec.key, rec.queue, report, dry_run)
            continue
        # stale tickets of its lives so far (a later one is a rerun's) now, the record later
        stale = [t for t in ticketed.get(inv, []) if _life(t) <= rec.reruns]
        if stale:
            if not _delete_in_order(ops, [(t, None) for t in stale], report, dry_run):
                report.expired.pop()
                continue
            tickets_seen = ticks()
        records.append((inv, rec, etag))
    if records and not dry_run:
        _fence_claims(tickets_seen, ticks, sleep)
    for inv, rec, etag in records:
        if not _delete_in_order(ops, [(ops.keys.record(inv), etag)], report, dry_run):
            report.expired.remove(inv)  # changed since we read it (a retry?): keep it
            continue
        _remove_folder(ops, inv, report, dry_run)
        _remove_satellites(ops, inv, rec.key, rec.queue, report, dry_run)
    report.objects += free_leaked_slots(ops, now, dry_run)
    return report


def _fence_claims(
    tickets_seen: float, ticks: Callable[[], float], sleep: Callable[[float], object]
) -> None:
    """Wait until ``CLAIM_FENCE_S`` has passed since every ticket of the records about to go
    was last seen. A claimer that read a full ticket, stalled, and creates the record after
    gc deleted it has then taken longer than that from its read to its create, and such a
    slow claim proves its ticket before it runs anything (``QueueOps.unclaim_if_stale``):
    an invocation that finished is never run again by a claim that outlived gc."""
    # a margin over the claimer's threshold: two clocks' rates and resolutions may differ
    while (left := tickets_seen + CLAIM_FENCE_S * 1.1 - ticks()) > 0:
        sleep(left)


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


def _sweep_orphan(ops: QueueOps, inv: str, now: float, report: GcReport, dry_run: bool) -> None:
    """A folder without a record: a crash's leftovers, or a submit still on its way.

    A submit mints its id before admission and uploads, so the id's age says nothing about
    whether it is still writing: the folder is judged by its newest object's write time, in
    the store's clock. A stale one may still be a submit that is only stalled; it must not
    publish a record whose arguments are gone, so its id is fenced first (and the folder
    left alone if the record landed just now).
    """
    if now - ULID.from_str(inv).timestamp <= ORPHAN_GRACE_S:
        return  # cannot be stale yet: spare the LIST
    objects = list(ops.store.list(ops.keys.invocation_prefix(inv)))
    if any(info.last_modified > now - ORPHAN_GRACE_S for info in objects):
        return  # written lately: a submit in flight, however old its id
    if dry_run or ops.fence(inv, now, "gc found its folder without a record"):
        report.orphans.append(inv)
        _remove_folder(ops, inv, report, dry_run)


def _delete_in_order(
    ops: QueueOps, keys: list[tuple[str, str | None]], report: GcReport, dry_run: bool
) -> bool:
    """Delete each key on the etag given (or, with None, on the etag a read finds; a missing
    key is skipped); False, and nothing more deleted, as soon as one changed meanwhile."""
    for key, etag in keys:
        if etag is None:
            try:
                etag = ops.store.get(key, max_bytes=MAX_RECORD_BYTES)[1]
            except (NotFound, TooLarge):
                continue
        if not dry_run:
            try:
                ops.store.delete(key, if_match=etag)
            except Conflict:
                return False
        report.objects.append(key)
    return True


def _life(ticket: str) -> int:
    life = QueueKeys.reruns_of(ticket)
    return -1 if life is None else life  # a malformed suffix: not a live ticket of anything


def _is_id(name: str) -> bool:
    try:
        return check_id(name) == name
    except InvalidArgument:
        return False


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
    key: str | None,
    queue: str,
    report: GcReport,
    dry_run: bool,
) -> None:
    store = ops.store
    candidates = [id_index(ops.keys.ns, inv)] if queue != "default" else []
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
