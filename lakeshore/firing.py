"""Firing schedules: each due slot becomes one keyed submit, whoever fires it and however
many fire it at once.

A firer reads the schedule object, takes the slot the catch-up rule picks (the latest that
is due by its store clock), applies the overlap policy (with ``skip``, a slot whose previous
invocation is still live is skipped), submits the call with the idempotency key
``schedule/<name>/<slot>``, and then moves the object on to the next slot by
compare-and-swap. The key makes the submit the same one invocation for every firer of that
slot, also for one that crashed after submitting and before moving the object: the next
firer submits the same key and gets the same id. A firer that loses the compare-and-swap
reads the object again and merges its slot in; it never moves the object back.

The firer never imports the function: it submits the stored ``module:qualname`` with the
stored arguments, and a worker runs the invocation only if it declared that body.

Three kinds of firer share :func:`fire`: ``lakeshore schedule tick`` (:func:`tick`, from cron,
scrontab or a serverless timer), workers serving the queue (:class:`Watch`, a thread of
``run_worker``), and tests. Rules and costs: docs/schedules.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lakeshore import codec
from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    LakeshoreError,
    NewerRecord,
    NotFound,
    RecordError,
)
from lakeshore.keys import DEFAULT_QUEUE, QueueKeys, check_name
from lakeshore.model.cron import describe
from lakeshore.model.record import LIVE
from lakeshore.model.schedule import Schedule, check_options, slot_key
from lakeshore.plane import HasPlane, Plane, plane_of
from lakeshore.protocol.gc import queue_names
from lakeshore.protocol.schedules import ScheduleObjects
from lakeshore.running.bodies import Declared, function_ref
from lakeshore.running.failure import RetryOptions
from lakeshore.submit import prepare_call, publish_prepared
from lakeshore.text import inert

__all__ = [
    "LIST_EVERY_S",
    "Fired",
    "Watch",
    "define",
    "fire",
    "read_schedules",
    "remove",
    "set_schedule",
    "tick",
]

log = logging.getLogger("lakeshore.worker")

LIST_EVERY_S = 60.0  # how often a worker lists its queues' schedules: new ones show up then
RETRY_S = 30.0  # a schedule whose firing failed (store down, queue full) is tried again then
JITTER_S = 1.0  # workers fire up to this long after a slot, at random, so they rarely collide
_SUBMIT_WAIT_S = 5.0  # a firing into a full blocking queue waits no longer than this
_ROUNDS = 16  # compare-and-swaps lost in a row before a firer leaves the object to others
# the retry options of a submit, in the order of RetryOptions' fields
_RULE = ("retry_for", "no_retry_for", "retry_backoff_s", "retry_backoff_cap_s", "retry_jitter")


@dataclass(frozen=True)
class Fired:
    """What one firer did with one schedule.

    Attributes:
        queue, name: the schedule.
        action: ``"fired"`` (``id`` is the slot's invocation; every firer of the slot gets
            the same one), ``"skipped"`` (the previous invocation was still live),
            ``"idle"`` (no slot due), ``"gone"`` (removed meanwhile), ``"unreadable"`` (not
            a schedule this version can use: ``error`` says why), ``"failed"`` (the submit
            or the store failed: ``error`` says why; the slot stays due).
        slot: the slot acted on (epoch seconds), if any.
        id: the slot's invocation, when fired.
        missed: due slots before ``slot`` the catch-up rule passed over, this time.
        next_slot: the next slot the object names after this (None: none, or unknown).
        etag: the object's etag as this firer last saw it.
        error: why, for ``unreadable`` and ``failed``.
    """

    queue: str
    name: str
    action: str
    slot: int | None = None
    id: str | None = None
    missed: int = 0
    next_slot: int | None = None
    etag: str | None = None
    error: str | None = None


# -- defining -----------------------------------------------------------------------------------


def define(
    plane: Plane | HasPlane,
    name: str,
    fn: Declared | str,
    args: Iterable[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    cron: str | None = None,
    every: float | timedelta | None = None,
    tz: str = "UTC",
    overlap: str = "allow",
    start: datetime | float | None = None,
    queue: str | None = None,
    **options: Any,
) -> Schedule:
    """A schedule's definition, checked (nothing is written). ``fn`` is a declared function
    (its queue, submit defaults and retry rule come along, under the ``options`` given) or
    ``"module:qualname"``. ``options`` are a submit's: ``priority``, ``max_attempts``,
    ``timeout_s``, ``deadline_s`` and the retry rule (``retry_for``, ``no_retry_for`` as
    exception classes or names, ``retry_backoff_s``, ``retry_backoff_cap_s``,
    ``retry_jitter``).

    Raises:
        InvalidArgument: anything that breaks a rule (docs/schedules.md).
    """
    op = f"schedule {name}"
    check_name(name, "schedule")
    args, kwargs = tuple(args), dict(kwargs or {})
    rule = RetryOptions.given(op, **{k: options.pop(k) for k in _RULE if k in options})
    if isinstance(fn, Declared):
        try:
            ref = function_ref(fn.fn)
        except InvalidArgument:
            raise InvalidArgument(
                op,
                f"{fn.ref.partition('#')[0]} has no importable name (a lambda or a nested "
                "function), and a schedule names its function",
                "define it at module level",
            ) from None
        if queue is not None and queue != fn.queue:
            raise InvalidArgument(
                op, f"{ref} is declared for queue {fn.queue!r}, not {queue!r}", "leave queue out"
            )
        queue = fn.queue
        defaults: dict[str, Any] = {"priority": fn.priority, "max_attempts": fn.max_attempts}
        defaults["timeout_s"] = fn.timeout_s
        options = {**{k: v for k, v in defaults.items() if v is not None}, **options}
        rule = rule.over(fn.retry)  # as for a submit: the call's rule over the function's
        if fn.signature is not None:
            try:
                fn.signature.bind(*args, **kwargs)
            except TypeError as e:
                raise InvalidArgument(
                    op, f"the arguments do not fit {ref}: {e}", "fix the arguments"
                ) from None
    elif isinstance(fn, str):
        ref = fn
    else:
        raise InvalidArgument(
            op, f"fn is a {type(fn).__name__}", "give a @udf function or 'module:qualname'"
        )
    rules = dict(zip(_RULE, dataclasses.astuple(rule), strict=True))
    opts = check_options({**options, **rules}, op)
    if isinstance(every, timedelta):
        every = every.total_seconds()
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int | float) or every != int(every):
            raise InvalidArgument(
                op, f"every={every!r} is not a whole number of seconds", "e.g. every=300"
            )
        every = int(every)
    return Schedule(
        name=name,
        queue=check_name(queue or DEFAULT_QUEUE, "queue"),
        fn=ref,
        args=codec.encode((args, kwargs), f"arguments of schedule {name}"),
        cron=cron,
        every=every,
        tz=tz,
        overlap=overlap,
        start=_epoch(start, op) if start is not None else 0,
        **opts,
    ).check(op)


def _epoch(start: datetime | float, op: str) -> int:
    if isinstance(start, datetime):
        if start.tzinfo is None:
            raise InvalidArgument(
                op, "start is a naive datetime", "give an aware one (tzinfo=...) or an epoch"
            )
        return math.ceil(start.timestamp())
    if isinstance(start, bool) or not isinstance(start, int | float) or not math.isfinite(start):
        raise InvalidArgument(op, f"start={start!r} is not a time", "give a datetime or epoch")
    return math.ceil(start)


def set_schedule(plane: Plane | HasPlane, new: Schedule) -> Schedule:
    """Create the schedule, or replace the definition of the one of that name. A replaced
    schedule keeps its firing state when its slots stay the same; otherwise its next slot
    is the new definition's first at or after now, and after the last slot fired. An
    unset ``start`` (0) is the time it was first set, kept across replacements.

    Raises:
        InvalidArgument: a bad definition. NewerRecord: a newer lakeshore's schedule is
            there (left alone). Conflict: the object kept changing under this write.
        StoreError: the store failed (an unreadable object in its place is replaced).
    """
    p = plane_of(plane)
    objs = ScheduleObjects(p.store, QueueKeys(p.ns, new.queue))
    for _ in range(_ROUNDS):
        now = p.store.now()
        try:
            old, etag = objs.read(new.name)
        except NotFound:
            old, etag = None, None
        except NewerRecord:
            raise
        except RecordError:
            old, etag = None, _etag_of(objs, new.name)  # junk in its place: replaced
        sched = new
        if new.start == 0:
            sched = dataclasses.replace(new, start=old.start if old else math.ceil(now))
        sched = dataclasses.replace(sched, set_at=now)
        if old is not None:
            sched = old.redefined(sched, now)
        else:
            sched = dataclasses.replace(sched, next_slot=sched.first_slot(now))
        try:
            written, _ = objs.write(sched, etag)
            return written
        except Conflict:
            continue  # changed or created meanwhile: merge onto what is there now
    raise Conflict(
        f"schedule {new.name}",
        f"the object changed under this write {_ROUNDS} times in a row",
        "something rewrites it all the time; look at who does, then set it again",
    )


def _etag_of(objs: ScheduleObjects, name: str) -> str | None:
    for listed in objs.list():
        if listed.name == name:
            return listed.etag
    return None


def remove(plane: Plane | HasPlane, queue: str, name: str) -> bool:
    """Remove a schedule; False if there was none. Its invocations so far are not touched.

    Raises:
        InvalidArgument: a bad name. StoreError: the store failed.
    """
    p = plane_of(plane)
    return ScheduleObjects(p.store, QueueKeys(p.ns, queue)).remove(name)


def read_schedules(
    plane: Plane | HasPlane, queues: list[str] | None = None
) -> list[Schedule | Fired]:
    """Every schedule of ``queues`` (default: every queue of the namespace), read; one that
    cannot be read comes back as a ``Fired`` with action ``unreadable``, never stops the
    listing.

    Raises:
        StoreError: a listing failed.
    """
    p = plane_of(plane)
    out: list[Schedule | Fired] = []
    for queue in queues if queues is not None else list(queue_names(p.store, p.ns)):
        objs = ScheduleObjects(p.store, QueueKeys(p.ns, queue))
        for listed in objs.list():
            try:
                out.append(objs.read(listed.name)[0])
            except NotFound:
                continue
            except RecordError as e:
                out.append(Fired(queue, listed.name, "unreadable", error=e.what))
    return out


# -- firing -------------------------------------------------------------------------------------


class _Named(Declared):
    """The stand-in body of a slot's submit: the stored function name, never imported."""

    def __init__(self, ref: str, queue: str) -> None:
        super().__init__(_call, False, queue=queue)
        self.ref = ref


