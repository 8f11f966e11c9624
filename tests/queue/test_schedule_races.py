"""Schedules under the issue's bar (issue 34, item 2): many firers racing on one slot, firers
whose store clocks disagree, firers that die between their writes — always exactly one
invocation per slot, none before its slot — and what workers pay to watch schedules.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import firing
from lakeshore.model.schedule import slot_key
from lakeshore.store import LocalStore, MemoryStore, Store
from tests import jobs
from tests.shifting import Crash, Dying, Logged, Moved, Shifted
from tests.tiers import make_plane
from tests.waiting import poll

FIRERS = 8


def store_like(store: Store) -> Store:
    """Another handle on the same store, as another process would open it (a local
    directory: a store object of its own; memory and S3: the same, shared by threads)."""
    if isinstance(store, LocalStore):
        return LocalStore(store.root)
    return store


def invocations(q: Any, queue: str = "default") -> dict[str, list[str]]:
    """The invocations on ``queue`` by idempotency key (tombstones of abandoned submits
    left out: they never run)."""
    out: dict[str, list[str]] = {}
    for info in q.plane.ops(queue).tickets():
        inv = info.key.rsplit("/", 1)[1]
        rec = q.get(inv)
        if rec.error and rec.error.get("type") == "SubmitAbandoned":
            continue
        out.setdefault(rec.key, []).append(inv)
    return out


def firers(store: Store, moved: Moved, skews: list[float]) -> list[Any]:
    return [make_plane(Shifted(store_like(store), moved, skew)) for skew in skews]


def fire_all(planes: list[Any], name: str) -> list[firing.Fired]:
    """Every firer fires ``name`` once, all at the same moment."""
    start = threading.Barrier(len(planes))

    def one(p: Any) -> firing.Fired:
        start.wait(30)
        return firing.fire(p, "default", name)

    with ThreadPoolExecutor(len(planes)) as pool:
        return list(pool.map(one, planes))


# -- many firers, one slot ---------------------------------------------------------------------


def test_many_firers_racing_on_each_slot_make_one_invocation(atomic_store: Store) -> None:
    moved = Moved(frozen=atomic_store.now())
    planes = firers(atomic_store, moved, [0.0] * FIRERS)
    s = planes[0].schedule("race", "tests.jobs:add_one", every=60, args=[1])
    for n in range(3):
        moved.by = n * 60 + 1.0
        done = fire_all(planes, "race")
        slot = s.start + n * 60
        ids = {d.id for d in done if d.action == "fired"}
        assert len(ids) == 1, done  # every firer that fired got the same one invocation
        assert all(d.slot == slot for d in done if d.action == "fired")
        assert {d.action for d in done} <= {"fired", "idle"}
    found = invocations(planes[0])
    assert sorted(found) == sorted(slot_key("race", s.start + n * 60) for n in range(3))
    assert all(len(ids) == 1 for ids in found.values())
    (now,) = planes[0].schedules()
    assert (now.fired, now.missed, now.last_slot) == (3, 0, s.start + 120)


def test_firers_with_skewed_clocks_fire_each_slot_once_and_never_early(
    atomic_store: Store,
) -> None:
    """Firers whose store clocks differ by up to 3 s (S3's Date clock is good to about 1 s)
    fire in rounds while time passes in half seconds: each slot is one invocation, and its
    record was made by a firer whose clock said the slot had come."""
    moved = Moved(frozen=atomic_store.now())
    skews = [-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 2.0, 3.0]
    planes = firers(atomic_store, moved, skews)
    s = planes[4].schedule("skewed", "tests.jobs:add_one", every=10, args=[1])
    fired_by: dict[int, set[float]] = {}
    for step in range(1, 70):  # 34.5 s of store time: slots start+0 ... start+30
        moved.by = step * 0.5
        for p, d in zip(planes, fire_all(planes, "skewed"), strict=True):
            if d.action == "fired":
                assert d.slot is not None
                fired_by.setdefault(d.slot, set()).add(p.store.skew)
                assert d.slot <= p.store.now()  # by the clock of the firer that fired it
    found = invocations(planes[4])
    slots = [s.start + k * 10 for k in range(4)]
    assert sorted(found) == sorted(slot_key("skewed", t) for t in slots)
    for t in slots:
        (inv,) = found[slot_key("skewed", t)]
        rec = planes[4].get(inv)
        assert rec.submitted_at >= t - 3.0 - 0.5  # by the unskewed clock: at most the skew
        # the firers that got there first are the ones whose clocks run ahead
        assert max(fired_by[t]) > 0
    (now,) = planes[4].schedules()
    assert (now.fired, now.missed) == (4, 0)


# -- a firer that dies between its writes ------------------------------------------------------


def _one_due(store: Store, every: int = 3600) -> tuple[Any, Moved, dls.Schedule]:
    moved = Moved(frozen=store.now())
    q = make_plane(Shifted(store, moved))
    s = q.schedule("crashy", q.udf(jobs.add_one), every=every, args=(1,))
    moved.by = 1.0
    return q, moved, s


def test_a_firer_that_dies_after_its_submit_leaves_the_slot_to_the_next_one(
    atomic_store: Store,
) -> None:
    q, moved, s = _one_due(atomic_store)
    dying = make_plane(Dying(store_like(atomic_store), moved, lambda k: "/_schedules/" in k))
    with pytest.raises(Crash):
        firing.fire(dying, "default", "crashy")  # the invocation exists; the object not moved
    (inv,) = invocations(q)[slot_key("crashy", s.start)]
    assert q.schedules()[0].last_id is None
    done = firing.fire(q, "default", "crashy")
    assert (done.action, done.id, done.slot) == ("fired", inv, s.start)  # the same one
    assert invocations(q) == {slot_key("crashy", s.start): [inv]}
    assert q.schedules()[0].last_id == inv


def test_a_firer_that_dies_after_moving_the_object_leaves_nothing_to_do(
    atomic_store: Store,
) -> None:
    q, moved, s = _one_due(atomic_store)
    dying = make_plane(
        Dying(store_like(atomic_store), moved, lambda k: "/_schedules/" in k, after=True)
    )
    with pytest.raises(Crash):
        firing.fire(dying, "default", "crashy")
    assert firing.fire(q, "default", "crashy").action == "idle"
    (inv,) = invocations(q)[slot_key("crashy", s.start)]
    assert q.schedules()[0].last_id == inv


def test_a_firer_that_dies_between_key_and_ticket_is_repaired_by_the_next(
    atomic_store: Store,
) -> None:
    q, moved, s = _one_due(atomic_store)
    dying = make_plane(Dying(store_like(atomic_store), moved, lambda k: "/_keys/" in k, True))
    with pytest.raises(Crash):
        firing.fire(dying, "default", "crashy")  # the key names an id that was never published
    assert invocations(q) == {}
    moved.by += 31  # the key is old enough to be judged dead (KEY_REPAIR_GRACE_S)
    done = firing.fire(q, "default", "crashy")
    assert (done.action, done.slot) == ("fired", s.start)  # still the same slot (hourly)
    assert invocations(q) == {slot_key("crashy", s.start): [done.id]}
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    assert q.result(done.id, timeout=10) == 2


def test_a_firer_that_dies_before_anything_changes_nothing(atomic_store: Store) -> None:
    q, moved, s = _one_due(atomic_store)
    dying = make_plane(Dying(store_like(atomic_store), moved, lambda k: "/_keys/" in k))
    with pytest.raises(Crash):
        firing.fire(dying, "default", "crashy")
    assert invocations(q) == {}
    done = firing.fire(q, "default", "crashy")  # at once: no key was left behind
    assert (done.action, done.slot) == ("fired", s.start)


# -- what workers pay ---------------------------------------------------------------------------


def test_an_idle_worker_lists_schedules_once_not_per_poll() -> None:
    logged = Logged(MemoryStore())
    q = make_plane(logged)
    q.udf(jobs.add_one)
    later = q.store.now() + 3600  # nothing due while the test runs
    q.schedule("a", "tests.jobs:add_one", every=600, start=later, args=[1])
    q.schedule("b", "tests.jobs:add_one", cron="@daily", start=later, args=[1])
    logged.clear()
    stop = threading.Event()
    t = threading.Thread(
        target=dls.run_worker, args=(q,), kwargs={"stop": stop, "max_poll_s": 0.01}
    )
    t.start()
    try:
        poll(
            lambda: (
                logged.count("LIST", "/_tickets/") >= 100
                and logged.count("LIST", "/_schedules/") >= 1
            ),
            60,
            "100 idle polls",
        )
    finally:
        stop.set()
        t.join(30)
    assert logged.count("LIST", "/_schedules/") == 1  # at start; the next one in a minute
    assert logged.count("GET", "/_schedules/") == 2  # each object once
    assert logged.count("PUT", "/_schedules/") == 0


def test_a_worker_told_not_to_fire_never_looks_at_schedules() -> None:
    logged = Logged(MemoryStore())
    q = make_plane(logged)
    q.schedule("a", "tests.jobs:add_one", every=10, args=[1])
    logged.clear()
    dls.run_worker(q, idle_exit=0.3, fire_schedules=False, isolation="thread")
    assert logged.count("LIST", "/_schedules/") == 0
    assert invocations(q) == {}


def test_watch_lists_once_a_minute_reads_changes_only_and_fires_when_due() -> None:
    inner = MemoryStore()
    moved = Moved(frozen=inner.now())
    logged = Logged(inner, moved)
    q = make_plane(logged)
    s = q.schedule("w", "tests.jobs:add_one", every=300, start=q.store.now() + 100, args=[1])
    ticks = [1000.0]
    watch = firing.Watch(q, ["default"], jitter_s=0.0, ticks=lambda: ticks[0])
    logged.clear()
    wait = watch.step()
    assert logged.requests() == [
        ("LIST", "lakeshore/default/default/_schedules/"),
        ("GET", "lakeshore/default/default/_schedules/w"),
    ]
    assert 50 < wait <= 60  # the next listing, or the slot, whichever comes first
    logged.clear()
    ticks[0] += 30
    moved.by += 30
    watch.step()
    assert logged.requests() == []  # nothing due, no listing yet: no request at all
    ticks[0] += 31
    moved.by += 31
    watch.step()
    assert logged.requests() == [("LIST", "lakeshore/default/default/_schedules/")]  # no GET
    logged.clear()
    moved.by += s.start - q.store.now() + 0.1  # the slot is due
    watch.step()
    verbs = Counter(v for v, _ in logged.requests())
    assert verbs["LIST"] == 0 and verbs["GET"] >= 1
    assert logged.count("PUT", "/_schedules/w") == 1  # the object moved on once
    assert len(invocations(q)) == 1
    logged.clear()
    ticks[0] += 61
    watch.step()  # the listing sees the etag of our own write: no GET
    assert logged.requests() == [("LIST", "lakeshore/default/default/_schedules/")]
    q.schedule("w", "tests.jobs:add_one", every=300, args=[2])  # changed elsewhere
    logged.clear()
    ticks[0] += 61
    watch.step()
    assert logged.count("GET", "/_schedules/w") == 1


def test_two_workers_fire_a_slot_once_and_run_it(tmp_path: Path) -> None:
    """Two worker processes' worth of threads (a store object each) on one local store."""
    a = make_plane(LocalStore(tmp_path / "s"))
    b = make_plane(LocalStore(tmp_path / "s"))
    for q in (a, b):
        q.udf(jobs.add_one)
    a.schedule("both", jobs.add_one, every=3600, args=(5,))
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=dls.run_worker,
            args=(q,),
            kwargs={"stop": stop, "max_poll_s": 0.05, "worker_id": f"w{i}"},
        )
        for i, q in enumerate((a, b))
    ]
    for t in threads:
        t.start()
    try:
        inv = poll(lambda: a.schedules()[0].last_id, 30, "the slot fired")
        assert a.result(inv, timeout=30) == 6
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert len(invocations(a)) <= 1  # its ticket is gone once it ran; never a second one
    assert a.schedules()[0].fired == 1
    assert len([i for i in a.store.list("lakeshore/default/default/_keys/")]) == 1


def test_a_worker_keeps_firing_after_the_store_failed_for_a_while() -> None:
    class Flaky(Shifted):
        fail = False

        def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
            if self.fail and "/_schedules/" in key:
                raise dls.StoreUnavailable("get", "down", "wait")
            return self.inner.get(key, max_bytes)

    inner = MemoryStore()
    moved = Moved(frozen=inner.now())
    flaky = Flaky(inner, moved)
    q = make_plane(flaky)
    q.schedule("f", "tests.jobs:add_one", every=10, args=[1])
    ticks = [0.0]
    watch = firing.Watch(q, ["default"], jitter_s=0.0, ticks=lambda: ticks[0])
    flaky.fail = True
    moved.by += 1
    assert watch.step() <= 60  # the read failed: logged, not raised
    assert invocations(q) == {}
    flaky.fail = False
    ticks[0] += 61
    watch.step()
    assert len(invocations(q)) == 1
