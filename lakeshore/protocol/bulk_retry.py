"""Bulk retry: queue again every finished invocation of a queue that a filter selects.

The selection is the invocations whose id's time is at or after ``since`` (ids carry their
submit time, so only that stretch of the queue's folders is listed), in one terminal
``state``, of one function ``fn`` if given, that finished at or before ``until`` in the
store's clock. Each is rerun like ``q.retry`` does (:meth:`QueueOps.rerun`): a
compare-and-swap on the etag its record was read at, the filter checked again on every
re-read, so of two bulk retries that select the same invocation at once exactly one reruns
it and the other skips it.

``until`` is what makes a second run a no-op: a rerun clears ``finished_at``, and an
invocation that ends again gets a later one, so a run with the same ``until`` as an earlier
one finds everything that one reran queued, running or finished after ``until``, and leaves
it alone. Without ``until`` a run takes the store's now. Costs: docs/retries.md#costs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from ulid import ULID

from lakeshore.errors import Conflict, InvalidArgument, LakeshoreError, NotFound, RecordError
from lakeshore.model.record import TERMINAL, Record
from lakeshore.protocol.gc import parse_age
from lakeshore.protocol.steps import QueueOps, abandoned

__all__ = ["BATCH", "Selection", "Tally", "epoch_s", "parse_when", "retry_selected", "selected"]

BATCH = 64  # records read at once (in parallel), and reruns written at once
_THREADS = 16


@dataclass(frozen=True)
class Selection:
    """Which finished invocations a bulk retry takes (see the module docstring).

    Raises:
        InvalidArgument: ``state`` is not a terminal state, or ``since`` / ``until`` is not
            a finite time (seconds since the epoch).
    """

    state: str = "failed"
    fn: str | None = None
    since: float | None = None  # the id's time (its submit), seconds since the epoch
    until: float = math.inf  # finished at or before, store time

    def __post_init__(self) -> None:
        if self.state not in TERMINAL:
            raise InvalidArgument(
                "retry",
                f"state {self.state!r} is not a finished state",
                f"choose one of {', '.join(TERMINAL)}",
            )
        for name in ("since", "until"):
            t = getattr(self, name)
            number = isinstance(t, float | int) and not isinstance(t, bool)
            # a time a ULID can carry (48 bits of milliseconds); an until of "for ever"
            in_range = number and (0 <= t < 2**47 / 1000 or (name == "until" and t == math.inf))
            if t is not None and not in_range:
                raise InvalidArgument(
                    "retry", f"{name} must be a time in seconds since the epoch", f"got {t!r}"
                )

    def takes(self, rec: Record) -> bool:
        """Whether ``rec`` is selected as it is now."""
        return (
            rec.state == self.state
            and (self.fn is None or rec.fn == self.fn)
            and rec.finished_at is not None
            and rec.finished_at <= self.until
            and not abandoned(rec)  # a tombstone: nothing was submitted to run again
        )


@dataclass
class Tally:
    """What a bulk retry did: the ids it queued again (or would have, in a dry run), the
    ids another process moved first, and the ids whose record could not be used."""

    retried: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def epoch_s(when: float | datetime | None, name: str) -> float | None:
    """A time given as seconds since the epoch or as an aware datetime, in seconds.

    Raises:
        InvalidArgument: a naive datetime (whose clock would be a guess), or something else.
    """
    if when is None:
        return None
    if isinstance(when, datetime):
        if when.utcoffset() is None:
            raise InvalidArgument(
                "retry", f"{name} is a naive datetime", "pass an aware one (tzinfo=timezone.utc)"
            )
        return when.timestamp()
    if isinstance(when, int | float) and not isinstance(when, bool) and math.isfinite(when):
        return float(when)
    raise InvalidArgument(
        "retry", f"{name} must be seconds since the epoch or a datetime", f"got {when!r}"
    )


def parse_when(text: str, now: float, name: str) -> float:
    """A time as the command line takes it: an age (``2h``, ``30m``, ``7d``: that long
    before ``now``) or an ISO 8601 time with its UTC offset (``2025-06-01T12:00Z``).

    Raises:
        InvalidArgument: neither, or an ISO time without an offset.
    """
    try:
        return now - parse_age(text)
    except InvalidArgument:
        pass
    try:
        when = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise InvalidArgument(
            "retry",
            f"--{name} {text!r} is neither an age nor an ISO time",
            "write an age such as 2h or 30m, or a time such as 2025-06-01T12:00Z",
        ) from None
    if when.utcoffset() is None:
        raise InvalidArgument(
            "retry",
            f"--{name} {text!r} has no UTC offset",
            "add one: 2025-06-01T12:00Z or 2025-06-01T14:00+02:00",
        )
    return when.timestamp()


def _floor_id(t: float) -> str:
    ms = min(max(0, int(t * 1000)), 2**48 - 1)
    return str(ULID.from_bytes(ms.to_bytes(6, "big") + bytes(10)))


def _folder_ids(ops: QueueOps, since: float | None) -> Iterator[str]:
    """Ids of the queue's invocation folders from ``since`` on, ascending: one LIST walk
    from the first id of that millisecond. An invocation nothing moved has no folder but
    is queued, so never selected. A folder not named like an id is passed over."""
    base = ops.keys.ids_prefix
    start = f"{base}{_floor_id(since)}" if since is not None else None
    last = None
    for info in ops.store.list(base, start_after=start):
        inv = info.key[len(base) :].split("/", 1)[0]
        if inv.startswith("_"):
            return  # the "_" folders (tickets, keys, slots) sort after every id
        if inv != last:
            last = inv
            if len(inv) == 26 and _is_id(inv):
                yield inv


def _is_id(name: str) -> bool:
    try:
        return str(ULID.from_str(name)) == name
    except ValueError:
        return False


def selected(ops: QueueOps, sel: Selection) -> Iterator[tuple[Record, str]]:
    """The records ``sel`` takes, with the etags they were read at, in id order. Read
    ``BATCH`` at a time, in parallel; a record that cannot be read or decoded, or one of
    a newer schema, is passed over (one bad object never stops the walk).

    Raises:
        StoreError: the store failed while listing.
    """

    def one(inv: str) -> tuple[Record, str] | None:
        try:
            rec, etag = ops.read(inv)
        except (NotFound, RecordError, InvalidArgument):
            return None
        return (rec, etag) if sel.takes(rec) else None

    batch: list[str] = []
    with ThreadPoolExecutor(_THREADS) as pool:
        for inv in _folder_ids(ops, sel.since):
            batch.append(inv)
            if len(batch) >= BATCH:
                yield from (got for got in pool.map(one, batch) if got is not None)
                batch = []
        yield from (got for got in pool.map(one, batch) if got is not None)


def retry_selected(ops: QueueOps, sel: Selection, dry_run: bool = False) -> Tally:
    """Rerun every invocation ``sel`` takes (none in a ``dry_run``, which only lists them).

    Raises:
        StoreError: the store failed while listing (reruns already written stay).
    """
    tally = Tally()

    def rerun(got: tuple[Record, str]) -> tuple[str, str]:
        rec, etag = got
        try:
            ops.rerun(rec, etag, only_if=sel.takes)
        except Conflict:
            return rec.id, "skipped"
        except LakeshoreError as e:
            return rec.id, str(e)
        return rec.id, "retried"

    picked: list[tuple[Record, str]] = []

    def flush(pool: ThreadPoolExecutor) -> None:
        for inv, what in pool.map(rerun, picked):
            if what == "retried":
                tally.retried.append(inv)
            elif what == "skipped":
                tally.skipped.append(inv)
            else:
                tally.errors[inv] = what
        picked.clear()

    with ThreadPoolExecutor(_THREADS) as pool:
        for got in selected(ops, sel):
            if dry_run:
                tally.retried.append(got[0].id)
                continue
            picked.append(got)
            if len(picked) >= BATCH:
                flush(pool)
        flush(pool)
    return tally
