"""Schedules (issue 34, item 2): definitions, firing as keyed submits, the catch-up rule,
the overlap policy, replacing and removing, and schedule objects that are not what they
should be. Races, clock skew, crashes and what workers pay are in test_schedule_races.py.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import msgpack
import pytest

import lakeshore as dls
from lakeshore import codec, firing
from lakeshore.codec import pack_plain
from lakeshore.errors import InvalidArgument, NewerRecord, RecordError
from lakeshore.keys import QueueKeys
from lakeshore.model.schedule import MAX_ARGS_BYTES, Schedule, slot_key
from lakeshore.protocol.schedules import ScheduleObjects
from lakeshore.store import MemoryStore, Store
from tests import jobs
from tests.shifting import Moved, Shifted
from tests.tiers import make_plane
from tests.waiting import poll


def shifted(store: Store) -> tuple[Any, Moved]:
    """A plane on ``store`` whose store clock stands still until the test moves it."""
    moved = Moved(frozen=math.floor(store.now()) + 0.5)  # half a second before a new slot
    return make_plane(Shifted(store, moved)), moved


def objects(q: Any, queue: str = "default") -> ScheduleObjects:
    return ScheduleObjects(q.store, QueueKeys(q.ns, queue))


def tickets(q: Any, queue: str = "default") -> list[str]:
    return [i.key for i in q.plane.ops(queue).tickets()]


def fired_ids(done: list[firing.Fired]) -> list[str]:
    return [f.id for f in done if f.action == "fired" and f.id]


# -- the basics, on every tier -----------------------------------------------------------------


def test_a_slot_fires_once_as_a_keyed_submit_and_runs(store: Store) -> None:
    q, moved = shifted(store)
    f = q.udf(jobs.add_one)
    s = q.schedule("bump", f, every=60, args=(41,))
    assert s.next_slot == s.start and s.start >= s.set_at  # the first slot: when it was set
    assert q.tick_schedules(["default"])[0].action == "idle"  # not before the slot
    assert tickets(q) == []
    moved.by += 1  # the slot is due
    done = q.tick_schedules(["default"])
    assert [(d.action, d.slot, d.missed) for d in done] == [("fired", s.start, 0)]
    inv = done[0].id
    assert inv is not None
    rec = q.get(inv)
    assert rec.key == slot_key("bump", s.start) == f"schedule/bump/{_utc(s.start)}"
    assert rec.fn == "tests.jobs:add_one" and rec.submitted_at >= s.start
    again = q.tick_schedules(["default"])  # the same slot again: nothing more
    assert [d.action for d in again] == ["idle"]
    assert len(tickets(q)) == 1
    (now,) = q.schedules()
    assert (now.last_slot, now.last_id, now.next_slot) == (s.start, inv, s.start + 60)
    assert (now.fired, now.skipped, now.missed) == (1, 0, 0)
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    assert q.result(inv, timeout=10) == 42


def _utc(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_cron_schedule_fires_at_its_minute_in_its_zone() -> None:
    q, moved = shifted(MemoryStore())
    s = q.schedule("morning", "tests.jobs:add_one", cron="30 7 * * *", tz="Asia/Kolkata", args=[1])
    assert s.next_slot is not None
    local = datetime.fromtimestamp(s.next_slot, ZoneInfo("Asia/Kolkata"))
    assert (local.hour, local.minute, local.second) == (7, 30, 0)
    assert 0 < s.next_slot - q.store.now() <= 86400
    moved.by += s.next_slot - q.store.now() - 0.5
    assert [d.action for d in q.tick_schedules(["default"])] == ["idle"]  # not a second early
    moved.by += 0.6
    (done,) = q.tick_schedules(["default"])
    assert (done.action, done.slot, done.next_slot) == ("fired", s.next_slot, s.next_slot + 86400)


def test_a_string_function_needs_no_import_and_a_worker_runs_only_what_it_declared() -> None:
    q, moved = shifted(MemoryStore())
    q.schedule("x", "os:system", every=10, args=["echo pwned"])
    moved.by += 1
    (done,) = q.tick_schedules(["default"])
    assert done.action == "fired" and done.id is not None
    dls.run_worker(q, once=True, isolation="thread")
    rec = q.get(done.id)
    assert rec.state == "failed" and rec.error is not None
    assert rec.error["type"] == "UnknownFunction"


def test_options_travel_with_each_slot() -> None:
    q, moved = shifted(MemoryStore())
    f = q.udf(jobs.add_one, queue="batch", max_attempts=5, priority=7)
    s = q.schedule("opts", f, every=30, args=(1,), timeout_s=9.0, priority=2)
    assert (s.queue, s.max_attempts, s.priority, s.timeout_s) == ("batch", 5, 2, 9.0)
    moved.by += 1
    (done,) = q.tick_schedules(["batch"])
    assert done.id is not None
    rec = q.get(done.id)
    assert (rec.queue, rec.max_attempts, rec.priority, rec.timeout_s) == ("batch", 5, 2, 9.0)


# -- the catch-up rule ---------------------------------------------------------------------------


def test_after_downtime_the_latest_due_slot_fires_and_the_others_count_as_missed() -> None:
    q, moved = shifted(MemoryStore())
    s = q.schedule("every10", "tests.jobs:add_one", every=10, args=[0])
    moved.by += 95.5  # nobody fired for 95 s: slots start+0 ... start+90 are due
    (done,) = q.tick_schedules(["default"])
    assert (done.action, done.slot, done.missed) == ("fired", s.start + 90, 9)
    assert done.next_slot == s.start + 100
    (now,) = q.schedules()
    assert (now.fired, now.missed, now.last_slot) == (1, 9, s.start + 90)
    assert len(tickets(q)) == 1  # one invocation, not ten


def test_catch_up_of_a_cron_schedule() -> None:
    q, moved = shifted(MemoryStore())
    s = q.schedule("minutely", "tests.jobs:add_one", cron="* * * * *", args=[0])
    assert s.next_slot is not None
    moved.by += s.next_slot - q.store.now() + 4 * 60 + 1  # four minutes late
    (done,) = q.tick_schedules(["default"])
    assert (done.slot, done.missed) == (s.next_slot + 240, 4)


def test_a_forged_next_slot_in_the_distant_past_costs_one_firing() -> None:
    q, _moved = shifted(MemoryStore())
    s = q.schedule("old", "tests.jobs:add_one", cron="* * * * *", args=[0])
    objs = objects(q)
    cur, etag = objs.read("old")
    objs.write(dataclasses.replace(cur, start=60, next_slot=60), etag)  # decades of minutes
    before = q.store.now()
    (done,) = q.tick_schedules(["default"])
    assert done.action == "fired" and done.slot is not None
    assert before - 60 < done.slot <= q.store.now()  # the latest minute
    assert done.missed == 10_000  # counted one by one up to a bound, not for ever
    assert len(tickets(q)) == 1
    assert s.next_slot is not None


# -- overlap --------------------------------------------------------------------------------------


def test_overlap_skip_skips_a_slot_while_the_previous_invocation_is_live() -> None:
    q, moved = shifted(MemoryStore())
    f = q.udf(jobs.add_one)
    s = q.schedule("one-at-a-time", f, every=10, args=(1,), overlap="skip")
    moved.by += 1
    (first,) = q.tick_schedules(["default"])
    assert first.action == "fired"
    moved.by += 10  # the next slot: the first is still queued
    (second,) = q.tick_schedules(["default"])
    assert (second.action, second.slot, second.id) == ("skipped", s.start + 10, None)
    assert dls.run_worker(q, once=True, isolation="thread") == 1  # the first ends
    moved.by += 10
    (third,) = q.tick_schedules(["default"])
    assert (third.action, third.slot) == ("fired", s.start + 20)
    (now,) = q.schedules()
    assert (now.fired, now.skipped, now.last_id) == (2, 1, third.id)


def test_overlap_allow_fires_while_the_previous_is_live() -> None:
    q, moved = shifted(MemoryStore())
    q.schedule("many", "tests.jobs:add_one", every=10, args=[1])
    moved.by += 1
    q.tick_schedules(["default"])
    moved.by += 10
    assert [d.action for d in q.tick_schedules(["default"])] == ["fired"]
    assert len(tickets(q)) == 2


# -- changing and removing ------------------------------------------------------------------------


def test_setting_the_same_slots_again_keeps_the_firing_state() -> None:
    q, moved = shifted(MemoryStore())
    s = q.schedule("deploy", "tests.jobs:add_one", every=60, args=[1])
    moved.by += 1
    (done,) = q.tick_schedules(["default"])
    moved.by += 30
    again = q.schedule("deploy", "tests.jobs:add_one", every=60, args=[2], priority=3)
    assert (again.start, again.next_slot, again.last_id) == (s.start, s.start + 60, done.id)
    assert again.fired == 1 and again.priority == 3 and again.call() == ((2,), {})
    assert again.rev > s.rev


def test_new_slots_start_after_now_and_after_the_last_fired() -> None:
    q, moved = shifted(MemoryStore())
    q.schedule("change", "tests.jobs:add_one", every=60, args=[1])
    moved.by += 1
    q.tick_schedules(["default"])
    moved.by += 200  # three slots due and not fired: dropped with the old definition
    now = q.store.now()
    new = q.schedule("change", "tests.jobs:add_one", cron="*/5 * * * *", args=[1])
    assert new.next_slot is not None and new.next_slot >= now and new.next_slot % 300 == 0
    assert new.fired == 1
    assert [d.action for d in q.tick_schedules(["default"])] == ["idle"]


def test_removing_a_schedule_keeps_its_invocations() -> None:
    q, moved = shifted(MemoryStore())
    q.schedule("gone", "tests.jobs:add_one", every=10, args=[1])
    moved.by += 1
    (done,) = q.tick_schedules(["default"])
    assert q.unschedule("gone") is True
    assert q.unschedule("gone") is False
    assert q.schedules() == [] and done.id is not None
    assert q.get(done.id).state == "queued"
    assert firing.fire(q, "default", "gone").action == "gone"


def test_a_removal_during_a_firing_ends_it_cleanly() -> None:
    q, moved = shifted(MemoryStore())
    q.schedule("racing", "tests.jobs:add_one", every=10, args=[1])
    moved.by += 1
    objs = objects(q)
    sched, etag = objs.read("racing")
    objs.remove("racing")
    done = firing._record(objs, sched, etag, sched.start, "01ARZ3NDEKTSV4RRFFQ69G5FAV", 0)
    assert done.action == "fired" and done.etag is None
    assert objs.list() == []  # nothing written back


# -- definitions that are refused, with nothing written --------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"every": 5}, "from 10 to"),
        ({"every": 10.5}, "whole number"),
        ({"every": 10, "cron": "* * * * *"}, "not both"),
        ({}, "not both or neither"),
        ({"cron": "* * *"}, "3 fields"),
        ({"every": 10, "tz": "Nowhere/City"}, "not a time zone"),
        ({"every": 10, "overlap": "queue"}, "overlap"),
        ({"every": 10, "priority": 12}, "out of range"),
        ({"every": 10, "max_attempts": 0}, "out of range"),
        ({"every": 10, "timeout_s": float("inf")}, "out of range"),
        ({"every": 10, "retries": 3}, "unknown option"),
        ({"every": 10, "start": datetime(2030, 1, 1)}, "naive datetime"),
        ({"every": 10, "args": (1, 2)}, "do not fit"),
        ({"every": 10, "args": (b"x" * (MAX_ARGS_BYTES + 1),)}, "over 65536"),
        ({"every": 10, "queue": "other"}, "declared for queue"),
    ],
)
def test_bad_definitions_are_refused_before_anything_is_written(
    kwargs: dict[str, Any], match: str
) -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one if "args" not in kwargs or len(kwargs["args"]) > 1 else jobs.size_of)
    kwargs.setdefault("args", (1,))
    with pytest.raises(InvalidArgument, match=match):
        q.schedule("bad", f, **kwargs)
    assert list(q.store.list()) == []


def test_bad_names_and_functions_are_refused() -> None:
    q = make_plane(MemoryStore())
    with pytest.raises(InvalidArgument, match="not a valid schedule name"):
        q.schedule("Nightly!", "tests.jobs:add_one", every=10)
    with pytest.raises(InvalidArgument, match="not a function's name"):
        q.schedule("n", "no-colon", every=10)
    with pytest.raises(InvalidArgument, match="no importable name"):
        q.schedule("n", q.udf(lambda: 1), every=10)
    assert list(q.store.list()) == []


def test_start_anchors_an_interval_and_holds_slots_back() -> None:
    q, _moved = shifted(MemoryStore())
    anchor = datetime.fromtimestamp(q.store.now(), UTC).replace(minute=0, second=0, microsecond=0)
    s = q.schedule("aligned", "tests.jobs:add_one", every=900, start=anchor, args=[1])
    assert (s.next_slot - s.start) % 900 == 0 and s.next_slot >= q.store.now() - 1
    later = anchor + timedelta(days=2)
    s2 = q.schedule("later", "tests.jobs:add_one", cron="@hourly", start=later, args=[1])
    assert s2.next_slot == math.ceil(later.timestamp())


# -- schedule objects that are not what they should be --------------------------------------------


def _good() -> Schedule:
    q = make_plane(MemoryStore())
    return firing.define(q, "good", "tests.jobs:add_one", (1,), cron="0 3 * * *", start=100)


def test_a_schedule_object_round_trips() -> None:
    s = dataclasses.replace(_good(), next_slot=10_800, last_slot=None, fired=3).written()
    key = "lakeshore/default/default/_schedules/good"
    assert Schedule.from_bytes(s.to_bytes(), key, "good", "default") == s
    assert s.written().wid != s.wid  # every write's bytes differ


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"v": 2}, "newer"),
        ({"v": None}, "schema version"),
        ({"name": "other"}, "names 'other'"),
        ({"fn": "x" * 2000}, "not a function"),
        ({"fn": 5}, "not a function"),
        ({"args": "text"}, "wrong type"),
        ({"args": b"\x00" * (MAX_ARGS_BYTES + 1)}, "over 65536"),
        ({"cron": "0 0 31 2 *"}, "never fire"),
        ({"cron": 7}, "wrong type"),
        ({"tz": "../../../etc/passwd"}, "time-zone name"),
        ({"every": 3, "cron": None}, "from 10"),
        ({"overlap": "sometimes"}, "overlap"),
        ({"start": -5}, "start"),
        ({"start": 1e300}, "start"),
        ({"next_slot": "soon"}, "next_slot"),
        ({"next_slot": 2**62}, "next_slot"),
        ({"fired_at": float("nan")}, "fired_at"),
        ({"fired": -1}, "count"),
        ({"skipped": True}, "count"),
        ({"last_id": "../../x"}, "last_id"),
        ({"wid": "w" * 500}, "wid"),
        ({"priority": 99}, "out of range"),
        ({"bogus": 1, "queue": None}, "wrong|names|queue"),
    ],
)
def test_a_hostile_schedule_object_is_refused(change: dict[str, Any], match: str) -> None:
    fields = {"v": 1, **dataclasses.asdict(_good()), **change}
    data = pack_plain(fields)
    key = "lakeshore/default/default/_schedules/good"
    with pytest.raises(RecordError, match=match) as info:
        Schedule.from_bytes(data, key, "good", "default")
    assert isinstance(info.value, NewerRecord) == (change.get("v") == 2)


@pytest.mark.parametrize(
    "data", [b"", b"\xc1", b"not msgpack at all", msgpack.packb([1, 2]), msgpack.packb({"v": 1})]
)
def test_bytes_that_are_no_schedule_are_refused(data: bytes) -> None:
    with pytest.raises(RecordError, match="not a schedule lakeshore wrote"):
        Schedule.from_bytes(data, "k", "good", "default")


def _plant_bad_objects(q: Any) -> None:
    prefix = QueueKeys(q.ns, "default").schedules_prefix
    good = dataclasses.asdict(firing.define(q, "x", "tests.jobs:add_one", (1,), every=10))
    q.store.put(prefix + "junk", b"\x93\x01\x02")
    q.store.put(prefix + "huge", b"\x00" * (200 * 1024))
    q.store.put(prefix + "newer", pack_plain({**good, "v": 9, "name": "newer"}))
    q.store.put(prefix + "lies", pack_plain({**good, "v": 1, "name": "lies", "every": "x"}))
    q.store.put(prefix + "Not-A-Name", b"whatever")  # not a schedule name: never listed


def test_bad_objects_never_stop_ls_or_tick() -> None:
    q, moved = shifted(MemoryStore())
    q.schedule("fine", "tests.jobs:add_one", every=10, args=[1])
    _plant_bad_objects(q)
    assert [s.name for s in q.schedules()] == ["fine"]
    listed = firing.read_schedules(q, ["default"])
    unreadable = sorted(x.name for x in listed if isinstance(x, firing.Fired))
    assert unreadable == ["huge", "junk", "lies", "newer"]
    moved.by += 1
    done = {d.name: d for d in q.tick_schedules(["default"])}
    assert done["fine"].action == "fired"
    assert {n for n, d in done.items() if d.action == "unreadable"} == {
        "huge",
        "junk",
        "lies",
        "newer",
    }
    assert "newer than this lakeshore" in (done["newer"].error or "")


def test_setting_a_schedule_over_junk_replaces_it_but_leaves_a_newer_one_alone() -> None:
    q = make_plane(MemoryStore())
    _plant_bad_objects(q)
    s = q.schedule("junk", "tests.jobs:add_one", every=10, args=[1])
    assert objects(q).read("junk")[0] == s
    with pytest.raises(NewerRecord):
        q.schedule("newer", "tests.jobs:add_one", every=10, args=[1])


def test_a_worker_fires_its_schedules_and_passes_over_bad_objects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    _plant_bad_objects(q)
    q.schedule("fine", f, every=3600, args=(1,))
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="lakeshore.worker"):
        t = threading.Thread(
            target=dls.run_worker, args=(q,), kwargs={"stop": stop, "max_poll_s": 0.05}
        )
        t.start()
        try:
            last = poll(lambda: q.schedules()[0].last_id, 10, "the first slot fired")
            assert q.result(last, timeout=10) == 2
        finally:
            stop.set()
            t.join(30)
    assert not t.is_alive()
    said = caplog.text
    assert "schedule junk of default is left alone" in said
    assert "schedule newer of default is left alone" in said


def test_a_cron_slot_key_is_the_slot_in_utc() -> None:
    assert slot_key("n", 0) == "schedule/n/1970-01-01T00:00:00Z"
    # the encoded arguments of a definition are the codec's, as a submit's are
    s = _good()
    assert codec.decode_call(s.args) == ((1,), {})


def test_a_producer_may_set_and_tick_schedules_but_not_remove_them(
    principals: dict[str, Any],
) -> None:
    """docs/iam: producer credentials suffice for ``lakeshore schedule tick --queue Q`` (a
    serverless timer's), removing is an operator's or a worker's."""
    q = principals["producer"].plane()
    s = q.schedule("timer", "tests.jobs:add_one", every=60, args=[1], queue="jobs")
    poll(lambda: q.store.now() >= s.start, 10, "the first slot")
    (done,) = q.tick_schedules(["jobs"])
    assert done.action == "fired" and done.id is not None
    assert q.status(done.id) == "queued"
    with pytest.raises(dls.PermissionDenied):
        q.unschedule("timer", "jobs")
    assert principals["worker"].plane().unschedule("timer", "jobs") is True


def test_a_slot_at_or_before_the_last_fired_is_never_fired_again() -> None:
    q, moved = shifted(MemoryStore())
    s = q.schedule("back", "tests.jobs:add_one", every=10, args=[1])
    moved.by += 1
    (first,) = q.tick_schedules(["default"])
    objs = objects(q)
    cur, etag = objs.read("back")
    objs.write(dataclasses.replace(cur, next_slot=s.start - 100), etag)  # set back by hand
    assert [d.action for d in q.tick_schedules(["default"])] == ["idle"]
    moved.by += 10
    (second,) = q.tick_schedules(["default"])
    assert (second.action, second.slot) == ("fired", s.start + 10)
    assert len(tickets(q)) == 2 and first.id != second.id


def test_a_slot_a_full_queue_refuses_stays_due_and_fires_when_there_is_room() -> None:
    q, moved = shifted(MemoryStore())
    q.configure("default", max_depth=1)
    f = q.udf(jobs.add_one)
    f.submit(1)  # the queue is full
    s = q.schedule("full", f, every=60, args=(1,))
    moved.by += 1
    (refused,) = q.tick_schedules(["default"])
    assert refused.action == "failed" and "full" in (refused.error or "")
    assert q.schedules()[0].next_slot == s.start  # still due
    assert dls.run_worker(q, once=True, isolation="thread") == 1  # room again
    (done,) = q.tick_schedules(["default"])
    assert (done.action, done.slot) == ("fired", s.start)
