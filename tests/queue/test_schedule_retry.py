"""A schedule carries the retry rule of a submit (docs/schedules.md#setting-a-schedule): the
function's own, under the options given to ``q.schedule``, into every slot's record; and a
schedule object's rule is checked as a record's is when it is read."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import firing
from lakeshore.codec import pack_plain
from lakeshore.errors import InvalidArgument, RecordError
from lakeshore.keys import QueueKeys
from lakeshore.model.retry import MAX_NAMES
from lakeshore.model.schedule import Schedule
from lakeshore.protocol.schedules import ScheduleObjects
from lakeshore.store import MemoryStore, Store
from tests import retry_jobs
from tests.queue.test_schedules import shifted, tickets
from tests.tiers import make_plane
from tests.waiting import poll

RULE = ("retry_for", "no_retry_for", "retry_backoff_s", "retry_backoff_cap_s", "retry_jitter")
KEY = "lakeshore/default/default/_schedules/good"


def rule_of(x: Any) -> tuple[Any, ...]:
    return tuple(getattr(x, k) for k in RULE)


def fire_one(q: Any, queue: str = "default") -> Any:
    (done,) = q.tick_schedules([queue])
    assert done.action == "fired" and done.id is not None
    return q.get(done.id)


def test_a_schedule_keeps_the_functions_retry_rule() -> None:
    """The reviewer's repro (issue 34 review): the slot's record has the function's
    ``no_retry_for``, as a direct submit's has."""
    store = MemoryStore()
    q = make_plane(store)
    f = q.udf(retry_jobs.raise_kind, max_attempts=3, no_retry_for=ValueError)
    direct = f.submit("value")
    assert q.get(direct).no_retry_for == ("ValueError",)
    sched = q.schedule("every-minute", f, every=60, args=("value",))
    poll(lambda: store.now() >= sched.next_slot, 10.0, "the first slot")
    fired = [x for x in q.tick_schedules(["default"]) if x.action == "fired"]
    assert len(fired) == 1
    rec = q.get(fired[0].id)
    assert rec.max_attempts == 3  # the udf's attempts came along ...
    assert rec.no_retry_for == ("ValueError",), "... and so did its retry rule"


def test_a_slot_has_the_functions_whole_rule_and_fails_at_once(store: Store) -> None:
    q, moved = shifted(store)
    f = q.udf(
        retry_jobs.raise_kind,
        max_attempts=3,
        retry_for=[KeyError, ValueError],
        no_retry_for=ValueError,
        retry_backoff_s=0,
        retry_backoff_cap_s=30,
        retry_jitter=0.5,
    )
    direct = q.get(f.submit("value"))
    s = q.schedule("rule", f, every=60, args=("value",))
    assert rule_of(s) == (("KeyError", "ValueError"), ("ValueError",), 0.0, 30.0, 0.5)
    moved.by += 1
    rec = fire_one(q)
    assert rule_of(rec) == rule_of(direct)
    assert rec.max_attempts == 3
    q.cancel(direct.id)  # only the slot's invocation is left to run
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    rec = q.get(rec.id)
    assert (rec.state, rec.attempt) == ("failed", 1)  # ValueError: no retry, 2 attempts left
    assert rec.error is not None and rec.error["type"] == "ValueError"


def test_the_options_given_to_schedule_override_the_functions() -> None:
    q, moved = shifted(MemoryStore())
    f = q.udf(
        retry_jobs.raise_kind, max_attempts=3, no_retry_for=ValueError, retry_backoff_cap_s=30
    )
    s = q.schedule(
        "lenient",
        f,
        every=60,
        args=("value",),
        no_retry_for=(),  # lifts the function's: ValueError is retried
        retry_for=["builtins.ValueError", retry_jobs.SubProblem],
        retry_backoff_s=0,
        retry_jitter=0.25,
    )
    wanted = (("ValueError", "tests.retry_jobs.SubProblem"), (), 0.0, 30.0, 0.25)
    assert rule_of(s) == wanted  # the cap is the function's: not given here
    assert rule_of(q.schedules()[0]) == wanted  # as stored
    moved.by += 1
    rec = fire_one(q)
    assert rule_of(rec) == wanted
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    rec = q.get(rec.id)
    assert (rec.state, rec.attempt) == ("queued", 1)  # retried: attempts remain


def test_a_named_function_takes_the_rule_as_names() -> None:
    q, moved = shifted(MemoryStore())
    s = q.schedule(
        "named",
        "tests.retry_jobs:raise_kind",
        every=60,
        args=["key"],
        no_retry_for="KeyError",
        retry_backoff_cap_s=5,
    )
    assert rule_of(s) == (None, ("KeyError",), None, 5.0, None)
    moved.by += 1
    rec = fire_one(q)
    assert (rec.retry_for, rec.no_retry_for, rec.retry_backoff_cap_s) == ((), ("KeyError",), 5.0)
    # set again without a rule: the definition is replaced whole, the rule with it
    s = q.schedule("named", "tests.retry_jobs:raise_kind", every=60, args=["key"])
    assert rule_of(s) == (None,) * 5


