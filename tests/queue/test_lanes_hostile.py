"""Lanes, the census and the deferral of a just-ended ticket, under ordinary churn and
hostile input: a worker alone on its queue keeps strict order, a ticket nobody serves is
taken within seconds whatever the census does, and signs of life or records with odd names
and times cannot break claims or hold a slot. Driven with one injected clock for the store,
the claimer's ticks and its listing age: nothing is timed, nothing sleeps."""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakeshore import codec
from lakeshore.keys import QueueKeys, worker_key
from lakeshore.model import lifecycle
from lakeshore.model.record import Blob
from lakeshore.protocol import claim_listing
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.lanes import HELP_WAIT_S, STUCK_S, Lanes, ring
from lakeshore.store import MemoryStore
from lakeshore.store.base import ObjectInfo
from lakeshore.store.local import LocalStore
from tests import jobs
from tests.tiers import make_plane


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """One clock for the store, the claimer's ticks and its listing age (time.monotonic as
    claim_listing.py sees it), so a listing is reused or not by this clock alone."""
    c = Clock()
    monkeypatch.setattr(claim_listing, "time", types.SimpleNamespace(monotonic=c))
    return c


def _alive(store: MemoryStore, ns: str, *workers: str) -> None:
    for w in workers:
        store.put(worker_key(ns, w), codec.encode({"worker": w, "seen_at": store.now()}))


# -- a worker alone on its queue, beside other queues' workers --------------------------


def test_a_worker_alone_on_its_queue_claims_in_order_beside_another_queues_worker(
    clock: Clock,
) -> None:
    store = MemoryStore()
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(40)]
    # a worker that serves another queue of the namespace (or one that stopped a minute ago,
    # or this worker's own previous run under another pid): its sign of life is fresh
    _alive(store, q.ns, "serves-queue-b")
    c = Claimer(q.plane.ops("default"), "alone-on-default", ticks=clock)
    order = []
    while (held := c.claim(store.now())) is not None:
        order.append(held.record.id)
        clock.t += 0.01
    assert order == ids  # the only worker on its queue: strict FIFO


# -- census churn and a lane no one serves --------------------------------------------


def test_a_lane_no_one_serves_is_adopted_while_other_workers_come_and_go(
    clock: Clock,
) -> None:
    store = MemoryStore()
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(300)]
    keys = QueueKeys(q.ns, "default")
    # "b" serves another queue; a fleet on that queue comes and goes: one worker a second
    _alive(store, q.ns, "b")
    ring_ = Lanes(keys, "a", clock)
    ring_.number(ring(["a", "b"]))
    # the oldest ticket of b's lane (a worker that comes later only ever takes tickets from
    # the lanes it lands between, never gives one to "a")
    target = next(i for i in ids if ring_.lane(keys.ticket_of_id(i) or "") != ring_.index)
    c = Claimer(q.plane.ops("default"), "a", ticks=clock)
    c.lanes.contended()  # as if a race on this queue had been lost: lanes apply
    got = []
    for step in range(30):  # 30 s; STUCK_S is 5 s
        store.delete(worker_key(q.ns, f"b-fleet-{step - 1}"))
        _alive(store, q.ns, f"b-fleet-{step}")
        held = c.claim(store.now())
        assert held is not None  # its own lane always has work: a backlog
        got.append(held.record.id)
        clock.t += 1.0
    assert target in got  # not left behind a lane nobody serves
    # a census that changes every second moves tickets between lanes with it: the target is
    # adopted once it heads its lane again (its time kept meanwhile). 1,000 runs: 87 % at the
    # 6th claim, the slowest at the 12th
    assert got.index(target) <= 3 * STUCK_S


def test_control_with_a_steady_census_the_lane_is_adopted(clock: Clock) -> None:
    store = MemoryStore()
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(300)]
    keys = QueueKeys(q.ns, "default")
    _alive(store, q.ns, "b", "b-fleet-0")
    ring_ = Lanes(keys, "a", clock)
    ring_.number(ring(["a", "b"]))
    target = next(i for i in ids if ring_.lane(keys.ticket_of_id(i) or "") != ring_.index)
    c = Claimer(q.plane.ops("default"), "a", ticks=clock)
    c.lanes.contended()
    got = []
    for _ in range(30):
        held = c.claim(store.now())
        assert held is not None
        got.append(held.record.id)
        clock.t += 1.0
    assert target in got  # and with a census that holds still


# -- census input from the store ------------------------------------------------------


class Listing(MemoryStore):
    """A store whose listing of the signs of life is given (keys and times only)."""

    def __init__(self, infos: list[ObjectInfo]) -> None:
        super().__init__()
        self.infos = infos

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        return iter([i for i in self.infos if i.key.startswith(prefix)])


def test_a_sign_of_life_dated_in_the_future_does_not_count_forever(clock: Clock) -> None:
    # a writer whose clock is a day ahead (LocalStore on a shared disk: the time is the
    # writer's), or a hostile key: an hour later that worker is long gone
    skewed = ObjectInfo(worker_key("ns", "skewed"), "e", 10, clock.t + 86_400 - 3_600)
    lanes = Lanes(QueueKeys("ns", "q"), "me", clock)
    assert lanes.survey(Listing([skewed]), clock.t) == ["me"]


def test_a_census_counts_the_live_workers_among_many_old_signs_of_life(
    clock: Clock,
) -> None:
    # default names are host:pid, so every run of a worker leaves a key; gc prunes them only
    # when run with older_than. Ten thousand past runs (an array job a day for a few weeks)
    old = [
        ObjectInfo(worker_key("ns", f"node{i:05d}_{1000 + i}"), "e", 10, clock.t - 86_400)
        for i in range(10_000)
    ]
    live = ObjectInfo(worker_key("ns", "zeta_1"), "e", 10, clock.t - 5)  # sorts after them
    lanes = Lanes(QueueKeys("ns", "q"), "me", clock)
    assert lanes.survey(Listing([*old, live]), clock.t) == ["me", "zeta_1"]


