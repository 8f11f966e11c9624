"""Outcome writes that survive a bad minute of the store, claims
that stall through gc, and producers that fill the claim scan with tickets never due.

Each test is named after its scenario and was seen to fail on the code before its fix.
Nothing sleeps to synchronise: stalls are made by a store wrapper that runs the racing
party's whole story inside the stalled request, and clocks are moved by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.errors import StoreUnavailable
from lakeshore.keys import new_id
from lakeshore.model import lifecycle
from lakeshore.model.record import Blob, Lease, Record
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.gc import collect
from lakeshore.protocol.steps import CLAIM_FENCE_S, QueueOps
from lakeshore.store import MemoryStore, PutMode
from lakeshore.store.base import OVERWRITE
from tests import jobs
from tests.forwarding import Forwarding
from tests.tiers import make_plane


def drain(q: Any, n: int = 1, **kw: Any) -> None:
    kw.setdefault("isolation", "thread")
    kw.setdefault("idle_exit", 0.5)
    kw.setdefault("max_poll_s", 0.02)
    dls.run_worker(q, max_jobs=n, **kw)


# -- finding 5: one failed outcome write does not throw a finished result away ------------


class LosesOneOutcome(Forwarding):
    """Fails the first terminal write of a record with ``StoreUnavailable`` (what the S3
    store raises once its own retries are spent): before it reaches the store, or after it
    landed (its answer lost)."""

    def __init__(self, inner: MemoryStore, landed: bool) -> None:
        super().__init__(inner)
        self.landed = landed
        self.failed = 0

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        terminal = key.endswith("/record") and mode.name == "if_match" and not self.failed
        if terminal and Record.from_bytes(data).terminal:
            self.failed += 1
            if self.landed:
                self.inner.put(key, data, mode)
            raise StoreUnavailable(f"put {key}", "the store kept failing", "try later")
        return self.inner.put(key, data, mode)


@pytest.mark.parametrize("landed", [False, True], ids=["lost-before", "landed-unseen"])
def test_an_outcome_write_that_fails_once_is_sent_again_within_the_lease(
    landed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    store = LosesOneOutcome(MemoryStore(), landed)
    q = make_plane(store, lease_s=30.0)
    inv = q.udf(jobs.add_one).submit(41)
    with caplog.at_level("INFO", logger="lakeshore.worker"):
        drain(q)
    # the worker knows its write landed: not "fenced", not "could not be concluded"
    assert f"{inv} attempt 1 -> succeeded" in caplog.text
    assert store.failed == 1
    rec = q.get(inv)
    assert rec.state == "succeeded" and rec.attempt == 1  # not LeaseExpired, not run again
    assert q.result(inv) == 42


# -- finding 2: a claim that stalls through gc never runs the body twice ------------------


class StallsBeforeCreate(Forwarding):
    """Runs ``meanwhile`` once, inside the first create of a ``<id>/record``: the claimer
    has read the full ticket and is about to write, and the whole story of another worker
    and gc happens before its request reaches the store."""

    def __init__(self, inner: MemoryStore, meanwhile: Any) -> None:
        super().__init__(inner)
        self.meanwhile = meanwhile
        self.stalled = False

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        if key.endswith("/record") and mode.name == "create" and not self.stalled:
            self.stalled = True
            self.meanwhile()
        return self.inner.put(key, data, mode)


class Ticks:
    """A monotonic clock moved by hand, and a sleep that moves it."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_a_claim_that_stalls_while_the_invocation_finishes_and_is_collected_does_not_run_it_again(
    tmp_path: Any,
) -> None:
    inner = MemoryStore()
    q = make_plane(inner)
    marker = str(tmp_path / "runs")
    inv = q.udf(jobs.once_marker).submit(marker)
    ops = q.plane.ops("default")
    ticks, gc_ticks = Ticks(), Ticks()

    def another_worker_and_gc() -> None:
        drain(q)  # W claims, runs and finishes it; its ticket is deleted when it stops
        assert q.status(inv) == "succeeded"
        report = collect(
            ops, q.plane.settings, 0.0, inner.now() + 1, ticks=gc_ticks, sleep=gc_ticks.sleep
        )
        assert report.expired == [inv]
        ticks.t += 10 * CLAIM_FENCE_S  # the claimer's request took this long

    stalled = StallsBeforeCreate(inner, another_worker_and_gc)
    claimer = Claimer(QueueOps(stalled, ops.keys), "C", ticks=ticks)
    assert claimer.claim(inner.now()) is None  # its create landed, then it proved no ticket
    assert stalled.stalled
    assert list(inner.list(ops.keys.invocation_prefix(inv))) == []  # nothing brought back
    assert q_result_gone(q, inv)