@pytest.mark.parametrize(
    "options",
    [
        {"retry_for": 42},
        {"no_retry_for": [int]},
        {"retry_for": ["not a name"]},
        {"retry_for": [f"mod.E{i}" for i in range(MAX_NAMES + 1)]},
        {"retry_jitter": 2},
        {"retry_backoff_cap_s": 86400},
        {"retry_backoff_s": float("nan")},
        {"retry_backoff_s": "soon"},
    ],
)
def test_a_bad_rule_is_refused_before_anything_is_written(options: dict[str, Any]) -> None:
    q = make_plane(MemoryStore())
    with pytest.raises(InvalidArgument):
        q.schedule("bad", "tests.retry_jobs:raise_kind", every=60, args=["key"], **options)
    assert q.schedules() == []


def _good(**rule: Any) -> Schedule:
    q = make_plane(MemoryStore())
    return firing.define(
        q, "good", "tests.retry_jobs:raise_kind", ("key",), every=60, start=100, **rule
    )


def test_a_schedule_with_a_rule_round_trips() -> None:
    s = _good(retry_for=KeyError, no_retry_for=["x.Y"], retry_backoff_s=2, retry_jitter=1)
    s = dataclasses.replace(s, next_slot=160).written()
    back = Schedule.from_bytes(s.to_bytes(), KEY, "good", "default")
    assert back == s
    assert rule_of(back) == (("KeyError",), ("x.Y",), 2.0, None, 1.0)


def test_an_object_without_the_rule_reads_and_is_written_as_before() -> None:
    """An object written before schedules had a rule has none of its keys: it reads, and
    a schedule without a rule is stored without them."""
    s = dataclasses.replace(_good(), next_slot=160).written()
    before = {k: v for k, v in dataclasses.asdict(s).items() if k not in RULE}
    old = pack_plain({"v": 1, **before})
    back = Schedule.from_bytes(old, KEY, "good", "default")
    assert back == s and rule_of(back) == (None,) * 5
    assert s.to_bytes() == old


def test_an_object_without_the_rule_still_fires() -> None:
    q, moved = shifted(MemoryStore())
    s = q.schedule("good", "tests.retry_jobs:raise_kind", every=60, args=["key"])
    before = {k: v for k, v in dataclasses.asdict(s).items() if k not in RULE}
    q.store.put(KEY, pack_plain({"v": 1, **before}))
    moved.by += 1
    rec = fire_one(q)
    assert (rec.retry_for, rec.no_retry_for) == ((), ())


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"retry_for": "ValueError"}, "retry_for must be a list"),
        ({"retry_for": {"a": 1}}, "retry_for must be a list"),
        ({"no_retry_for": [1]}, "no_retry_for holds a type name that must be a str"),
        ({"no_retry_for": ["a b"]}, "not a dotted class name"),
        ({"retry_for": ["x" * 300]}, "1 to 256 bytes"),
        ({"retry_for": [f"m.E{i}" for i in range(MAX_NAMES + 1)]}, "at most 32"),
        ({"retry_backoff_s": -1}, "retry_backoff_s must be a number"),
        ({"retry_backoff_s": float("inf")}, "retry_backoff_s must be a number"),
        ({"retry_backoff_cap_s": 1e9}, "retry_backoff_cap_s must be a number from 0 to 3600"),
        ({"retry_jitter": 1.5}, "retry_jitter must be a number from 0 to 1"),
        ({"retry_jitter": True}, "retry_jitter must be a number"),
        ({"retry_jitter": "x" * 10_000}, "retry_jitter must be a number"),
    ],
)
def test_a_hostile_rule_in_the_object_is_refused(change: dict[str, Any], match: str) -> None:
    fields = {"v": 1, **dataclasses.asdict(_good()), **change}
    with pytest.raises(RecordError, match=match) as info:
        Schedule.from_bytes(pack_plain(fields), KEY, "good", "default")
    assert len(str(info.value)) < 1000  # bounded: a hostile value is not echoed whole


def test_a_hostile_rule_never_stops_ls_or_tick() -> None:
    q, moved = shifted(MemoryStore())
    q.schedule("fine", "tests.retry_jobs:raise_kind", every=60, args=["key"])
    bad = dataclasses.asdict(
        firing.define(q, "bad", "tests.retry_jobs:raise_kind", ("key",), every=60)
    )
    prefix = QueueKeys(q.ns, "default").schedules_prefix
    q.store.put(prefix + "bad", pack_plain({"v": 1, **bad, "retry_for": ["a b"] * 40}))
    assert [s.name for s in q.schedules()] == ["fine"]
    moved.by += 1
    done = {d.name: d for d in q.tick_schedules(["default"])}
    assert done["fine"].action == "fired"
    assert done["bad"].action == "unreadable" and "retry_for" in (done["bad"].error or "")
    assert len(tickets(q)) == 1
    listed = ScheduleObjects(q.store, QueueKeys(q.ns, "default")).list()
    assert sorted(x.name for x in listed) == ["bad", "fine"]  # the bad one left alone
