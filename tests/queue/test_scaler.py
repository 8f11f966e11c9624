"""The scaler against its promises, with a provider whose fleet lives in the test: one scaler
acts per queue (two started at once never double the fleet), a lost or stale lease launches
nothing, a store or provider that fails launches nothing, waiting workers count, the
cool-down and the caps hold, and a hostile lease or ticket cannot steer it."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Collection, Iterator
from typing import Any

import msgpack
import pytest

import lakeshore as dls
from lakeshore.errors import ProviderError, StoreUnavailable
from lakeshore.keys import QueueKeys
from lakeshore.model.record import Record
from lakeshore.protocol.scaler_lease import MAX_LEASE_S, ScalerLease, ScalerLeases
from lakeshore.providers import Launched, WorkerSpec
from lakeshore.store import MemoryStore, ObjectInfo, Store
from lakeshore.store.base import OVERWRITE
from tests import jobs
from tests.fleet import UNUSED_URL, Fleet, scaler_for
from tests.forwarding import Forwarding
from tests.tiers import make_plane


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _plane_with_work(store: Store, n: int, **provider: Any) -> Any:
    q = make_plane(store)
    q.configure("hpc", provider={"kind": "local", "cooldown_s": 0, **provider})
    f = q.udf(jobs.add_one, queue="hpc")
    for i in range(n):
        f.submit(i)
    return q


def test_launches_what_the_depth_asks_within_the_queue_maximum() -> None:
    q = _plane_with_work(MemoryStore(), 25, max_workers=4, jobs_per_worker=10)
    fleet = Fleet()
    (report,) = scaler_for(q, fleet).tick()
    assert (report.live, report.wanted, len(report.launched)) == (25, 3, 3)
    assert len(fleet.workers) == 3
    spec = fleet.specs[0]  # the worker command carries the queue and the block's settings
    assert spec.argv[1:4] == ("-m", "lakeshore", "worker")
    for flag, value in [("--queue", "hpc"), ("--idle-exit", "60"), ("--url", UNUSED_URL)]:
        assert spec.argv[spec.argv.index(flag) + 1] == value
    (again,) = scaler_for(q, fleet).tick()  # a second scaler after the first one let go?
    assert again.acting is False  # no: the first still holds the lease


def test_two_scalers_started_at_once_launch_one_fleet(atomic_store: Store) -> None:
    q = _plane_with_work(atomic_store, 40, max_workers=4, jobs_per_worker=10)
    fleet = Fleet()
    scalers = [scaler_for(q, fleet) for _ in range(2)]
    start = threading.Barrier(2)
    reports: list[list[Any]] = [[], []]

    def run(i: int) -> None:
        start.wait()
        for _ in range(5):
            reports[i] += scalers[i].tick()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    launched = [sum(len(r.launched) for r in rs) for rs in reports]
    assert sorted(launched) == [0, 4]  # one scaler acted, the other launched nothing
    assert len(fleet.workers) == 4
    idle = reports[launched.index(0)]
    assert all(not r.acting and not r.launched for r in idle)
    assert idle[-1].holder == scalers[launched.index(4)].owner


def test_waiting_workers_count_so_a_stuck_queue_gets_no_more() -> None:
    q = _plane_with_work(MemoryStore(), 100, max_workers=4, jobs_per_worker=1)
    fleet = Fleet(state="pending")  # nothing ever starts: a full SLURM partition
    scaler = scaler_for(q, fleet)
    for _ in range(5):
        (report,) = scaler.tick()
    assert len(fleet.workers) == 4 and report.pending == 4 and not report.launched


def test_waiting_workers_beyond_the_need_are_cancelled_running_ones_never() -> None:
    store = MemoryStore()
    q = _plane_with_work(store, 0, max_workers=4)
    fleet = Fleet(state="pending")
    tag = dls.providers.tag_of(UNUSED_URL, "default", "hpc")
    fleet.workers = {"p1": Launched("p1", tag, "pending"), "p2": Launched("p2", tag, "pending")}
    fleet.workers["r1"] = Launched("r1", tag, "running")
    (report,) = scaler_for(q, fleet).tick()
    assert report.live == 0 and sorted(report.cancelled) == ["p1", "p2"]
    assert list(fleet.workers) == ["r1"]  # it leaves by its idle exit


def test_the_cooldown_holds_across_scalers() -> None:
    store = MemoryStore()
    clock = Clock()
    q = _plane_with_work(store, 10, max_workers=4, jobs_per_worker=1)
    q.configure("hpc", **{"provider.cooldown_s": 60})
    fleet = Fleet()
    first = scaler_for(q, fleet, clock=clock)
    (report,) = first.tick()
    assert len(report.launched) == 4
    first.close()  # gives the lease back, keeping the launch time
    fleet.finish_all()  # the workers died at once: the queue wants 4 again
    second = scaler_for(q, fleet, clock=clock)
    clock.t += 30
    (report,) = second.tick()
    assert report.acting and not report.launched and "cooling down" in report.why
    clock.t += 31
    (report,) = second.tick()
    assert len(report.launched) == 4


def test_the_scalers_own_cap_is_shared_by_its_queues() -> None:
    q = _plane_with_work(MemoryStore(), 50, max_workers=10, jobs_per_worker=1)
    q.configure("other", provider={"kind": "local", "max_workers": 10, "jobs_per_worker": 1})
    g = q.udf(jobs.echo, queue="other")
    for i in range(50):
        g.submit(i)
    fleet = Fleet()
    scaler = dls.Scaler(q, ["hpc", "other"], fleet, url=UNUSED_URL, max_workers=6)
    reports = scaler.tick()
    assert [len(r.launched) for r in reports] == [6, 0]
    assert "cap of 6" in reports[1].why
    scaler.tick()
    assert len(fleet.workers) == 6


def test_a_takeover_after_expiry_fences_the_stalledscaler_for() -> None:
    store = MemoryStore()
    clock = Clock()
    q = _plane_with_work(store, 10, max_workers=2, jobs_per_worker=1)
    fleet = Fleet()
    mono = Clock(0.0)
    slow = scaler_for(q, fleet, clock=clock, monotonic=mono, lease_s=30)
    fast = scaler_for(q, fleet, clock=clock, lease_s=30)
    assert slow.tick()[0].launched  # it holds the lease
    fleet.finish_all()
    clock.t += 31  # the slow one stalls past its lease: the other takes over
    assert len(fast.tick()[0].launched) == 2
    (report,) = slow.tick()  # back again: its renewal is a clean miss
    assert not report.acting and not report.launched and report.holder == fast.owner


def test_a_round_slower_than_half_the_lease_acts_next_round() -> None:
    q = _plane_with_work(MemoryStore(), 10, max_workers=2, jobs_per_worker=1)
    fleet = Fleet()
    ticks = iter([0.0, 16.0])  # the first round stalls between lease and act, then none do

    def mono() -> float:
        return next(ticks, 100.0)

    scaler = scaler_for(q, fleet, monotonic=mono, lease_s=30)
    (report,) = scaler.tick()
    assert report.acting and not report.launched and "half the lease" in report.why
    (report,) = scaler.tick()
    assert len(report.launched) == 2


class Unreachable(Forwarding):
    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.down = False

    def put(self, key: str, data: bytes, mode: Any = OVERWRITE) -> str:
        if self.down and key.endswith("/_scaler"):
            raise StoreUnavailable("put", "the store is unreachable", "wait")
        return super().put(key, data, mode)


def test_a_scaler_that_loses_the_store_stops_launching() -> None:
    store = Unreachable(MemoryStore())
    q = _plane_with_work(store, 10, max_workers=4, jobs_per_worker=1)
    fleet = Fleet()
    scaler = scaler_for(q, fleet)
    assert len(scaler.tick()[0].launched) == 4
    fleet.finish_all()
    store.down = True
    (report,) = scaler.tick()
    assert report.error and "unreachable" in report.error and not fleet.workers
    store.down = False
    assert len(scaler.tick()[0].launched) == 4  # it comes back by itself


def test_a_provider_that_cannot_list_launches_nothing() -> None:
    q = _plane_with_work(MemoryStore(), 10, max_workers=4)
    fleet = Fleet()
    fleet.fail_list = True
    (report,) = scaler_for(q, fleet).tick()
    assert report.error and "the tool is down" in report.error and not fleet.workers


def test_a_queue_of_another_provider_kind_or_none_launches_nothing() -> None:
    q = _plane_with_work(MemoryStore(), 10)
    fleet = Fleet()
    scaler = scaler_for(q, fleet)
    q.configure("hpc", provider="slurm")
    (report,) = scaler.tick()
    assert report.error and "'slurm'" in report.error and not fleet.workers
    q.configure("hpc", provider=None)
    (report,) = scaler.tick()
    assert "no provider" in report.why and not fleet.workers


@pytest.mark.parametrize(
    "forged",
    [
        b"\xc1 not msgpack",
        msgpack.packb({"v": 1, "owner": "mallory", "expires_at": 1e300}),
        msgpack.packb({"v": 1, "owner": "mallory", "expires_at": float("nan")}),
        msgpack.packb({"v": 1, "owner": ["x"], "expires_at": 5}),
        msgpack.packb({"v": 2, "owner": "future", "expires_at": 5}),
        b"x" * 10_000,
    ],
)
def test_a_forged_lease_is_taken_over(forged: bytes) -> None:
    store = MemoryStore()
    q = _plane_with_work(store, 3, max_workers=1)
    store.put(QueueKeys("default", "hpc").scaler_lease, forged, OVERWRITE)
    fleet = Fleet()
    (report,) = scaler_for(q, fleet).tick()
    assert report.acting and len(report.launched) == 1


def test_a_live_lease_far_in_the_future_counts_as_forged() -> None:
    store, clock = MemoryStore(), Clock()
    keys = QueueKeys("default", "hpc")
    lease = ScalerLease("mallory", clock.t + MAX_LEASE_S + 100)  # past the clock slack too
    store.put(keys.scaler_lease, lease.to_bytes(), OVERWRITE)
    held, _ = ScalerLeases(store, keys, "me", 30, clock).take(None)
    assert held is not None and held.lease.owner == "me"
    honest = ScalerLease("alice", clock.t + 100)
    store.put(keys.scaler_lease, honest.to_bytes(), OVERWRITE)
    held, seen = ScalerLeases(store, keys, "me", 30, clock).take(None)
    assert held is None and seen is not None and seen.owner == "alice"


def test_a_forged_launch_time_holds_off_one_cooldown_at_most() -> None:
    store, clock = MemoryStore(), Clock()
    q = _plane_with_work(store, 3, max_workers=1)
    q.configure("hpc", **{"provider.cooldown_s": 60})
    forged = ScalerLease("mallory", 0.0, launched_at=clock.t + 1e9)  # expired, far-off launch
    store.put(QueueKeys("default", "hpc").scaler_lease, forged.to_bytes(), OVERWRITE)
    scaler = scaler_for(q, Fleet(), clock=clock)
    assert "cooling down" in scaler.tick()[0].why
    clock.t += 61
    assert len(scaler.tick()[0].launched) == 1


def test_forged_tickets_do_not_inflate_the_depth() -> None:
    store = MemoryStore()
    q = _plane_with_work(store, 2, max_workers=50, jobs_per_worker=1)
    keys = QueueKeys("default", "hpc")
    for i in range(20):
        store.put(f"{keys.tickets_prefix}5/not-an-id-{i}", b"x", OVERWRITE)
    (report,) = scaler_for(q, Fleet()).tick()
    assert report.live == 2 and len(report.launched) == 2


def test_once_gives_the_lease_back() -> None:
    q = _plane_with_work(MemoryStore(), 3, max_workers=1)
    fleet = Fleet()
    scaler_for(q, fleet).run(once=True)
    assert len(fleet.workers) == 1
    (report,) = scaler_for(q, fleet).tick()  # the next --once run acts at once
    assert report.acting and report.why == "enough workers"


def test_run_stops_on_the_event_and_lets_go() -> None:
    q = _plane_with_work(MemoryStore(), 3, max_workers=1)
    stop = threading.Event()
    seen: list[Any] = []

    def on_report(report: Any) -> None:
        seen.append(report)
        if len(seen) == 3:
            stop.set()

    scaler_for(q, Fleet(), interval_s=0.05).run(stop, on_report)
    assert len(seen) == 3
    assert scaler_for(q, Fleet()).tick()[0].acting


def test_bad_arguments_are_refused() -> None:
    q = make_plane(MemoryStore())
    with pytest.raises(dls.InvalidArgument, match="memory"):
        dls.Scaler(q, ["hpc"], Fleet())
    with pytest.raises(dls.InvalidArgument, match="no queue"):
        dls.Scaler(q, [], Fleet(), url=UNUSED_URL)
    with pytest.raises(dls.InvalidArgument, match="queue"):
        dls.Scaler(q, ["../x"], Fleet(), url=UNUSED_URL)
    with pytest.raises(dls.InvalidArgument, match="max_workers"):
        dls.Scaler(q, ["hpc"], Fleet(), url=UNUSED_URL, max_workers=0)


class Counting(Forwarding):
    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self.calls["GET"] += 1
        return super().get(key, max_bytes)

    def put(self, key: str, data: bytes, mode: Any = OVERWRITE) -> str:
        self.calls["PUT"] += 1
        return super().put(key, data, mode)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        self.calls["LIST"] += 1  # one page here: far below 1000 live invocations
        return super().list(prefix, start_after)


def test_a_round_costs_the_same_however_long_the_history() -> None:
    store = Counting(MemoryStore())
    q = _plane_with_work(store, 0, max_workers=4)
    f = q.udf(jobs.add_one, queue="hpc")
    scaler = scaler_for(q, Fleet())
    scaler.tick()  # takes the lease

    def one_round() -> Counter[str]:
        store.calls.clear()
        scaler.tick()
        return Counter(store.calls)

    empty = one_round()
    assert empty == {"PUT": 1, "GET": 1, "LIST": 1}  # renew, queue record, tickets
    for i in range(200):
        f.submit(i)
    dls.run_worker(q, queues=["hpc"], max_jobs=200, isolation="thread")
    assert q.status(f.submit(0)) == "queued"  # one live invocation, 200 finished
    busy = one_round()
    # a near-empty queue (1 to 64 live) reads each new ticket once; one PUT marks the launch
    assert busy == {"PUT": 2, "GET": 2, "LIST": 1}
    assert one_round() == {"PUT": 1, "GET": 1, "LIST": 1}  # the ticket is known now


class SlowTickets(Forwarding):
    """Listing tickets takes ``seconds`` of the scaler's clock (a deep or forged backlog)."""

    def __init__(self, inner: Store, mono: Clock, seconds: float) -> None:
        super().__init__(inner)
        self.mono, self.seconds = mono, seconds

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        if "/_tickets/" in prefix:
            self.mono.t += self.seconds
        return super().list(prefix, start_after)