def _call(*args: Any, **kwargs: Any) -> None:
    """What a slot's submit binds its arguments to (the input hash): anything."""


def fire(plane: Plane | HasPlane, queue: str, name: str) -> Fired:
    """Fire the due slot of one schedule, if any (see the module docstring).

    Raises:
        StoreError: the store failed before anything was submitted or recorded (a submit
            that failed is reported as ``failed``: the slot stays due).
    """
    p = plane_of(plane)
    objs = ScheduleObjects(p.store, QueueKeys(p.ns, queue))
    try:
        sched, etag = objs.read(name)
    except NotFound:
        return Fired(queue, name, "gone")
    except RecordError as e:
        return Fired(queue, name, "unreadable", error=e.what)
    slot = sched.due(p.store.now())
    if slot is None:
        return Fired(queue, name, "idle", next_slot=sched.next_due, etag=etag)
    missed = sched.missed_before(slot)
    if sched.overlap == "skip" and sched.last_id is not None and _live(p, queue, sched.last_id):
        return _record(objs, sched, etag, slot, None, missed)
    try:
        pos, kw = sched.call()
        prep = prepare_call(
            p,
            _Named(sched.fn, queue),
            pos,
            kw,
            key=slot_key(name, slot),
            submit_timeout=_SUBMIT_WAIT_S,
            **sched.options,
        )
        inv = publish_prepared(prep)
    except LakeshoreError as e:
        return Fired(queue, name, "failed", slot, error=str(e), etag=etag)
    return _record(objs, sched, etag, slot, inv, missed)


