"""Lanes: worker processes that share a queue claim apart, help a lane that has work when
their own is empty, and adopt a lane whose owner is not taking from it. Counted on a store
wrapper and driven with an injected clock, never timed."""

from __future__ import annotations

import time
import types
from collections import Counter
from typing import Any

import pytest

from lakeshore import codec
from lakeshore.keys import QueueKeys, worker_key
from lakeshore.protocol import claim_listing
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.lanes import (
    FLOOR_S,
    HELP_MIN,
    PAUSE_S,
    RECOUNT_S,
    STUCK_S,
    Lanes,
    ring,
)
from lakeshore.protocol.steps import QueueOps
from lakeshore.store import MemoryStore
from lakeshore.store.base import OVERWRITE, ObjectInfo, PutMode
from tests import jobs
from tests.tiers import make_plane


class Tally(MemoryStore):
    """Counts record creates that lost, and listings of the workers' signs of life."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        try:
            return super().put(key, data, mode)
        except Exception:
            if key.endswith("/record"):
                self.seen["lost"] += 1
            raise

    def list(self, prefix: str = "", start_after: str | None = None) -> Any:
        if "/_workers/" in prefix:
            self.seen["census"] += 1
        return super().list(prefix, start_after)


class Ticks:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _alive(store: MemoryStore, ns: str, *workers: str) -> None:
    for w in workers:
        store.put(worker_key(ns, w), codec.encode({"worker": w, "seen_at": store.now()}))


def _number(lanes: Lanes, names: list[str]) -> None:
    lanes.number(ring(names) if lanes.changed(names) else None)


def _ticket(i: int) -> ObjectInfo:
    return ObjectInfo(f"lakeshore/ns/q/_tickets/5/{i:026d}", f"e{i}", 500, 0.0)


def test_a_census_numbers_the_workers_seen_lately_and_looks_again_sooner_when_it_changed() -> None:
    store, ticks = MemoryStore(), Ticks()
    lanes = Lanes(QueueKeys("ns", "q"), "b", ticks)
    _alive(store, "ns", "a", "c")
    names = lanes.survey(store, store.now())
    assert names is not None
    _number(lanes, names)
    assert (lanes.index, lanes.count) == (1, 3)  # a, b, c
    assert lanes.survey(store, store.now()) is None  # not due yet
    ticks.t += 1.0
    names = lanes.survey(store, store.now())
    assert names is not None
    _number(lanes, names)  # the same census: the next one is twice as far
    ticks.t += 1.5
    assert lanes.survey(store, store.now()) is None
    ticks.t += 0.5
    _alive(store, "ns", "d")
    names = lanes.survey(store, store.now())
    assert names is not None
    _number(lanes, names)
    assert (lanes.index, lanes.count) == (1, 4)
    ticks.t += 1.0  # changed: looked at again after a second
    assert lanes.survey(store, store.now()) is not None


def test_a_census_leaves_out_signs_of_life_older_than_its_window() -> None:
    store = MemoryStore()
    lanes = Lanes(QueueKeys("ns", "q"), "me", Ticks())
    _alive(store, "ns", "old")
    names = lanes.survey(store, store.now() + 101)  # written 101 s before "now"
    assert names == ["me"]


def test_a_process_takes_its_own_lane_oldest_first_and_helps_the_fullest_from_its_new_end() -> None:
    lanes = Lanes(QueueKeys("ns", "q"), "w", Ticks())
    _number(lanes, ["v", "w"])
    listing = [_ticket(i) for i in range(40)]
    mine = [i for i, t in enumerate(listing) if lanes.lane(t.key) == lanes.index]
    assert lanes.pick(listing) == mine[0]
    others = [t for t in listing if lanes.lane(t.key) != lanes.index]
    assert lanes.pick(others) is None  # nothing of its own: the caller may help
    helped = {lanes.help(others) for _ in range(50)}
    assert helped <= set(range(len(others) - len(others) // 4, len(others)))


def test_a_census_that_counted_nobody_else_is_taken_again_soon_once_another_claims_here() -> None:
    store, ticks = MemoryStore(), Ticks()
    lanes = Lanes(QueueKeys("ns", "q"), "me", ticks)
    names = lanes.survey(store, store.now())
    assert names == ["me"]
    _number(lanes, names)
    _alive(store, "ns", "late")  # it announced itself after this census
    ticks.t += RECOUNT_S
    assert lanes.survey(store, store.now()) is None  # the next census is a second away
    lanes.contended()  # but a race was lost here: someone else claims
    names = lanes.survey(store, store.now())
    assert names == ["me", "late"]
    _number(lanes, names)
    assert lanes.count == 2
    ticks.t += RECOUNT_S
    lanes.contended()  # others are counted now: no census before its time
    assert lanes.survey(store, store.now()) is None


def test_a_miss_in_its_own_lane_has_the_census_taken_again_soon_and_less_soon_if_nothing_new() -> (
    None
):
    store, ticks = MemoryStore(), Ticks()
    lanes = Lanes(QueueKeys("ns", "q"), "w", ticks)
    _alive(store, "ns", "v")

    def census() -> None:
        names = lanes.survey(store, store.now())
        assert names is not None
        _number(lanes, names)

    def wait() -> float:  # until the census is due
        t0 = ticks.t
        while not lanes.census_due():
            ticks.t += 0.125
        return ticks.t - t0

    census()
    listing = [_ticket(i) for i in range(40)]
    mine = next(t for t in listing if lanes.lane(t.key) == lanes.index)
    theirs = next(t for t in listing if lanes.lane(t.key) != lanes.index)
    ticks.t += RECOUNT_S
    lanes.contended(theirs.key)
    assert not lanes.census_due()  # another lane's owner at work, as counted
    lanes.contended(mine.key)
    # another process took from this one's lane: one of the two may have counted before the
    # other announced itself (as when many start together): count again
    assert lanes.census_due()
    waits = []
    for _ in range(4):  # or a helper at work, as counted: each census finds nothing new
        census()
        lanes.contended(mine.key)
        waits.append(wait())
    assert waits == [2 * RECOUNT_S, 4 * RECOUNT_S, 8 * RECOUNT_S, 16 * RECOUNT_S]
    _alive(store, "ns", "u")  # one more worker: the next census changes, and it starts over
    census()
    mine = next(t for t in listing if lanes.lane(t.key) == lanes.index)  # lanes anew
    lanes.contended(mine.key)
    assert wait() == RECOUNT_S


def test_help_leaves_a_lane_with_few_tickets_to_its_owner() -> None:
    lanes = Lanes(QueueKeys("ns", "q"), "w", Ticks())
    _number(lanes, ["v", "w"])
    others = [t for t in (_ticket(i) for i in range(60)) if lanes.lane(t.key) != lanes.index]
    assert lanes.help(others[: HELP_MIN - 1]) is None
    assert lanes.help(others[:HELP_MIN]) == HELP_MIN - 1  # the newest quarter of four: one


def test_a_pick_to_help_found_taken_lifts_its_lanes_floor_and_pauses_help() -> None:
    ticks = Ticks()
    lanes = Lanes(QueueKeys("ns", "q"), "w", ticks)
    _number(lanes, ["u", "v", "w"])
    listing = [_ticket(i) for i in range(90)]
    others = [t for t in listing if lanes.lane(t.key) != lanes.index]
    first = lanes.help(others)
    assert first is not None
    floor = others[first].key
    lane = lanes.lane(floor)
    lanes.missed(floor)  # its owner had taken it (or ended it) since the listing
    assert lanes.help(others) is None  # no lane is helped for a while
    ticks.t += PAUSE_S
    picks = {lanes.help(others) for _ in range(100)}
    assert None not in picks  # the other lane still has plenty
    # of the lane that missed, only what is newer than the miss (its owner took the rest)
    assert all(
        others[i].key > floor for i in picks if i is not None and lanes.lane(others[i].key) == lane
    )
    mine = next(t for t in listing if lanes.lane(t.key) == lanes.index)
    lanes.missed(mine.key)  # a miss in its own lane says nothing about the others
    assert lanes.help(others) is not None


def test_a_lane_whose_oldest_ticket_stays_is_adopted_until_a_race_on_it_is_lost() -> None:
    ticks = Ticks()
    lanes = Lanes(QueueKeys("ns", "q"), "w", ticks)
    _number(lanes, ["v", "w"])
    listing = [_ticket(i) for i in range(40)]
    theirs = [t for t in listing if lanes.lane(t.key) != lanes.index]
    lanes.observe(listing)
    ticks.t += STUCK_S - 0.1
    lanes.observe(listing)
    assert lanes.pick(theirs) is None  # not yet
    ticks.t += 0.2
    _number(lanes, ["u", "v", "w"])  # a census that changed keeps how long a head stayed
    lanes.observe(listing)
    theirs = [t for t in listing if lanes.lane(t.key) != lanes.index]
    assert lanes.pick(theirs) == 0  # adopted: oldest first, as one's own
    lanes.collided(theirs[0].key)  # its owner is back
    rest = [t for t in theirs if lanes.lane(t.key) != lanes.lane(theirs[0].key)]
    assert lanes.pick(theirs) == theirs.index(rest[0])  # that lane is left to its owner
    ticks.t += STUCK_S + 0.1
    lanes.observe(listing)
    assert lanes.pick(theirs) == 0  # for a while


def test_a_lane_whose_owner_keeps_taking_its_oldest_ticket_is_never_adopted() -> None:
    ticks = Ticks()
    lanes = Lanes(QueueKeys("ns", "q"), "w", ticks)
    _number(lanes, ["v", "w"])
    listing = [_ticket(i) for i in range(200)]
    for _ in range(40):  # 20 s of a deep backlog whose owner takes a ticket every 0.5 s
        lanes.observe(listing)
        theirs = [t for t in listing if lanes.lane(t.key) != lanes.index]
        assert lanes.pick(theirs) is None
        listing.remove(theirs[0])
        ticks.t += 0.5


def test_two_processes_with_signs_of_life_claim_apart_with_no_lost_create() -> None:
    store = Tally()
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(40)]
    _alive(store, q.ns, "w1", "w2")
    keys = QueueKeys(q.ns, "default")
    ticks = Ticks()  # frozen: no census is due again
    a = Claimer(QueueOps(store, keys), "w1", ticks)
    b = Claimer(QueueOps(store, keys), "w2", ticks)
    for c in (a, b):  # each has seen the other claim from this queue
        c.lanes.contended()
    got: list[str] = []
    for _ in range(10):  # in turn, each from its own listing (reused between its claims)
        for c in (a, b):
            held = c.claim(store.now())
            assert held is not None
            got.append(held.record.id)
    assert store.seen["lost"] == 0
    assert len(set(got)) == 20 and set(got) <= set(ids)
    assert store.seen["census"] == 2  # one LIST each, for all their claims so far


def test_without_signs_of_life_a_process_claims_in_strict_order() -> None:
    store = Tally()
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(5)]
    c = Claimer(q.plane.ops("default"), "alone")
    order = []
    while (held := c.claim(store.now())) is not None:
        order.append(held.record.id)
    assert order == ids


def test_lanes_are_about_equal_and_a_worker_more_moves_only_its_share() -> None:
    keys = [_ticket(i).key for i in range(8000)]
    names = [f"node{i}_{4000 + i}" for i in range(16)]
    one, more = Lanes(QueueKeys("ns", "q"), "node0_4000", Ticks()), None
    _number(one, names)
    sizes = Counter(one.lane(k) for k in keys)
    assert len(sizes) == 16
    assert max(sizes.values()) < 1.35 * 8000 / 16 and min(sizes.values()) > 0.65 * 8000 / 16
    more = Lanes(QueueKeys("ns", "q"), "node0_4000", Ticks())
    _number(more, [*names, "late_1"])
    owner = dict(enumerate(sorted(names)))
    owner_more = dict(enumerate(sorted([*names, "late_1"])))
    moved = sum(owner[one.lane(k)] != owner_more[more.lane(k)] for k in keys)
    assert moved < 0.12 * len(keys)  # about 1/17: what the new worker takes, no more


def test_a_process_that_finds_nothing_to_claim_sends_its_ticket_deletes_at_once() -> None:
    store = MemoryStore()
    q = make_plane(store)
    ops = q.plane.ops("default")
    ops._tidier._clock = lambda: 0.0  # its batch never comes due by itself
    store.put("lakeshore/done-ticket", b"x")
    ops._tidier.delete("lakeshore/done-ticket")
    assert [i.key for i in store.list("lakeshore/done")] == ["lakeshore/done-ticket"]
    assert Claimer(ops, "w").claim(store.now()) is None  # nothing queued: idle
    deadline = time.monotonic() + 10
    while list(store.list("lakeshore/done")) and time.monotonic() < deadline:
        time.sleep(0.01)  # the tidier's thread: polled with a deadline
    assert list(store.list("lakeshore/done")) == []


def test_a_pass_that_leaves_short_lanes_to_their_owners_says_the_queue_is_not_drained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks = Ticks()
    # the listing's age too is this clock's: a stalled machine must not make it stale
    monkeypatch.setattr(claim_listing, "time", types.SimpleNamespace(monotonic=ticks))
    store = Tally()
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(HELP_MIN - 1)]
    keys = QueueKeys(q.ns, "default")
    tickets = [t.key for t in QueueOps(store, keys).tickets()]
    assert len(tickets) == len(ids)

    def theirs(me: str, other: str) -> bool:
        probe = Lanes(keys, me, ticks)
        _number(probe, [me, other])
        return all(probe.lane(k) != probe.index for k in tickets)

    # two workers, the other's lane holding every ticket (the names decide the lanes). Both
    # names are searched: with one fixed, a ticket just past one of its points on the ring
    # stays its own for nearly every other name (1 run in 25 found none of 500)
    me, other = next(
        (me, other)
        for me in (f"v{i}" for i in range(50))
        for other in (f"w{i}" for i in range(50))
        if theirs(me, other)
    )
    _alive(store, q.ns, me, other)
    w1 = Claimer(QueueOps(store, keys), me, ticks)
    w1.lanes.contended()  # it has seen the other claim here
    assert w1.claim(store.now()) is None  # a lane this short is left to its owner
    assert w1.held_back(grace=1.0)  # but the queue is not drained: a draining worker stays
    ticks.t += 2.0
    assert not w1.held_back(grace=1.0)
    consumer = Claimer(QueueOps(store, keys), me, ticks, payloads=True)
    consumer.lanes.contended()
    assert consumer.lanes.help([_ticket(1)], eager=True) == 0  # a consumer takes what there is
    # whatever keeps that lane from being adopted (here: its head looks new in every
    # listing, as when listings alternate past a scan of skipped tickets), a process whose
    # passes have left work to the others for 10 s takes it itself
    w1.lanes.observe = lambda listing: w1.lanes._since.clear()  # type: ignore[method-assign]
    held_from = ticks.t
    while (held := w1.claim(store.now())) is None:
        assert ticks.t - held_from < 2 * STUCK_S + 1, "left to its owner for good"
        ticks.t += 0.5
    assert held.record.id in ids and ticks.t - held_from >= 2 * STUCK_S - 2.0


def test_a_floor_hides_only_its_own_band_and_only_for_a_while() -> None:
    ticks = Ticks()
    lanes = Lanes(QueueKeys("ns", "q"), "w", ticks)
    _number(lanes, ["v", "w"])

    def ticket(band: int, i: int) -> ObjectInfo:
        return ObjectInfo(f"lakeshore/ns/q/_tickets/{band}/{i:026d}", f"e{i}", 500, 0.0)

    theirs = [t for t in (ticket(5, i) for i in range(80)) if lanes.lane(t.key) != lanes.index]
    lanes.missed(theirs[-1].key)  # the newest of the lane in band 5 was found taken
    ticks.t += PAUSE_S
    assert lanes.help(theirs) is None  # band 5 of that lane: all up to the floor
    urgent = [t for t in (ticket(4, i) for i in range(80)) if lanes.lane(t.key) != lanes.index]
    assert lanes.help(urgent) is not None  # another band: keys compare only within one
    ticks.t += FLOOR_S
    assert lanes.help(theirs) is not None  # the owner's batch delete is done by now
