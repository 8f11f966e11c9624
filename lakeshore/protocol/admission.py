"""Admission: ``max_depth`` and ``rate_limit`` held for every producer together, with nothing
but the bucket.

Depth is counted by slots: a submit creates one of the D slot objects ``_slots/<n>``
(create-only) before its invocation exists, and the slot goes when the invocation ends, so
there are never more than D live invocations, whatever the number of producers. Rate is
counted by window tokens: at most N create-only tokens per window of the store's clock. A
submit pays one LIST and one PUT per limit, never a scan of the queue. A slot names its
holder, for the repair; producers never read one (their policy denies it).

A leaked slot (a crash between an invocation's end and its slot's delete) only makes the queue
look fuller. Workers (``repair_slots``) and gc (``sweep_slots``) free it on the etag it was
listed with, once its holder is terminal or fenced by a tombstone: the slot of a live
invocation is never freed. Producers delete admission objects only. Details and costs:
docs/admission.md#how-exact-and-how-it-works.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    LakeshoreError,
    NotFound,
    QueueFull,
    RecordError,
    TooLarge,
)
from lakeshore.keys import QueueKeys, check_id
from lakeshore.protocol.steps import MAX_SMALL_BYTES, QueueOps
from lakeshore.store.base import CREATE, ObjectInfo

__all__ = [
    "SLOT_REPAIR_AGE_S",
    "AdmissionSlot",
    "acquire_rate",
    "acquire_slot",
    "admit",
    "give_back_rate",
    "rate_text",
    "repair_slots",
    "sweep_rate",
    "sweep_slots",
]

SLOT_REPAIR_AGE_S = 30.0  # younger slots are not checked for leaks (their submit may be running)
_REPAIR_SAMPLE = 4  # the oldest slots a worker's repair looks at (a leak is older than most)
_TRIES = 8


@dataclass(frozen=True)
class AdmissionSlot:
    """The admission slot a submit took: ``_slots/<n>`` and the etag it was created with."""

    n: int
    etag: str


def acquire_slot(ops: QueueOps, inv: str, max_depth: int) -> AdmissionSlot | None:
    """Take a free slot for ``inv``; None when all ``max_depth`` are taken. It reads no slot:
    a leaked one is freed by workers and gc (``repair_slots``, ``sweep_slots``)."""
    for _ in range(_TRIES):
        infos = list(ops.store.list(ops.keys.slots_prefix))
        taken = {int(QueueKeys.id_of(i.key)) for i in infos}
        free = _free(taken, max_depth)
        if not free:
            return None
        body = f"{inv} {secrets.token_hex(4)}".encode()
        for n in free:
            try:
                return AdmissionSlot(n, ops.store.put(ops.keys.slot(n), body, CREATE))
            except Conflict:
                continue
    return None


def _free(taken: set[int], limit: int) -> list[int]:
    """Up to a few free numbers below ``limit``, in random order (racing producers spread out)
    — without building a list of ``limit`` numbers when most are free."""
    if len(taken) >= limit:
        return []
    if len(taken) < limit // 2:
        picks: set[int] = set()
        while len(picks) < min(_TRIES, limit - len(taken)):
            n = random.randrange(limit)
            if n not in taken:
                picks.add(n)
        return list(picks)
    free = [n for n in range(limit) if n not in taken]
    random.shuffle(free)
    return free[:_TRIES]


def repair_slots(ops: QueueOps, now: float) -> list[str]:
    """Free the leaked slots among the oldest few of the queue (what workers run now and
    then, for the queues they serve). Returns the slot keys freed.

    Raises:
        StoreError: the store failed (what was freed so far stays freed).
    """
    return _repair(ops, list(ops.store.list(ops.keys.slots_prefix)), now)


def sweep_slots(ops: QueueOps, now: float, dry_run: bool = False) -> list[str]:
    """Free every leaked slot of the queue older than ``SLOT_REPAIR_AGE_S`` (what
    ``lakeshore gc`` runs): the rule of ``repair_slots``, applied to all of them. Returns the
    slot keys freed (with ``dry_run``: the terminal or record-less holders' slots, nothing
    fenced or freed).

    Raises:
        StoreError: the store failed (what was freed so far stays freed).
    """
    infos = list(ops.store.list(ops.keys.slots_prefix))
    return _repair(ops, infos, now, len(infos), dry_run)


def _repair(
    ops: QueueOps,
    infos: list[ObjectInfo],
    now: float,
    sample: int = _REPAIR_SAMPLE,
    dry_run: bool = False,
) -> list[str]:
    """Free leaked slots among the oldest ``sample``; the keys of those freed.

    A slot is leaked when its invocation is terminal, or has no record. No record may also
    mean a submit that is only slow (producer uploads, a stalled process): before freeing
    such a slot, the holder's id is fenced with a tombstone record (create-only), so that
    submit can no longer create its record and raises instead. If the tombstone loses, the
    record landed meanwhile and is judged like any other."""
    old = sorted(
        (i for i in infos if i.last_modified < now - SLOT_REPAIR_AGE_S),
        key=lambda i: i.last_modified,
    )
    freed: list[str] = []
    for info in old[:sample]:
        try:
            body, etag = ops.store.get(info.key, max_bytes=MAX_SMALL_BYTES)
        except NotFound:
            continue  # freed meanwhile
        except TooLarge:
            body, etag = b"", info.etag  # not a slot a submit wrote: freed below
        except LakeshoreError:
            continue
        if _bare(etag) != _bare(info.etag):
            # freed and taken again since the listing: the age listed is not its holder's,
            # whose submit may be milliseconds old (fencing it would fail a healthy submit)
            continue
        holder = _holder(body)
        if holder is None:
            leaked = True  # not written by a submit (a submit writes "<id> <nonce>" at once)
        else:
            try:
                leaked = _ended(ops, holder, now, dry_run)
            except (RecordError, LakeshoreError):
                continue
        if leaked and dry_run:
            freed.append(info.key)
        elif leaked:
            # on the etag listed: a slot freed and taken again meanwhile is another's
            with contextlib.suppress(Conflict):
                ops.store.delete(info.key, if_match=info.etag)
                freed.append(info.key)
    return freed


def _bare(etag: str) -> str:
    """An etag as compared: servers may quote it, or mark it weak, in one answer and not in
    another."""
    return etag.removeprefix("W/").strip('"')


def _holder(body: bytes) -> str | None:
    """The invocation id a slot object names, or None when it names none."""
    try:
        return check_id(body.decode("ascii").split(" ")[0])
    except (UnicodeDecodeError, InvalidArgument):
        return None


def _ended(ops: QueueOps, holder: str, now: float, dry_run: bool = False) -> bool:
    """True when the slot's invocation is terminal or can no longer be created (with
    ``dry_run``: or would not be, once fenced)."""
    try:
        return ops.read(holder)[0].terminal
    except NotFound:
        if dry_run:
            return True
    if ops.fence(holder, now, "its admission slot was older than 30 s with no record"):
        return True
    try:  # the record landed after all
        return ops.read(holder)[0].terminal
    except NotFound:
        return True  # and is gone again (gc): nothing is live under this slot


def acquire_rate(ops: QueueOps, limit: int, period: int, now: float) -> tuple[str, str] | float:
    """Take a token of the current window: ``(key, etag)``, or the store time at which the
    next window opens when this one is spent. A token names no invocation: its body is a
    random nonce (unique, so the etag it is given back on is its own)."""
    window = int(now // period)
    prefix = ops.keys.rate_window_prefix(window)
    for _ in range(_TRIES):
        taken = {int(QueueKeys.id_of(i.key)) for i in ops.store.list(prefix)}
        free = _free(taken, limit)
        if not free:
            return float((window + 1) * period)
        for n in free:
            key = ops.keys.rate_token(window, n)
            try:
                return key, ops.store.put(key, secrets.token_hex(8).encode(), CREATE)
            except Conflict:
                continue
    return float((window + 1) * period)


def give_back_rate(ops: QueueOps, token: tuple[str, str] | None) -> None:
    """Return a token when the submit it admitted did not happen after all."""
    if token is not None:
        with contextlib.suppress(Conflict):
            ops.store.delete(token[0], if_match=token[1])


def sweep_rate(ops: QueueOps, now: float, keep_s: float = 7200.0) -> int:
    """Delete rate tokens of windows that ended more than ``keep_s`` ago (any period up to an
    hour stays countable). Returns how many were deleted."""
    gone = 0
    for info in ops.store.list(ops.keys.rate_prefix):
        if info.last_modified >= now - keep_s:
            break  # tokens list oldest window first
        ops.store.delete(info.key)
        gone += 1
    return gone


def rate_text(rate: tuple[int, int]) -> str:
    """``(5, 1)`` -> ``"5/s"``, ``(600, 60)`` -> ``"600/min"``, ``(9, 3600)`` -> ``"9/h"``."""
    count, period = rate
    unit = {1: "s", 60: "min", 3600: "h"}.get(period, f"{period}s")
    return f"{count}/{unit}"


def admit(
    ops: QueueOps,
    inv: str,
    max_depth: int | None,
    rate: tuple[int, int] | None,
    on_full: str,
    wait_s: float,
    now: Callable[[], float],
) -> tuple[AdmissionSlot | None, tuple[str, str] | None]:
    """Take what the queue's admission block asks for: a rate token, then a slot.

    Raises:
        QueueFull: no room (``on_full="reject"``), or none came within ``wait_s`` ("block").
    """
    deadline = time.monotonic() + wait_s
    delay = 0.01
    while True:
        token: tuple[str, str] | None = None
        reason, limit, text, what = "", 0, "", ""
        if rate is not None:
            got = acquire_rate(ops, rate[0], rate[1], now())
            if isinstance(got, tuple):
                token = got
            else:
                reason, limit, text = "rate_limit", rate[0], rate_text(rate)
                what = f"rate limit reached ({text})"
        if not reason and max_depth is not None:
            slot = acquire_slot(ops, inv, max_depth)
            if slot is None:
                give_back_rate(ops, token)
                reason, limit, text = "max_depth", max_depth, str(max_depth)
                what = f"the queue is full (max_depth = {max_depth})"
            else:
                return slot, token
        elif not reason:
            return None, token
        if on_full == "reject" or time.monotonic() >= deadline:
            waited = "" if on_full == "reject" else f" after waiting {wait_s:g} s"
            raise QueueFull(
                f"submit to {ops.keys.queue}",
                f"{what}{waited}",
                "retry later, raise the limit (lakeshore queue set), or use on_full='block'",
                queue=ops.keys.queue,
                reason=reason,
                limit=limit,
                limit_text=text,
            )
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))  # waiting for room
        delay = min(delay * 2, 0.5)