def test_a_slow_depth_count_never_eats_into_the_lease() -> None:
    mono = Clock(0.0)
    store = SlowTickets(MemoryStore(), mono, seconds=1000.0)
    q = _plane_with_work(store, 5, max_workers=2, jobs_per_worker=1)
    (report,) = scaler_for(q, Fleet(), monotonic=mono, lease_s=30).tick()
    assert len(report.launched) == 2  # counted before the lease was taken


def test_counting_stops_where_it_changes_nothing() -> None:
    q = _plane_with_work(MemoryStore(), 30, max_workers=2, jobs_per_worker=5)
    (report,) = scaler_for(q, Fleet()).tick()
    assert (report.live, report.more, len(report.launched)) == (10, True, 2)
    assert "10+ live" in report.line()


class SlowMark(Forwarding):
    """The lease write that marks a launch answers ``seconds`` late (of the scaler's clock)."""

    def __init__(self, inner: Store, mono: Clock, seconds: float) -> None:
        super().__init__(inner)
        self.mono, self.seconds, self.puts = mono, seconds, 0

    def put(self, key: str, data: bytes, mode: Any = OVERWRITE) -> str:
        etag = super().put(key, data, mode)
        if key.endswith("/_scaler"):
            self.puts += 1
            if self.puts == 2:  # the first renews the lease, the second marks the launch
                self.mono.t += self.seconds
        return etag