def _live(plane: Plane, queue: str, inv: str) -> bool:
    """Whether the invocation ``inv`` is queued or running (an unreadable or missing one is
    not: it holds nothing back)."""
    try:
        return plane.ops(queue).read(inv)[0].state in LIVE
    except (NotFound, RecordError):
        return False


def _record(
    objs: ScheduleObjects,
    sched: Schedule,
    etag: str,
    slot: int,
    inv: str | None,
    missed: int,
) -> Fired:
    """Move the object past ``slot`` (fired as ``inv``, or skipped when None), merging onto
    whatever another writer put there meanwhile; never moving it back."""
    queue, name = sched.queue, sched.name
    action = "fired" if inv is not None else "skipped"
    for _ in range(_ROUNDS):
        new = sched.fired_slot(slot, inv, objs.store.now()) if inv else sched.skipped_slot(slot)
        try:
            written, etag = objs.write(new, etag)
            return Fired(queue, name, action, slot, inv, missed, written.next_due, etag)
        except Conflict:
            pass
        try:
            sched, etag = objs.read(name)
        except NotFound:
            return Fired(queue, name, action, slot, inv, missed)  # removed: nothing to move
        except RecordError as e:
            return Fired(queue, name, action, slot, inv, missed, error=e.what)
        done = sched.last_slot is not None and sched.last_slot >= slot
        if done or (inv is None and sched.next_slot is not None and sched.next_slot > slot):
            # another firer recorded this slot (with the same id: the key) or a later one
            return Fired(queue, name, action, slot, inv, missed, sched.next_due, etag)
    return Fired(queue, name, action, slot, inv, missed, etag=etag, error="object kept changing")


