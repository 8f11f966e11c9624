"""The schedule object: what a schedule fires, when, and what it fired last. Pure: no store.

One msgpack map per schedule (``lakeshore/<ns>/<queue>/_schedules/<name>``, written by
:mod:`lakeshore.protocol.schedules`). It holds the definition (the function's name, the call's
encoded arguments, the submit options, a cron expression or an interval, the zone, the
overlap policy, the start) and the firing state (the next slot, the last one fired, its id,
counts). Every write changes its bytes (``rev`` and a fresh ``wid``), so an etag never comes
back.

Timing rules, here so every firer applies the same ones (docs/schedules.md):

* **Slots.** A cron schedule's slots are the whole minutes its expression matches in its
  zone, from ``start`` on; an interval schedule's are ``start + k * every``, k >= 0.
* **Catch-up.** A firer that finds ``next_slot`` due fires the *latest* slot that is due by
  its store clock; the due slots before it are counted as missed, not fired.
* **Overlap.** With ``overlap="skip"`` a slot whose previous invocation is still live is
  skipped (counted), not fired.
* **Monotone state.** ``next_slot`` and ``last_slot`` only move forward: a slot at or before
  ``last_slot`` is never fired again by this object.

Anything read from the store may be hostile: :meth:`Schedule.from_bytes` checks every field
against its bounds and refuses the rest with ``RecordError``.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass
from typing import Any

from lakeshore import codec
from lakeshore.codec import pack_plain, unpack_plain
from lakeshore.errors import InvalidArgument, LakeshoreError, NewerRecord, RecordError
from lakeshore.keys import MAX_PRIORITY, MIN_PRIORITY, check_id, is_name
from lakeshore.model import cron as crons
from lakeshore.model.record import LIMITS, MAX_COUNT
from lakeshore.model.retry import MAX_NAMES, name_problem, number_problem

__all__ = [
    "MAX_ARGS_BYTES",
    "MAX_EVERY_S",
    "MAX_OBJECT_BYTES",
    "MIN_EVERY_S",
    "OVERLAP",
    "SCHEMA_VERSION",
    "Schedule",
    "check_options",
    "slot_key",
]

SCHEMA_VERSION = 1
OVERLAP = ("allow", "skip")
MIN_EVERY_S = 10  # below this a queue is better served by a loop in a body
MAX_EVERY_S = 366 * 86400  # longer periods are a cron expression's ("@yearly")
MAX_ARGS_BYTES = 64 * 1024  # every firer reads the object: large inputs belong in files
MAX_OBJECT_BYTES = MAX_ARGS_BYTES + 16 * 1024
_MAX_TIME = 32503680000  # the year 3000: a slot or a time beyond it is not one we wrote
_MAX_TALLY = 2**53
_MISSED_WALK = 10_000  # a catch-up counts at most this many missed cron slots one by one
# the retry rule (docs/retries.md), as a record keeps it: type names and numbers; None is
# unset (the slot's submit then takes the queue's and the plane's defaults). Left out of the
# object's bytes when unset, so a schedule without a rule is stored as before it had them.
_RETRY_NAMES = (
    "retry_for",
    "no_retry_for",
    "retry_backoff_s",
    "retry_backoff_cap_s",
    "retry_jitter",
)
_OPTION_NAMES = ("priority", "max_attempts", "timeout_s", "deadline_s", *_RETRY_NAMES)


def slot_key(name: str, slot: int) -> str:
    """The idempotency key of a slot's submit: ``schedule/<name>/<slot in UTC>``. Every firer
    of that slot uses it, so they all get the same one invocation."""
    return f"schedule/{name}/{crons.describe(slot)}"


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _positive(x: object) -> bool:
    """None (unset), or a finite number above zero."""
    return x is None or (_finite(x) and x > 0)  # type: ignore[operator]


def _time(x: object) -> bool:
    return _finite(x) and 0 <= x <= _MAX_TIME  # type: ignore[operator]


def _count(x: object) -> bool:
    return type(x) is int and 0 <= x <= _MAX_TALLY


def check_options(options: dict[str, Any], op: str) -> dict[str, Any]:
    """The submit options a schedule may carry, checked: ``priority`` 0-9,
    ``max_attempts`` >= 1, finite positive ``timeout_s`` and ``deadline_s``, and the retry
    rule as a record keeps it (``retry_for`` and ``no_retry_for`` tuples of at most 32 type
    names, the backoff numbers in their ranges: :mod:`lakeshore.model.retry`); None for unset.

    Raises:
        InvalidArgument: an unknown option or a value out of range.
    """
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        raise InvalidArgument(
            op,
            f"unknown option(s) {', '.join(unknown)}",
            f"a schedule takes {', '.join(_OPTION_NAMES)}",
        )
    out = {k: options.get(k) for k in _OPTION_NAMES}
    p, a = out["priority"], out["max_attempts"]
    bad = (
        (p is not None and not (type(p) is int and MIN_PRIORITY <= p <= MAX_PRIORITY))
        or (a is not None and not (type(a) is int and 1 <= a <= MAX_COUNT))
        or any(not _positive(out[k]) for k in ("timeout_s", "deadline_s"))
    )
    if bad:
        shown = {k: out[k] for k in _OPTION_NAMES if k not in _RETRY_NAMES}
        raise InvalidArgument(
            op,
            f"options out of range: {shown}",
            f"use priority {MIN_PRIORITY}-{MAX_PRIORITY}, max_attempts >= 1, and finite "
            "positive timeout_s and deadline_s",
        )
    problem = _retry_problem(out)
    if problem is not None:
        raise InvalidArgument(
            op,
            f"retry rule out of range: {problem}",
            "give retry_for / no_retry_for as exception classes or 'module.QualName' names, "
            "and the backoff numbers within their ranges (docs/retries.md)",
        )
    return out


def _retry_problem(out: dict[str, Any]) -> str | None:
    """What is wrong with the retry rule of checked options, if anything (the bounds of a
    record's own fields: ``lakeshore.model.record``)."""
    for k in ("retry_for", "no_retry_for"):
        names = out[k]
        if names is None:
            continue
        if type(names) is not tuple or len(names) > MAX_NAMES:
            shown = type(names).__name__ if type(names) is not tuple else f"{len(names)} names"
            return f"{k} must be a list of at most {MAX_NAMES} type names, got {shown}"
        for item in names:
            problem = name_problem(item)
            if problem is not None:
                return f"{k} holds a type name that {problem}"
    for k in ("retry_backoff_s", "retry_backoff_cap_s", "retry_jitter"):
        if out[k] is not None:
            problem = number_problem(k, out[k])
            if problem is not None:
                return f"{k} {problem}"
    return None


def _check_fn(fn: object) -> bool:
    return (
        isinstance(fn, str)
        and ":" in fn
        and 0 < len(fn.encode("utf-8", "surrogatepass")) <= LIMITS["fn"]
        and not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in fn)
    )