def test_a_launch_never_starts_once_half_the_lease_passed_in_the_mark() -> None:
    mono = Clock(0.0)
    store = SlowMark(MemoryStore(), mono, seconds=21.0)
    q = _plane_with_work(store, 5, max_workers=2, jobs_per_worker=1)
    fleet = Fleet()
    scaler = scaler_for(q, fleet, monotonic=mono, lease_s=40)
    (report,) = scaler.tick()
    assert not report.launched and "took over half the lease" in report.why
    assert not fleet.workers
    assert len(scaler.tick()[0].launched) == 2  # next round, with a fresh mark


def test_a_queue_that_changes_provider_kind_is_let_go() -> None:
    q = _plane_with_work(MemoryStore(), 5, max_workers=2, jobs_per_worker=1)
    local = scaler_for(q, Fleet())
    assert local.tick()[0].acting
    q.configure(
        "hpc", provider={"kind": "slurm", "max_workers": 2, "jobs_per_worker": 1, "cooldown_s": 0}
    )
    assert local.tick()[0].error  # and it gave the lease back
    slurm = Fleet()
    slurm.kind = "slurm"
    (report,) = scaler_for(q, slurm).tick()
    assert report.acting and len(report.launched) == 2


def test_a_store_clock_stepping_back_holds_off_one_cooldown_at_most() -> None:
    clock = Clock()
    q = _plane_with_work(MemoryStore(), 5, max_workers=2, jobs_per_worker=1)
    q.configure("hpc", **{"provider.cooldown_s": 60})
    fleet = Fleet()
    scaler = scaler_for(q, fleet, clock=clock)
    assert len(scaler.tick()[0].launched) == 2
    fleet.finish_all()
    clock.t -= 86_400  # a day back: the last launch now lies in the future
    assert "cooling down" in scaler.tick()[0].why
    clock.t += 61
    assert len(scaler.tick()[0].launched) == 2