def tick(plane: Plane | HasPlane, queues: list[str] | None = None) -> list[Fired]:
    """Fire every due slot of the schedules of ``queues`` (default: every queue of the
    namespace, which needs the right to list it) once, and return what was done with each.
    A schedule that fails is reported, and the others are still fired.

    Raises:
        StoreError: a listing failed.
    """
    p = plane_of(plane)
    done: list[Fired] = []
    for queue in queues if queues is not None else list(queue_names(p.store, p.ns)):
        for listed in ScheduleObjects(p.store, QueueKeys(p.ns, queue)).list():
            try:
                done.append(fire(p, queue, listed.name))
            except LakeshoreError as e:
                done.append(Fired(queue, listed.name, "failed", error=str(e)))
    return done


# -- a worker's firer ---------------------------------------------------------------------------


@dataclass
class _Seen:
    etag: str | None
    fire_at: float | None  # store time after which this worker fires it; None: never
    retry_at: float = 0.0  # monotonic; after a failure


class Watch:
    """A worker's firer for the schedules of its queues: it lists them at start and then
    every ``list_every`` seconds (never per poll), reads an object only when its etag is
    new, remembers each one's next slot, and reads and fires a schedule only once that slot
    is due (plus up to ``jitter_s`` at random, so that workers rarely fire together).
    ``step`` does what is due and says how long to wait; ``run`` loops on it in a thread.
    """

    def __init__(
        self,
        plane: Plane | HasPlane,
        queues: list[str],
        *,
        list_every: float = LIST_EVERY_S,
        jitter_s: float = JITTER_S,
        ticks: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plane = plane_of(plane)
        self.queues = list(queues)
        self.list_every, self.jitter_s, self.ticks = list_every, jitter_s, ticks
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._listed_at: float | None = None
        self._said: set[tuple[str, str, str | None]] = set()  # unreadable ones, said once

    def step(self) -> float:
        """List if it is time, fire what is due; the seconds until the next thing to do."""
        t = self.ticks()
        if self._listed_at is None or t - self._listed_at >= self.list_every:
            self._listed_at = t
            for queue in self.queues:
                self._list(queue)
        store = self.plane.store
        now = store.now()
        for (queue, name), seen in list(self._seen.items()):
            if seen.fire_at is None or seen.fire_at > now or seen.retry_at > t:
                continue
            try:
                done = fire(self.plane, queue, name)
            except LakeshoreError as e:
                done = Fired(queue, name, "failed", error=str(e))
            self._learn(done, t)
            now = store.now()
        wait = self.list_every - (self.ticks() - self._listed_at)
        for seen in self._seen.values():
            if seen.fire_at is not None:
                ahead = max(seen.fire_at - now, seen.retry_at - t)
                wait = min(wait, ahead)
        return max(wait, 0.01)

    def run(self, stop: threading.Event) -> None:
        """Fire due slots until ``stop`` is set; never raises (a failure is logged and
        tried again later)."""
        while not stop.is_set():
            try:
                wait = self.step()
            except Exception:  # a bug must not end the worker: log it, go on in a while
                log.exception("firing schedules failed unexpectedly")
                wait = RETRY_S
            stop.wait(wait)

    def _list(self, queue: str) -> None:
        objs = ScheduleObjects(self.plane.store, QueueKeys(self.plane.ns, queue))
        try:
            listed = objs.list()
        except LakeshoreError as e:
            log.warning("listing the schedules of %s failed: %s", queue, e)
            return
        names = {x.name for x in listed}
        for key in [k for k in self._seen if k[0] == queue and k[1] not in names]:
            del self._seen[key]  # removed
        for x in listed:
            seen = self._seen.get((queue, x.name))
            if seen is not None and seen.etag == x.etag:
                continue  # unchanged since this worker last read it: no GET
            try:
                sched, etag = objs.read(x.name)
            except NotFound:
                continue
            except RecordError as e:
                self._say_unreadable(queue, x.name, e.what, x.etag)
                self._seen[(queue, x.name)] = _Seen(x.etag, None)
                continue
            except LakeshoreError as e:
                log.warning("reading schedule %s of %s failed: %s", x.name, queue, e)
                continue
            self._seen[(queue, x.name)] = _Seen(etag, self._fire_at(sched.next_due))

    def _learn(self, done: Fired, t: float) -> None:
        key = (done.queue, done.name)
        if done.action == "gone":
            self._seen.pop(key, None)
            return
        if done.action == "unreadable":
            self._say_unreadable(done.queue, done.name, done.error, done.etag)
            self._seen[key] = _Seen(done.etag, None)
            return
        if done.action in ("fired", "skipped"):
            log.info(
                "schedule %s of %s: slot %s %s%s",
                done.name,
                done.queue,
                describe(done.slot) if done.slot is not None else "?",
                done.action,
                f" as {done.id}" if done.id else "",
            )
        stuck = done.action == "idle" and (
            done.next_slot is not None and done.next_slot <= self.plane.store.now()
        )
        if done.action == "failed" or done.etag is None or stuck:
            # the slot stays due (or its object kept changing): read it again in a while
            log.warning(
                "schedule %s of %s: %s; trying again in %g s",
                done.name,
                done.queue,
                inert(done.error or ("nothing to fire" if stuck else "its object kept changing")),
                RETRY_S,
            )
            self._seen.setdefault(key, _Seen(None, None)).retry_at = t + RETRY_S
            return
        self._seen[key] = _Seen(done.etag, self._fire_at(done.next_slot))

    def _fire_at(self, slot: int | None) -> float | None:
        return None if slot is None else slot + random.random() * self.jitter_s

    def _say_unreadable(self, queue: str, name: str, why: str | None, etag: str | None) -> None:
        if (queue, name, etag) not in self._said:
            self._said.add((queue, name, etag))
            log.warning("schedule %s of %s is left alone: %s", name, queue, inert(why or "?"))