def test_a_sign_of_life_whose_name_is_not_utf8_does_not_break_claims(
    tmp_path: Path, clock: Clock
) -> None:
    store = LocalStore(tmp_path / "plane")
    q = make_plane(store)
    inv = q.udf(jobs.add_one).submit(1)
    store.put(worker_key(q.ns, "w1"), b"{}")
    folder = next(p for p in (tmp_path / "plane").rglob("_workers") if p.is_dir())
    with open(os.path.join(os.fsencode(folder), b"\xff\xfe.obj"), "wb") as fh:
        fh.write(b"{}")  # anyone who can write to the shared folder can make this name
    c = Claimer(q.plane.ops("default"), "w2", ticks=clock)
    held = c.claim(store.now())
    assert held is not None and held.record.id == inv


# -- the deferral of a just-ended ticket does not trust finished_at ----------------------


def test_a_ticket_of_a_record_ended_in_the_future_is_dropped_and_its_slot_freed(
    clock: Clock,
) -> None:
    q = make_plane(MemoryStore())
    clock.t = max(clock.t, q.store.now())
    q.configure("default", max_depth=1, on_full="reject")
    f = q.udf(jobs.add_one)
    inv = f.submit(1)
    ops = q.plane.ops("default")
    held = Claimer(ops, "dies", ticks=clock).claim(clock.t)
    assert held is not None and held.record.slot is not None
    # its worker's clock is ahead (or the record is hostile): finished_at a day from now;
    # the worker dies before it tidies anything
    done = lifecycle.succeed(held.record, held.token, Blob(inline=b"\x02"), clock.t + 86_400)
    ops.cas(done, held.etag)
    nxt = Claimer(ops, "next", ticks=clock)
    for _ in range(6):  # a minute of claims
        clock.t += 11
        assert nxt.claim(clock.t) is None  # a claim at store time clock.t
    assert q.status(inv) == "succeeded"
    assert q.status(f.submit(3)) == "queued"  # the slot was freed (raises QueueFull: held)


# -- the lane of an owner busy with long bodies ------------------------------------------


def test_the_lane_of_an_owner_busy_with_long_bodies_is_adopted_within_seconds(
    clock: Clock,
) -> None:
    store = MemoryStore()
    q = make_plane(store, lease_s=600.0)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(300)]
    keys = QueueKeys(q.ns, "default")
    _alive(store, q.ns, "a", "b")
    b = Claimer(q.plane.ops("default"), "b", ticks=clock)
    held_by_b = [b.claim(store.now()) for _ in range(6)]  # b's 6 slots: long bodies
    assert all(h is not None for h in held_by_b)
    ring_ = Lanes(keys, "a", clock)
    ring_.number(ring(["a", "b"]))
    taken = {h.record.id for h in held_by_b if h is not None}
    # the oldest ticket of b's lane that b has not taken: b will not take it for a while
    target = next(
        i for i in ids if i not in taken and ring_.lane(keys.ticket_of_id(i) or "") != ring_.index
    )
    a = Claimer(q.plane.ops("default"), "a", ticks=clock)
    got = []
    for _ in range(12):  # 12 s: STUCK_S (5 s) and a little more
        held = a.claim(store.now())
        assert held is not None  # a's own lane has a backlog
        got.append(held.record.id)
        clock.t += 1.0
    # b's running tickets at the head of its lane are skipped, not taken for its return
    assert target in got


def test_a_frozen_owners_invocation_is_taken_once_its_lease_and_backoff_end(
    clock: Clock,
) -> None:
    store = MemoryStore()
    store._clock = clock  # type: ignore[assignment]
    q = make_plane(store, lease_s=2.0, retry_backoff_s=1.0)
    inv = q.udf(jobs.add_one).submit(1)
    keys = QueueKeys(q.ns, "default")
    ticket = keys.ticket_of_id(inv) or ""

    def theirs(frozen: str, taker: str) -> bool:
        lanes = Lanes(keys, taker, clock)
        lanes.number(ring([frozen, taker]))
        return lanes.lane(ticket) != lanes.index

    # the ticket in the frozen worker's lane (both names searched: with one fixed, a ticket
    # just past one of its points on the ring stays its own for nearly every other name)
    frozen, taker = next(
        (frozen, taker)
        for taker in (f"b{i}" for i in range(32))
        for frozen in (f"z{i}" for i in range(32))
        if theirs(frozen, taker)
    )
    _alive(store, q.ns, frozen, taker)
    held = Claimer(q.plane.ops("default"), frozen, ticks=clock).claim(store.now())
    assert held is not None and held.record.id == inv  # then its node freezes
    b = Claimer(q.plane.ops("default"), taker, ticks=clock)
    b.lanes.contended()  # another process claims here: lanes apply
    clock.t = held.record.lease.expires_at + 0.01  # type: ignore[union-attr]
    expired = clock.t
    got, at = None, clock.t
    while got is None and clock.t < expired + 30:
        at = clock.t
        got = b.claim(store.now())  # a slot polling every 50 ms
        clock.t += 0.05
    assert got is not None and got.record.id == inv and got.record.attempt == 2
    # its full ticket's record exists (a create that loses), and this process requeues it:
    # neither is its owner at work, so no floor (FLOOR_S, 2 s) holds its lane back. What it
    # waits: the retry's backoff (1 s), and twice HELP_WAIT_S for a short lane, from the
    # first listing and when it is listed again after its backoff; a few polls
    assert at - expired <= 1.0 + 2 * HELP_WAIT_S + 5 * 0.05, at - expired
