"""Cron expressions (lakeshore/model/cron.py): parsing, Vixie's day rule, daylight-saving
gaps and repeats, and the field-wise search checked against a minute-by-minute walk."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeshore.errors import InvalidArgument
from lakeshore.model.cron import (
    Cron,
    check_tz,
    describe,
    next_slot,
    parse_cron,
    prev_slot,
    zone,
)


def at(tz: str, *fields: int) -> float:
    """A local wall time as an epoch (the first occurrence, as the slots take it)."""
    return datetime(*fields, tzinfo=ZoneInfo(tz)).timestamp()  # type: ignore[misc]


def slots(expr: str, tz: str, after: float, n: int) -> list[str]:
    c, z, out = parse_cron(expr), zone(tz), []
    t: float = after
    for _ in range(n):
        found = next_slot(c, t, z)
        assert found is not None
        out.append(datetime.fromtimestamp(found, z).isoformat())
        t = found
    return out


# -- parsing -------------------------------------------------------------------------------


def test_fields_ranges_steps_lists_and_names() -> None:
    c = parse_cron("*/15 9-17/4 1,15 jan-mar,DEC mon-fri")
    assert c.minutes == (0, 15, 30, 45)
    assert c.hours == (9, 13, 17)
    assert c.days == {1, 15}
    assert c.months == {1, 2, 3, 12}
    assert c.weekdays == {1, 2, 3, 4, 5}
    assert parse_cron("0 0 * * 7").weekdays == {0}  # 7 is Sunday too
    assert parse_cron("0 0 * * 5-7").weekdays == {5, 6, 0}
    assert parse_cron("5/20 * * * *").minutes == (5, 25, 45)  # 'a/n': a to the field's end


@pytest.mark.parametrize(
    ("alias", "fields"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@ANNUALLY", "0 0 1 1 *"),
    ],
)
def test_shorthands(alias: str, fields: str) -> None:
    a, b = parse_cron(alias), parse_cron(fields)
    assert (a.minutes, a.hours, a.days, a.months, a.weekdays) == (
        b.minutes,
        b.hours,
        b.days,
        b.months,
        b.weekdays,
    )


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("* * * *", "4 fields"),
        ("* * * * * *", "6 fields"),
        ("60 * * * *", "is not 0-59"),
        ("* 24 * * *", "is not 0-23"),
        ("* * 0 * *", "is not 1-31"),
        ("* * * 13 *", "is not 1-12"),
        ("* * * * 8", "is not 0-7"),
        ("5-1 * * * *", "runs backwards"),
        ("*/0 * * * *", "bad step"),
        ("*/x * * * *", "bad step"),
        ("foo * * * *", "is not 0-59"),
        ("0 0 30 feb *", "never fire"),
        ("0 0 31 apr,jun *", "never fire"),
        ("@reboot", "1 fields"),
        ("", "1 to 256"),
        ("*" * 300, "1 to 256"),
        ("1,,2 * * * *", "is not 0-59"),
        ("007 * * * *", "is not 0-59"),
    ],
)
def test_bad_expressions_are_refused(expr: str, why: str) -> None:
    with pytest.raises(InvalidArgument, match=why):
        parse_cron(expr)


def test_a_non_str_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="must be a str"):
        parse_cron(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("tz", ["../../etc/passwd", "/etc/localtime", "Europe/../UTC", "x" * 70])
def test_zone_names_that_could_reach_other_files_are_refused(tz: str) -> None:
    with pytest.raises(InvalidArgument, match="not a time-zone name"):
        zone(tz)


def test_unknown_zones_are_refused_and_known_ones_pass() -> None:
    with pytest.raises(InvalidArgument, match="not a time zone this machine knows"):
        check_tz("Mars/Olympus_Mons")
    assert check_tz("Europe/Berlin") == "Europe/Berlin"


# -- Vixie's rule for day of month and day of week --------------------------------------------


def test_restricted_day_of_month_and_day_of_week_match_either() -> None:
    # 2025-06: the 13th is a Friday; Fridays are the 6th, 13th, 20th, 27th
    got = slots("0 0 13 * fri", "UTC", at("UTC", 2025, 6, 1), 5)
    assert [g[:10] for g in got] == [
        "2025-06-06",
        "2025-06-13",
        "2025-06-20",
        "2025-06-27",
        "2025-07-04",
    ]


def test_a_star_in_either_day_field_means_both_must_match() -> None:
    got = slots("0 0 * * fri", "UTC", at("UTC", 2025, 6, 1), 2)
    assert [g[:10] for g in got] == ["2025-06-06", "2025-06-13"]
    # '*/2' starts with '*': Vixie counts it as unrestricted, so the days must be odd AND Fri
    got = slots("0 0 */2 * fri", "UTC", at("UTC", 2025, 6, 1), 2)
    assert [g[:10] for g in got] == ["2025-06-13", "2025-06-27"]


def test_a_leap_day_on_a_weekday_years_away_is_found() -> None:
    # only when 29 February is a Monday (AND: day of month '*/29' counts as unrestricted)
    got = slots("0 0 */29 2 mon", "UTC", at("UTC", 2025, 1, 1), 2)
    # 'a/n' from 1 by 29: days 1 and 30 -> in February only the 1st: Mondays that are 1 Feb
    assert [g[:10] for g in got] == ["2027-02-01", "2038-02-01"]
    got = slots("0 0 29 2 *", "UTC", at("UTC", 2097, 1, 1), 1)
    assert got[0][:10] == "2104-02-29"  # 2100 is no leap year


# -- daylight saving ----------------------------------------------------------------------------


def test_a_local_time_the_clocks_jump_over_is_skipped() -> None:
    # Berlin, 2025-03-30: 02:00 -> 03:00
    got = slots("30 2 * * *", "Europe/Berlin", at("Europe/Berlin", 2025, 3, 29, 12), 2)
    assert got == ["2025-03-31T02:30:00+02:00", "2025-04-01T02:30:00+02:00"]
    got = slots("*/30 * * * *", "Europe/Berlin", at("Europe/Berlin", 2025, 3, 30, 1, 10), 3)
    assert got == [
        "2025-03-30T01:30:00+01:00",
        "2025-03-30T03:00:00+02:00",  # 02:00 and 02:30 do not exist
        "2025-03-30T03:30:00+02:00",
    ]


def test_a_local_time_that_happens_twice_fires_once_at_its_first() -> None:
    # Berlin, 2025-10-26: 03:00 -> 02:00, so 02:00-02:59 happen twice
    got = slots("30 2 * * *", "Europe/Berlin", at("Europe/Berlin", 2025, 10, 25, 12), 2)
    assert got == ["2025-10-26T02:30:00+02:00", "2025-10-27T02:30:00+01:00"]
    start = datetime(2025, 10, 26, 1, 50, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
    got = slots("*/20 * * * *", "Europe/Berlin", start, 5)
    assert got == [
        "2025-10-26T02:00:00+02:00",
        "2025-10-26T02:20:00+02:00",
        "2025-10-26T02:40:00+02:00",
        "2025-10-26T03:00:00+01:00",  # the second 02:xx is not fired again
        "2025-10-26T03:20:00+01:00",
    ]


def test_from_inside_the_repeated_hour_the_next_slot_is_still_later() -> None:
    # 02:30 +01:00, the second pass: 02:40 +02:00 was an hour earlier, not after it
    second = datetime(2025, 10, 26, 1, 30, tzinfo=UTC).timestamp()
    got = slots("40 2 * * *", "Europe/Berlin", second, 1)
    assert got == ["2025-10-27T02:40:00+01:00"]


def test_half_hour_daylight_saving_lord_howe() -> None:
    # Lord Howe Island, 2025-10-05: 02:00 -> 02:30 (+10:30 -> +11:00)
    tz = "Australia/Lord_Howe"
    got = slots("*/15 2 * * *", tz, at(tz, 2025, 10, 4, 12), 3)
    assert got == [
        "2025-10-05T02:30:00+11:00",  # 02:00 and 02:15 do not exist
        "2025-10-05T02:45:00+11:00",
        "2025-10-06T02:00:00+11:00",
    ]


def test_describe_is_utc_text() -> None:
    assert describe(0) == "1970-01-01T00:00:00Z"
    assert describe(int(at("Europe/Berlin", 2025, 1, 1, 3))) == "2025-01-01T02:00:00Z"


# -- the field-wise search against a minute-by-minute walk -----------------------------------

ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/St_Johns",
    "Pacific/Chatham",
]


def _matches(c: Cron, t: int, tz: ZoneInfo) -> bool:
    """The definition: local minute matches the fields, and it is that wall time's first
    occurrence."""
    local = datetime.fromtimestamp(t, tz)
    return (
        local.fold == 0
        and local.second == 0
        and local.minute in c.minutes
        and local.hour in c.hours
        and c.day_matches(local.date())
    )


field = st.one_of(
    st.just("*"),
    st.integers(0, 59).map(str),
    st.builds(lambda a, n: f"*/{n}", st.just(0), st.integers(1, 30)),
)
hours = st.one_of(
    st.just("*"),
    st.lists(st.integers(0, 23), min_size=1, max_size=4, unique=True).map(
        lambda xs: ",".join(map(str, xs))
    ),
    st.builds(lambda a, b: f"{min(a, b)}-{max(a, b)}", st.integers(0, 23), st.integers(0, 23)),
)
days = st.one_of(st.just("*"), st.integers(1, 28).map(str), st.just("*/3"))
weekdays = st.one_of(st.just("*"), st.just("mon-fri"), st.integers(0, 7).map(str))


@settings(max_examples=200, deadline=None)
@given(
    minute=field,
    hour=hours,
    dom=days,
    dow=weekdays,
    tz=st.sampled_from(ZONES),
    after=st.integers(
        int(datetime(2024, 1, 1, tzinfo=UTC).timestamp()),
        int(datetime(2030, 1, 1, tzinfo=UTC).timestamp()),
    ),
)
def test_next_and_prev_agree_with_a_minute_walk(
    minute: str, hour: str, dom: str, dow: str, tz: str, after: int
) -> None:
    c = parse_cron(f"{minute} {hour} {dom} * {dow}")
    z = zone(tz)
    found = next_slot(c, after, z)
    assert found is not None
    # every whole minute between `after` and the found slot fails, the slot matches
    t = (after // 60 + 1) * 60
    assert found >= t and found % 60 == 0
    limit = min(found, t + 60 * 60 * 24 * 40)  # walk at most 40 days of minutes
    while t < limit:
        assert not _matches(c, t, z), datetime.fromtimestamp(t, z)
        t += 60
    if found == limit:
        assert _matches(c, found, z)
    back = prev_slot(c, found, z)
    assert back == found  # at or before: the slot itself
    earlier = prev_slot(c, found - 1, z)
    assert earlier is not None and earlier < found
    assert next_slot(c, earlier, z) == found  # nothing between two neighbours
    assert _matches(c, earlier, z)


def test_every_minute_for_a_day_across_a_change_has_one_slot_per_first_wall_minute() -> None:
    z = zone("America/New_York")
    c = parse_cron("* * * * *")
    t = at("America/New_York", 2025, 11, 2, 0, 0)
    got = []
    end = t + 86400 + 3600
    while t < end:
        nxt = next_slot(c, t, z)
        assert nxt is not None
        got.append(nxt)
        t = nxt
    # 25 hours of real time, but the repeated hour's minutes fire once: 24 hours of slots
    assert len(got) == 24 * 60
    assert len(set(got)) == len(got)
    assert got == sorted(got)
    assert max(b - a for a, b in itertools.pairwise(got)) == 3600 + 60
    assert timedelta(seconds=got[-1] - got[0]) == timedelta(hours=25, minutes=-1)