def q_result_gone(q: Any, inv: str) -> bool:
    with pytest.raises(dls.NotFound):
        q.get(inv)
    return True


def test_gc_deletes_records_no_sooner_than_the_claim_fence_after_it_saw_their_tickets() -> None:
    inner = MemoryStore()
    q = make_plane(inner)
    ids = [q.udf(jobs.add_one).submit(i) for i in range(3)]
    drain(q, 3)
    ops = q.plane.ops("default")
    ticks = Ticks()
    deleted_at: list[float] = []

    class Watch(Forwarding):
        def delete(self, key: str, if_match: str | None = None) -> None:
            if key.endswith("/record"):
                deleted_at.append(ticks.t)
            super().delete(key, if_match)

    watched = QueueOps(Watch(inner), ops.keys)
    listed = ticks.t
    report = collect(
        watched, q.plane.settings, 0.0, inner.now() + 1, ticks=ticks, sleep=ticks.sleep
    )
    assert sorted(report.expired) == sorted(ids)
    assert len(deleted_at) == 3 and min(deleted_at) >= listed + CLAIM_FENCE_S
    assert len(ticks.slept) == 1  # one wait for the whole run, not one per invocation


# -- finding 3: tickets never due cannot stall a queue ------------------------------------


def plant(q: Any, n: int, not_before: float, priority: int = 9) -> list[str]:
    """What a producer with its policy can do: ``n`` create-only tickets of well-formed
    queued records that say they are not due until ``not_before``."""
    ops = q.plane.ops("default")
    args = Blob(inline=codec.encode(((1,), {})))
    now = q.store.now()
    ids = []
    for _ in range(n):
        inv = new_id(priority)
        rec = Record(
            id=inv,
            ns=q.ns,
            queue="default",
            fn="tests.jobs:add_one",
            args=args,
            priority=priority,
            not_before=not_before,
            submitted_at=now,
        )
        assert ops.submit(rec)
        ids.append(inv)
    return ids


def test_tickets_not_due_for_years_are_failed_and_the_job_behind_them_runs() -> None:
    q = make_plane(MemoryStore())
    junk = plant(q, 5001, q.store.now() + 10 * 365 * 86400)
    inv = q.udf(jobs.add_one).submit(1)
    drain(q, idle_exit=30)  # it leaves once it ran the one job
    assert q.status(inv) == "succeeded"
    failed = [q.get(i) for i in junk[:50]]
    assert {r.state for r in failed} == {"failed"}
    assert failed[0].error is not None and failed[0].error["type"] == "ImplausibleRecord"
    # and gc removes them like any finished invocation
    report = collect(q.plane.ops("default"), q.plane.settings, 0.0, q.store.now() + 1)
    assert set(junk[:50]) <= set(report.expired)


def test_a_scan_full_of_tickets_not_yet_due_does_not_hide_the_job_behind_them() -> None:
    # due in four minutes: plausible (a backoff), so each is only skipped, not failed
    q = make_plane(MemoryStore())
    junk = plant(q, 5001, q.store.now() + 240)
    inv = q.udf(jobs.add_one).submit(1)
    drain(q, idle_exit=30)  # it leaves once it ran the one job
    assert q.status(inv) == "succeeded"
    assert {q.status(i) for i in junk[:10]} == {"queued"}


@pytest.mark.parametrize(
    "field, ahead",
    [("submitted_at", 2 * 86400.0), ("started_at", 2 * 86400.0), ("finished_at", 2 * 86400.0)],
)
def test_a_live_record_with_a_time_from_the_future_is_refused(field: str, ahead: float) -> None:
    now = 1_000_000.0
    rec = Record(
        id=new_id(),
        ns="default",
        queue="default",
        fn="m:f",
        args=Blob(inline=b""),
        submitted_at=now,
    )
    assert lifecycle.implausible(rec, now) is None
    bad = dataclasses.replace(rec, **{field: now + ahead})
    why = lifecycle.implausible(bad, now)
    assert why is not None and field in why
    assert lifecycle.refuse(bad, now, why).state == "failed"