def test_waiting_slurm_tasks_are_cancelled_newest_first() -> None:
    from lakeshore.scaler import _newest_first

    ids = ["99_3", "5_9", "5_10", "100_1", "100_0", "pod-b", "pod-a"]
    assert sorted(ids, key=_newest_first) == [
        "100_1",
        "100_0",
        "99_3",
        "5_10",
        "5_9",
        "pod-a",
        "pod-b",
    ]


def test_planted_ticket_names_cannot_make_the_count_endless_nor_cancel() -> None:
    store = MemoryStore()
    q = _plane_with_work(store, 3, max_workers=2, jobs_per_worker=1)
    keys = QueueKeys("default", "hpc")
    for i in range(3000):  # names that are no id, sorting before the real tickets
        store.put(f"{keys.tickets_prefix}0/0planted-{i:05d}", b"x", OVERWRITE)
    fleet = Fleet(state="pending")
    tag = dls.providers.tag_of(UNUSED_URL, "default", "hpc")
    fleet.workers = {"p1": Launched("p1", tag, "pending")}
    (report,) = scaler_for(q, fleet).tick()
    # the count gave up after 2 x 2 + 1000 keys, having seen no id: taken as "at least
    # enough", so it launches up to the maximum and cancels no waiting worker
    assert (report.live, report.more) == (0, True) and "0+ live" in report.line()
    assert not report.cancelled and len(report.launched) == 1 and len(fleet.workers) == 2


