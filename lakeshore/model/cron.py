"""Cron expressions and their slots, in a time zone: pure arithmetic, no I/O.

Five fields, ``minute hour day-of-month month day-of-week``, each ``*``, a number, a name
(``jan``–``dec``, ``sun``–``sat``, any case), a range ``a-b``, a step ``*/n``, ``a-b/n`` or
``a/n`` (``a`` to the field's end), or a comma list of those; day-of-week 0 and 7 are both
Sunday. ``@hourly``, ``@daily`` (``@midnight``), ``@weekly``, ``@monthly`` and ``@yearly``
(``@annually``) are the usual shorthands. When day-of-month and day-of-week are both
restricted, a day matches if either does (Vixie cron's rule; a field that starts with ``*``,
``*/2`` included, counts as unrestricted).

A slot is a whole minute of local time in the expression's zone, as a Unix epoch second.
Around a daylight-saving change a local time may not exist (the clocks jump over it): such
a slot is skipped. A local time that happens twice (the clocks go back) is one slot, at its
first occurrence. :func:`next_slot` and :func:`prev_slot` walk the fields, day by day and then
hour and minute within a matching day, never minute by minute; an expression that can never
match (``0 0 31 2 *``) is refused when it is parsed.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from lakeshore.errors import InvalidArgument

__all__ = [
    "MAX_CRON_CHARS",
    "Cron",
    "check_tz",
    "describe",
    "next_slot",
    "parse_cron",
    "prev_slot",
    "zone",
]

MAX_CRON_CHARS = 256  # longer than any honest expression; a hostile one is refused unread
MAX_TZ_CHARS = 64
_TZ = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*\Z")
# Every date comes back on every weekday within 28 years, a leap day within 40 (the century
# rule skips 2100): an expression that can match at all matches within this many days of any
# moment, so a search that finds nothing here never will.
_HORIZON_DAYS = 41 * 366

_SHIFT_H = 3  # more than any zone's daylight-saving or other shift of its clocks in a day
_SHIFT_S = _SHIFT_H * 3600 + 60
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# name, lowest, highest, names
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
_LONGEST_MONTH = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31}
_LONGEST_MONTH |= {11: 30, 12: 31}


def _bad(expr: str, what: str) -> InvalidArgument:
    return InvalidArgument(
        "cron",
        f"{expr[:80]!r}: {what}",
        "write five fields 'minute hour day-of-month month day-of-week' (e.g. '*/15 * * * *', "
        "'0 3 * * mon-fri') or @hourly, @daily, @weekly, @monthly, @yearly",
        cron=expr[:MAX_CRON_CHARS],
    )


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: the values each field allows, and whether day-of-month and
    day-of-week were restricted (which decides how the two combine)."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month unrestricted
    any_weekday: bool  # day of week unrestricted

    def day_matches(self, d: date) -> bool:
        """Whether the calendar day ``d`` is one the expression fires on."""
        if d.month not in self.months:
            return False
        in_month = d.day in self.days
        in_week = (d.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week  # the unrestricted one allows every day
        return in_month or in_week


def parse_cron(text: str) -> Cron:
    """Parse a cron expression (see the module docstring).

    Raises:
        InvalidArgument: not an expression, a value out of its field's range, or an
            expression that matches no day at all.
    """
    if not isinstance(text, str) or not 0 < len(text) <= MAX_CRON_CHARS:
        raise _bad(str(text)[:80], f"must be a str of 1 to {MAX_CRON_CHARS} characters")
    return _parse(text)


@lru_cache(maxsize=256)
def _parse(text: str) -> Cron:
    expanded = _ALIASES.get(text.strip().lower(), text)
    parts = expanded.split()
    if len(parts) != 5:
        raise _bad(text, f"has {len(parts)} fields, not 5")
    values: list[set[int]] = []
    for part, (name, low, high, names) in zip(parts, _FIELDS, strict=True):
        values.append(_field(text, part, name, low, high, names))
    minutes, hours, days, months, weekdays = values
    weekdays = {d % 7 for d in weekdays}
    cron = Cron(
        text=text,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(weekdays),
        any_day=parts[2].startswith("*"),
        any_weekday=parts[4].startswith("*"),
    )
    if cron.any_weekday and not any(min(days) <= _LONGEST_MONTH[m] for m in months):
        raise _bad(text, "names no day that its months have: it would never fire")
    return cron


def _field(text: str, part: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    out: set[int] = set()
    for item in part.split(","):
        rng, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or not 0 < int(step_text) <= high:
                raise _bad(text, f"{name}: {item!r} has a bad step")
            step = int(step_text)
        if rng == "*":
            first, last = low, high
        elif "-" in rng:
            a, _, b = rng.partition("-")
            first, last = (
                _value(text, a, name, low, high, names),
                _value(text, b, name, low, high, names),
            )
            if last < first:
                raise _bad(text, f"{name}: the range {rng!r} runs backwards")
        else:
            first = _value(text, rng, name, low, high, names)
            last = high if slash else first  # 'a/n': from a to the field's end
        out.update(range(first, last + 1, step))
    return out


def _value(text: str, token: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    key = token.lower()
    if key in names:
        return names[key]
    if not token.isdigit() or len(token) > 2 or not low <= int(token) <= high:
        raise _bad(text, f"{name}: {token!r} is not {low}-{high}")
    return int(token)


def check_tz(tz: object) -> str:
    """Validate a time-zone name (an IANA key such as ``Europe/Berlin``, or ``UTC``) and
    return it.

    Raises:
        InvalidArgument: not a name this machine's zone database knows.
    """
    zone(tz)
    assert isinstance(tz, str)
    return tz


def zone(tz: object) -> ZoneInfo:
    """The zone named ``tz`` (checked first: a stored name may be hostile, and names map to
    files of the zone database).

    Raises:
        InvalidArgument: not a zone name this machine knows.
    """
    if not (isinstance(tz, str) and len(tz) <= MAX_TZ_CHARS and _TZ.match(tz) and ".." not in tz):
        raise InvalidArgument(
            "time zone",
            f"{str(tz)[:80]!r} is not a time-zone name",
            "use an IANA name such as 'UTC', 'Europe/Berlin' or 'America/New_York'",
        )
    try:
        return _zone(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument(
            "time zone",
            f"{tz!r} is not a time zone this machine knows",
            "use an IANA name such as 'Europe/Berlin' (pip install tzdata where the system "
            "has no zone database)",
        ) from None


@lru_cache(maxsize=64)
def _zone(tz: str) -> ZoneInfo:
    return ZoneInfo(tz)


def _instant(day: date, hour: int, minute: int, tz: ZoneInfo) -> int | None:
    """The epoch second of a local wall time, or None where the clocks jumped over it. An
    ambiguous wall time is taken at its first occurrence (``fold=0``)."""
    local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
    t = local.timestamp()
    back = datetime.fromtimestamp(t, tz)
    if (back.hour, back.minute, back.day) != (hour, minute, day.day):
        return None  # a gap: this wall time does not exist on that day
    return int(t)


def next_slot(cron: Cron, after: float, tz: ZoneInfo) -> int | None:
    """The first slot strictly after ``after`` (an epoch second), or None if there is none
    within 41 years (a leap day on one weekday can take that long)."""
    local = datetime.fromtimestamp(after, tz)
    # On the first day, wall times before ``after``'s hold no later slot: those more than a
    # few hours before never (no zone shifts its clocks more), the others not while the
    # clocks did not change in between.
    steady = _offset(after - _SHIFT_S, tz) == local.utcoffset()
    floor = (local.hour, local.minute) if steady else (local.hour - _SHIFT_H, 0)
    start = local.date()
    for n in range(_HORIZON_DAYS):
        day = start + timedelta(days=n)
        if not cron.day_matches(day):
            continue
        for hour in cron.hours:
            if n == 0 and hour < floor[0]:
                continue
            for minute in cron.minutes:
                if n == 0 and (hour, minute) < floor:
                    continue
                t = _instant(day, hour, minute, tz)
                if t is not None and t > after:
                    return t
    return None


def prev_slot(cron: Cron, at_or_before: float, tz: ZoneInfo) -> int | None:
    """The last slot at or before ``at_or_before``, or None if there is none within 41
    years back (or before 1970)."""
    local = datetime.fromtimestamp(at_or_before, tz)
    steady = _offset(at_or_before + _SHIFT_S, tz) == local.utcoffset()
    ceiling = (local.hour, local.minute) if steady else (local.hour + _SHIFT_H, 59)
    start = local.date()
    for n in range(_HORIZON_DAYS):
        day = start - timedelta(days=n)
        if day.year < 1970:
            return None
        if not cron.day_matches(day):
            continue
        for hour in reversed(cron.hours):
            if n == 0 and hour > ceiling[0]:
                continue
            for minute in reversed(cron.minutes):
                if n == 0 and (hour, minute) > ceiling:
                    continue
                t = _instant(day, hour, minute, tz)
                if t is not None and t <= at_or_before:
                    return t
    return None


def _offset(t: float, tz: ZoneInfo) -> timedelta | None:
    return datetime.fromtimestamp(t, tz).utcoffset()


def describe(t: int) -> str:
    """A slot as text in UTC, the form its idempotency key carries: 2026-03-01T03:00:00Z."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