def test_a_lease_longer_than_its_lease_s_is_refused() -> None:
    now = 1_000_000.0
    rec = Record(id=new_id(at=now), ns="default", queue="default", fn="m:f", args=Blob(inline=b""))
    running = lifecycle.claim(rec, "w", "t", now, lease_s=30.0)
    assert lifecycle.implausible(running, now + 10) is None
    assert lifecycle.implausible(running, now - 3600) is None  # a reader's clock an hour behind
    forged = dataclasses.replace(running, lease=Lease("w", "t", now + 3 * 86400))
    assert "lease" in (lifecycle.implausible(forged, now) or "")
    assert lifecycle.implausible(dataclasses.replace(rec, not_before=now + 200), now) is None
    assert "not_before" in (
        lifecycle.implausible(dataclasses.replace(rec, not_before=now + 1e6), now) or ""
    )


def test_the_scaler_does_not_count_tickets_not_due_or_never_due_as_work() -> None:
    from tests.fleet import Fleet, scaler_for

    store = MemoryStore()
    q = make_plane(store)
    q.configure("hpc", provider={"kind": "local", "cooldown_s": 0, "idle_exit_s": 60})
    now = store.now()
    args = Blob(inline=codec.encode(((1,), {})))
    ops = q.plane.ops("hpc")
    for not_before in (now + 10 * 365 * 86400, now + 240):  # never, and after idle_exit_s
        inv = new_id(5)
        rec = Record(id=inv, ns=q.ns, queue="hpc", fn="tests.jobs:add_one", args=args)
        assert ops.submit(dataclasses.replace(rec, not_before=not_before, submitted_at=now))
    fleet = Fleet()
    scaler = scaler_for(q, fleet)
    (report,) = scaler.tick()
    assert report.live == 0 and not fleet.workers
    q.udf(jobs.add_one, queue="hpc").submit(1)  # real work: one worker
    (report,) = scaler.tick()
    assert report.live == 1 and len(fleet.workers) == 1


def test_a_slot_left_by_a_worker_dead_after_its_terminal_write_is_freed_by_the_next_claim() -> None:
    # producers may no longer read slots (they name invocations), so they cannot repair
    # them: the claimer that meets the stale ticket frees the slot before it drops the ticket
    q = make_plane(MemoryStore())
    q.configure("default", max_depth=1, on_full="reject")
    f = q.udf(jobs.add_one)
    inv = f.submit(1)
    ops = q.plane.ops("default")
    held = Claimer(ops, "dies").claim(q.store.now())
    assert held is not None and held.record.slot is not None
    done = lifecycle.succeed(held.record, held.token, Blob(inline=b"\x02"), q.store.now())
    ops.cas(done, held.etag)  # ... and the worker died before it tidied anything
    with pytest.raises(dls.QueueFull):
        f.submit(2)
    # the next claim once the dead worker's own tidying would have been done (a claimer
    # leaves a ticket a worker ended moments ago to that worker's batch delete)
    later = q.store.now() + 11
    assert Claimer(ops, "next").claim(later) is None  # meets the stale ticket
    assert q.status(inv) == "succeeded"
    assert q.status(f.submit(3)) == "queued"  # the slot was freed


def test_a_full_ticket_whose_record_was_undone_is_claimed_again_not_dropped() -> None:
    # worker K lost the create to worker C, whose slow claim then could not prove its ticket
    # and deleted its record again: K must read the ticket again, not take it for an orphan
    inner = MemoryStore()
    q = make_plane(inner)
    inv = q.udf(jobs.add_one).submit(1)
    ops = q.plane.ops("default")
    other = Claimer(ops, "C")

    def c_claims_first() -> None:
        assert other.claim(inner.now()) is not None

    k = Claimer(QueueOps(StallsBeforeCreate(inner, c_claims_first), ops.keys), "K")
    assert k.claim(inner.now()) is None  # lost the create
    inner.delete(ops.keys.record(inv))  # C's claim undone
    later = inner.now() + 60  # once K looks again (it remembered the ticket for a lease)
    held = k.claim(later)
    assert held is not None and held.record.id == inv


def test_a_pass_from_the_head_goes_on_past_a_scan_of_remembered_tickets() -> None:
    q = make_plane(MemoryStore())
    plant(q, 5001, q.store.now() + 240)
    inv = q.udf(jobs.add_one).submit(1)
    k = Claimer(q.plane.ops("default"), "k")
    assert k.claim(q.store.now()) is None  # reads (and remembers) the first 4000
    held = k.claim(q.store.now())  # from the head: 5000 remembered, then past them
    assert held is not None and held.record.id == inv