def test_a_queue_without_a_provider_says_so_in_the_log_line() -> None:
    q = _plane_with_work(MemoryStore(), 1)
    q.configure("hpc", provider=None)
    (report,) = scaler_for(q, Fleet()).tick()
    assert report.line() == "hpc: no provider on the queue record: workers are attached by hand"


def test_tombstones_and_payloads_keep_no_worker_cycling() -> None:
    store = Counting(MemoryStore())
    q = _plane_with_work(store, 0, max_workers=2)
    keys = QueueKeys("default", "hpc")
    wq = dls.WorkQueue("hpc", plane=q)
    wq.submit({"a": 1})  # a work queue's payload: no function worker takes it
    inv = q.udf(jobs.add_one, queue="hpc").submit(1)
    ticket = next(i.key for i in store.list(keys.tickets_prefix) if inv in i.key)
    rec = Record.from_bytes(store.get(ticket)[0])
    done = dataclasses.replace(rec, state="failed")  # a gc tombstone at a ticket's key
    store.put(ticket, done.to_bytes(), OVERWRITE)
    fleet = Fleet()
    scaler = scaler_for(q, fleet)
    (report,) = scaler.tick()
    assert report.live == 0 and not fleet.workers
    store.calls.clear()
    scaler.tick()  # each ticket was read once: a steady round reads none again
    assert store.calls["GET"] == 1  # the queue record


def test_a_partly_failed_launch_says_both() -> None:
    class Partial(Fleet):
        def launch(self, spec: WorkerSpec, n: int, timeout: float = 60.0) -> list[str]:
            ids = super().launch(spec, 1)
            raise ProviderError("fleet launch", "out of quota", "ask", launched=ids)

    q = _plane_with_work(MemoryStore(), 5, max_workers=3, jobs_per_worker=1)
    (report,) = scaler_for(q, Partial()).tick()
    assert report.launched == ["w0"] and report.error and "out of quota" in report.error


def test_a_bug_in_a_round_is_reported_not_raised() -> None:
    class Broken(Fleet):
        def list(self, tags: Collection[str]) -> list[Launched]:
            raise ZeroDivisionError("boom")

    q = _plane_with_work(MemoryStore(), 5)
    (report,) = scaler_for(q, Broken()).tick()
    assert report.error and "ZeroDivisionError: boom" in report.error


def test_a_claimed_or_released_invocations_ticket_counts() -> None:
    """After its first claim a ticket holds a marker, not the record (steps.py): live."""
    store = MemoryStore()
    q = _plane_with_work(store, 1, max_workers=2)
    keys = QueueKeys("default", "hpc")
    ticket = next(iter(store.list(keys.tickets_prefix))).key
    store.put(ticket, b"0123456789abcdef", OVERWRITE)  # the marker a claim leaves
    (report,) = scaler_for(q, Fleet()).tick()
    assert report.live == 1 and len(report.launched) == 1