@dataclass(frozen=True)
class Schedule:
    """A schedule: its definition and its firing state (docs/schedules.md; the fields:
    docs/record.md#the-schedule-object).

    Attributes:
        name, queue: where it lives; its invocations go to ``queue``.
        fn: the function its invocations run, ``"module:qualname"`` (a worker runs it only
            if it declared that body).
        args: the call's arguments, encoded by the codec as a submit encodes them.
        cron, every, tz: a cron expression in zone ``tz``, or an interval in seconds.
        overlap: ``"allow"``, or ``"skip"`` a slot while the previous invocation is live.
        start: no slot before it fires; an interval's slots are ``start + k * every``.
        priority, max_attempts, timeout_s, deadline_s: the submit options (None: defaults).
        retry_for, no_retry_for, retry_backoff_s, retry_backoff_cap_s, retry_jitter: the
            retry rule of each slot's submit (type names and numbers; None: not set here).
        next_slot: the earliest slot not yet fired, skipped or missed (None: no more slots).
        last_slot, last_id, fired_at: the slot fired last, its invocation, and when.
        fired, skipped, missed: how many slots were fired, skipped by the overlap policy,
            and passed over by the catch-up rule.
        set_at: when the definition was last set. rev, wid: write counter and write id.
    """

    name: str
    queue: str
    fn: str
    args: bytes
    cron: str | None
    every: int | None
    tz: str
    overlap: str
    start: int
    priority: int | None = None
    max_attempts: int | None = None
    timeout_s: float | None = None
    deadline_s: float | None = None
    retry_for: tuple[str, ...] | None = None
    no_retry_for: tuple[str, ...] | None = None
    retry_backoff_s: float | None = None
    retry_backoff_cap_s: float | None = None
    retry_jitter: float | None = None
    next_slot: int | None = None
    last_slot: int | None = None
    last_id: str | None = None
    fired_at: float | None = None
    fired: int = 0
    skipped: int = 0
    missed: int = 0
    set_at: float = 0.0
    rev: int = 0
    wid: str = ""

    # -- the definition ----------------------------------------------------------------------

    def check(self, op: str) -> Schedule:
        """Refuse a definition that breaks a rule; returns it.

        Raises:
            InvalidArgument: the first rule broken.
        """
        if not is_name(self.name) or not is_name(self.queue):
            raise InvalidArgument(
                op,
                f"bad schedule or queue name {self.name!r} / {self.queue!r}",
                "use 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit",
            )
        if not _check_fn(self.fn):
            raise InvalidArgument(
                op,
                f"{str(self.fn)[:80]!r} is not a function's name",
                "give a @udf function or 'module:qualname' (at most 1024 bytes)",
            )
        if len(self.args) > MAX_ARGS_BYTES:
            raise InvalidArgument(
                op,
                f"the encoded arguments are {len(self.args)} bytes, over {MAX_ARGS_BYTES}",
                "write large inputs to files (dls.run.write) and pass their keys",
            )
        if (self.cron is None) == (self.every is None):
            raise InvalidArgument(op, "give cron= or every=, not both or neither", "pick one")
        if self.cron is not None:
            crons.parse_cron(self.cron)
        elif not (type(self.every) is int and MIN_EVERY_S <= self.every <= MAX_EVERY_S):
            raise InvalidArgument(
                op,
                f"every={self.every!r} is not a whole number of seconds from {MIN_EVERY_S} to "
                f"{MAX_EVERY_S}",
                "use a cron expression for rarer slots, and a loop in a body for faster ones",
            )
        crons.check_tz(self.tz)
        if self.overlap not in OVERLAP:
            raise InvalidArgument(
                op, f"overlap={self.overlap!r} is not one of {OVERLAP}", "use 'allow' or 'skip'"
            )
        if not (type(self.start) is int and _time(self.start)):
            raise InvalidArgument(op, f"start={self.start!r} is out of range", "use a date")
        check_options(self.options, op)
        return self

    @property
    def options(self) -> dict[str, Any]:
        """The submit options the slots' invocations get (unset ones left out)."""
        every = {k: getattr(self, k) for k in _OPTION_NAMES}
        return {k: v for k, v in every.items() if v is not None}

    def call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments of each slot's call.

        Raises:
            DecodeError: the bytes are not a call's arguments.
        """
        return codec.decode_call(self.args, f"arguments of schedule {self.name}")

    def same_timing(self, other: Schedule) -> bool:
        """Whether ``other`` has the same slots (then its firing state carries over as is)."""
        return (self.cron, self.every, self.tz, self.start) == (
            other.cron,
            other.every,
            other.tz,
            other.start,
        )

    # -- slots -------------------------------------------------------------------------------

    def slot_after(self, t: float) -> int | None:
        """The first slot strictly after ``t``; None when the expression has no more."""
        if self.every is not None:
            if t < self.start:
                return self.start
            return self.start + (math.floor((t - self.start) / self.every) + 1) * self.every
        assert self.cron is not None
        return crons.next_slot(
            crons.parse_cron(self.cron), max(t, self.start - 1), crons.zone(self.tz)
        )

    def slot_at_or_before(self, t: float) -> int | None:
        """The last slot at or before ``t``; None when there is none since ``start``."""
        if t < self.start:
            return None
        if self.every is not None:
            return self.start + math.floor((t - self.start) / self.every) * self.every
        assert self.cron is not None
        found = crons.prev_slot(crons.parse_cron(self.cron), t, crons.zone(self.tz))
        return found if found is not None and found >= self.start else None

    def first_slot(self, now: float) -> int | None:
        """The first slot at or after ``now`` (a new schedule's ``next_slot``)."""
        return self.slot_after(math.ceil(now) - 1)

    @property
    def next_due(self) -> int | None:
        """The first slot this object may still fire: at or after ``next_slot`` and after
        ``last_slot`` (``next_slot`` itself, unless the object was written by hand)."""
        if self.next_slot is None:
            return None
        floor = self.next_slot
        if self.last_slot is not None:
            floor = max(floor, self.last_slot + 1)
        return self.slot_after(floor - 1)

    def due(self, now: float) -> int | None:
        """The slot a firer at store time ``now`` acts on: the latest slot that is due, and
        not before :attr:`next_due` (the catch-up rule); None when nothing is due."""
        first = self.next_due
        if first is None or first > now:
            return None
        return self.slot_at_or_before(now)

    def missed_before(self, slot: int) -> int:
        """How many slots from ``next_slot`` up to (not including) ``slot`` the catch-up
        rule passes over (a cron walk stops counting at 10,000)."""
        first = self.next_slot
        if first is None or slot <= first:
            return 0
        if self.every is not None:
            return max(0, math.ceil((slot - first) / self.every))
        n, t = 0, self.next_due
        while t is not None and t < slot and n < _MISSED_WALK:
            n, t = n + 1, self.slot_after(t)
        return n

    # -- firing state ------------------------------------------------------------------------

    def fired_slot(self, slot: int, inv: str, now: float) -> Schedule:
        """The state after firing ``slot`` as invocation ``inv`` (catch-up counted). Merged
        onto whatever the object holds: a state already past ``slot`` keeps its own slots."""
        missed = self.missed_before(slot)
        newer_last = self.last_slot is None or slot > self.last_slot
        return dataclasses.replace(
            self,
            next_slot=self._advance(slot),
            last_slot=slot if newer_last else self.last_slot,
            last_id=inv if newer_last else self.last_id,
            fired_at=now if newer_last else self.fired_at,
            fired=min(self.fired + 1, _MAX_TALLY),
            missed=min(self.missed + missed, _MAX_TALLY),
        )

    def skipped_slot(self, slot: int) -> Schedule:
        """The state after skipping ``slot`` (its previous invocation was still live)."""
        return dataclasses.replace(
            self,
            next_slot=self._advance(slot),
            skipped=min(self.skipped + 1, _MAX_TALLY),
            missed=min(self.missed + self.missed_before(slot), _MAX_TALLY),
        )

    def _advance(self, slot: int) -> int | None:
        if self.next_slot is not None and self.next_slot > slot:
            return self.next_slot  # someone moved it further already
        return self.slot_after(slot)

    def redefined(self, new: Schedule, now: float) -> Schedule:
        """``new``'s definition with this object's firing state: kept as is when the slots
        are the same, else the new definition's first slot at or after ``now`` and after the
        last slot fired (the old definition's due slots are dropped, never fired)."""
        state = dataclasses.replace(
            new,
            last_slot=self.last_slot,
            last_id=self.last_id,
            fired_at=self.fired_at,
            fired=self.fired,
            skipped=self.skipped,
            missed=self.missed,
            rev=self.rev,
        )
        if self.same_timing(new):
            return dataclasses.replace(state, next_slot=self.next_slot)
        after = max(math.ceil(now) - 1, self.last_slot if self.last_slot is not None else -1)
        return dataclasses.replace(state, next_slot=new.slot_after(after))

    # -- bytes -------------------------------------------------------------------------------

    def written(self) -> Schedule:
        """This schedule as its next write stores it: ``rev`` + 1 and a fresh ``wid``."""
        return dataclasses.replace(self, rev=self.rev + 1, wid=secrets.token_hex(8))

    def to_bytes(self) -> bytes:
        fields = dataclasses.asdict(self)
        for k in _RETRY_NAMES:
            if fields[k] is None:
                del fields[k]  # unset: stored as before the rule was a field
        return pack_plain({"v": SCHEMA_VERSION, **fields})

    @classmethod
    def from_bytes(cls, data: bytes, where: str, name: str, queue: str) -> Schedule:
        """Decode and check a schedule object read at ``where`` (it must be the one of
        ``name`` on ``queue``).

        Raises:
            NewerRecord: written by a newer lakeshore (left alone).
            RecordError: anything else that is not a schedule lakeshore wrote.
        """

        def bad(what: str) -> RecordError:
            return RecordError(
                f"read {where}",
                f"not a schedule lakeshore wrote: {what}",
                "set the schedule again (lakeshore schedule set), or remove it",
                key=where,
            )

        try:
            obj = unpack_plain(data)
        except Exception:
            raise bad("not msgpack") from None
        if type(obj) is not dict:
            raise bad("not a map")
        v = obj.get("v")
        if type(v) is int and v > SCHEMA_VERSION:
            raise NewerRecord(
                f"read {where}",
                f"schedule schema v{v} is newer than this lakeshore understands",
                "upgrade lakeshore to fire or change it",
                key=where,
            )
        if v != SCHEMA_VERSION:
            raise bad(f"schema version {v!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: obj[k] for k in known if k in obj}
        for k in ("retry_for", "no_retry_for"):
            if type(values.get(k)) is list:
                values[k] = tuple(values[k])  # msgpack reads back the tuple written as a list
        for k in ("name", "queue", "fn", "args", "tz", "overlap", "start"):
            if k not in values:
                raise bad(f"no {k}")
        try:
            sched = cls(**values)
        except TypeError as e:
            raise bad(str(e)) from None
        if sched.name != name or sched.queue != queue:
            raise bad(f"it names {str(sched.name)[:64]!r} on {str(sched.queue)[:64]!r}")
        if type(sched.args) is not bytes or type(sched.cron) not in (str, type(None)):
            raise bad("args or cron of a wrong type")
        try:
            sched.check(f"read {where}")
        except LakeshoreError as e:
            raise bad(e.what) from None
        problem = _state_problem(sched)
        if problem:
            raise bad(problem)
        return sched


def _state_problem(sched: Schedule) -> str | None:
    """What is wrong with a read schedule's firing state, if anything."""
    for k in ("next_slot", "last_slot"):
        t = getattr(sched, k)
        if t is not None and not (type(t) is int and _time(t)):
            return f"{k} {t!r} is not a time"
    for k in ("fired_at", "set_at"):
        t = getattr(sched, k)
        if t is not None and not _time(t):
            return f"{k} {t!r} is not a time"
    if not all(_count(getattr(sched, k)) for k in ("fired", "skipped", "missed", "rev")):
        return "a count is not a whole number in range"
    if not (isinstance(sched.wid, str) and len(sched.wid) <= LIMITS["wid"]):
        return "wid"
    if sched.last_id is not None:
        try:
            if type(sched.last_id) is not str or check_id(sched.last_id) != sched.last_id:
                return "last_id is not an id"
        except InvalidArgument:
            return "last_id is not an id"
    return None
