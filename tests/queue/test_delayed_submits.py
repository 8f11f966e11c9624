"""Delayed submits: ``_delay_s`` and ``_not_before``, judged by the store's clock at claim.

The store's clock is shifted by a wrapper, so "a minute later" needs no waiting: a worker
whose store clock reads one second short of the due time claims nothing, one whose clock
reads past it runs the call, with a lease counted from the claim.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import keys
from lakeshore.keys import id_time
from lakeshore.model import lifecycle
from lakeshore.model.record import State
from lakeshore.protocol.census import ID_SLACK_S, live_tickets
from lakeshore.store import MemoryStore, Store
from tests import jobs
from tests.commands import run
from tests.forwarding import Forwarding
from tests.tiers import make_plane

ALLOW = ["tests.jobs:*"]  # workers on planes of their own: the bodies are allowed by name


class Shifted(Forwarding):
    """A store whose clock reads ``shift`` seconds later than the inner store's."""

    def __init__(self, inner: Store, shift: float = 0.0) -> None:
        super().__init__(inner)
        self.shift = shift

    def now(self) -> float:
        return self.inner.now() + self.shift


class Frozen(Forwarding):
    """A store whose clock stands at ``at``."""

    def __init__(self, inner: Store, at: float) -> None:
        super().__init__(inner)
        self.at = at

    def now(self) -> float:
        return self.at


def test_a_delayed_call_waits_for_its_time_by_the_store_clock(store: Store) -> None:
    q = make_plane(store)
    inv = q.udf(jobs.add_one).submit(1, _delay_s=60)
    due = q.get(inv).not_before
    assert 59 < due - q.get(inv).submitted_at <= 60.5
    # a claimer whose store clock reads 10 ms short of the due time takes nothing
    assert dls.run_worker(make_plane(Frozen(store, due - 0.01)), idle_exit=0.2, allow=ALLOW) == 0
    assert q.status(inv) == "queued"
    late = make_plane(Shifted(store, 61.0))
    assert dls.run_worker(late, idle_exit=0.2, allow=ALLOW) == 1
    rec = q.get(inv)
    assert rec.state == State.SUCCEEDED and q.result(inv) == 2
    (turn,) = rec.history
    assert turn.started_at >= due  # judged by the claimer's store clock, never before
    # the lease ran from the claim: a long delay does not shorten it to nothing
    assert rec.lease_s > 0 and rec.history[0].ended_at is not None


def test_a_delayed_id_carries_its_due_time_so_its_ticket_sorts_behind_due_work() -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    later = f.submit(1, _delay_s=3600)
    now_ = f.submit(2)
    assert abs(id_time(later) - q.get(later).not_before) < 0.002
    ops = q.plane.ops("default")
    assert [ops.keys.id_of(t.key) for t in ops.tickets()] == [now_, later]
    # the due one; the worker does not wait for the other
    assert dls.run_worker(q, idle_exit=0.2, allow=ALLOW) == 1
    assert q.status(now_) == "succeeded" and q.status(later) == "queued"


def test_not_before_takes_an_aware_datetime() -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    at = datetime.datetime.now(datetime.timezone(datetime.timedelta(hours=5))) + (
        datetime.timedelta(hours=2)
    )
    inv = f.submit(1, _not_before=at)
    assert q.get(inv).not_before == pytest.approx(at.timestamp())
    past = f.submit(1, _not_before=at - datetime.timedelta(days=1))
    assert q.get(past).not_before == 0.0  # a time already past: due at once
    with pytest.raises(dls.InvalidArgument, match="aware datetime"):
        f.submit(1, _not_before=datetime.datetime.now() + datetime.timedelta(hours=1))
    with pytest.raises(dls.InvalidArgument, match="aware datetime"):
        f.submit(1, _not_before=at.timestamp())
    with pytest.raises(dls.InvalidArgument, match="both"):
        f.submit(1, _not_before=at, _delay_s=5)
    with pytest.raises(dls.InvalidArgument, match="schedule"):
        f.submit(1, _not_before=at + datetime.timedelta(days=400))


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "60", 400 * 86400])
def test_a_delay_must_be_seconds_within_a_year_and_a_day(bad: Any) -> None:
    q = make_plane(MemoryStore())
    with pytest.raises(dls.InvalidArgument, match="_delay_s"):
        q.udf(jobs.add_one).submit(1, _delay_s=bad)
    assert not list(q.plane.ops("default").tickets())  # nothing was written


def test_map_delays_every_call_and_a_keyed_delayed_submit_is_idempotent() -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    ids = f.map([1, 2, 3], _delay_s=120)
    assert all(q.get(i).not_before > q.get(i).submitted_at + 119 for i in ids)
    once = f.submit(1, _key="k", _delay_s=120)
    assert f.submit(1, _key="k", _delay_s=120) == once
    assert id_time(once) == pytest.approx(q.get(once).not_before, abs=0.002)


def test_a_deadline_counts_from_when_the_call_comes_due() -> None:
    store = MemoryStore()
    q = make_plane(store)
    inv = q.udf(jobs.add_one).submit(1, _delay_s=600, _deadline_s=30)
    rec = q.get(inv)
    assert rec.deadline_at == pytest.approx(rec.not_before + 30, abs=0.01)
    assert dls.run_worker(make_plane(Shifted(store, 620)), idle_exit=0.2, allow=ALLOW) == 1
    assert q.result(inv) == 2


def test_a_long_delay_is_plausible_only_with_an_id_that_sorts_by_its_due_time() -> None:
    q = make_plane(MemoryStore())
    now = q.store.now()
    inv = q.udf(jobs.add_one).submit(1, _delay_s=30 * 86400)
    rec = q.get(inv)
    assert lifecycle.implausible(rec, now) is None
    # the same time on an id of today would park its ticket at the head: refused
    undue = dls.Dispatch(":memory:").udf(jobs.add_one).submit(1)
    forged = dataclasses.replace(rec, id=undue)
    assert "not_before" in (lifecycle.implausible(forged, now) or "")
    beyond = dataclasses.replace(rec, not_before=now + lifecycle.MAX_DELAY_S + 2 * 86400)
    assert "not_before" in (lifecycle.implausible(beyond, now) or "")


def test_the_scaler_counts_delayed_work_only_once_it_is_near() -> None:
    from tests.fleet import Fleet, scaler_for

    store = MemoryStore()
    q = make_plane(store)
    q.configure("hpc", provider={"kind": "local", "cooldown_s": 0, "idle_exit_s": 60})
    f = q.udf(jobs.add_one, queue="hpc")
    f.map(range(100), _delay_s=3600)  # more than the scaler reads: judged by their ids
    fleet = Fleet()
    (report,) = scaler_for(q, fleet).tick()
    assert report.live == 0 and not fleet.workers
    (report,) = scaler_for(make_plane(Shifted(store, 3590)), fleet).tick()
    assert report.live > 0 and fleet.workers  # counted up to what changes the decision


def test_racing_workers_with_skewed_clocks_run_a_delayed_call_once_never_early(
    atomic_store: Store,
) -> None:
    q = make_plane(atomic_store)
    inv = q.udf(jobs.add_one).submit(1, _delay_s=30)
    due = q.get(inv).not_before
    ran = []
    # each worker's reading of the store clock differs (an S3 clock is sampled from 1-second
    # Date headers): by up to 2 s here, within the 3 s lease as the docs require
    planes = [make_plane(Shifted(atomic_store, s)) for s in (29.0, 29.5, 30.2, 30.5, 31.0)]

    def work(p: Any) -> None:
        ran.append(dls.run_worker(p, idle_exit=0.5, allow=ALLOW))

    threads = [threading.Thread(target=work, args=(p,)) for p in planes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(ran) == 1
    rec = q.get(inv)
    assert rec.attempt == 1 and rec.state == State.SUCCEEDED
    assert rec.history[0].started_at >= due


def test_show_and_ls_say_when_a_delayed_call_is_scheduled(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "submit", "tests.jobs:add_one", "--args", "[1]", "--delay", "2h")
    assert code == 0, err
    inv = out.strip()
    code, out, _ = run(capsys, "show", inv)
    assert code == 0
    (line,) = [x for x in out.splitlines() if x.startswith("scheduled")]
    assert "(in 1h5" in line or "(in 2h00m)" in line
    code, out, _ = run(capsys, "ls")
    assert "SCHEDULED" in out.splitlines()[0] and "in 1h5" in out
    code, out, _ = run(capsys, "ls", "--json")
    assert '"not_before"' in out
    with pytest.raises(SystemExit):  # argparse refuses it, with the hint
        run(capsys, "submit", "tests.jobs:add_one", "--not-before", "2030-01-01T10:00")
    assert "has no time zone" in capsys.readouterr().err
    code, out, err = run(
        capsys, "submit", "tests.jobs:add_one", "--args", "[1]", "--not-before", "2030-01-01T10:00Z"
    )
    assert code != 0 and "schedule" in err  # more than a year and a day away
    with pytest.raises(SystemExit):
        run(capsys, "submit", "tests.jobs:add_one", "--delay", "soon")
    assert "is not a duration" in capsys.readouterr().err


def test_the_scaler_counts_a_rerun_of_a_delayed_invocation_at_once() -> None:
    """A delayed call cancelled and then retried is due now, though its id still carries
    the far time: its rerun ticket is counted."""
    store = MemoryStore()
    q = make_plane(store)
    inv = q.udf(jobs.add_one).submit(1, _delay_s=6 * 3600)
    q.cancel(inv)
    q.retry(inv)
    assert q.status(inv) == "queued" and q.get(inv).not_before <= store.now()
    ops = q.plane.ops("default")
    tickets, _ = live_tickets(store, ops.keys, 10, due_by=store.now() + 60.0)
    assert [ops.keys.id_of(t.key) for t in tickets] == [inv]


def test_the_scaler_counts_work_from_a_producer_whose_clock_runs_minutes_fast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain submit's id comes from its producer's clock: one that runs up to ID_SLACK_S
    fast still has its work counted; a delayed call due later than that is not."""
    store = MemoryStore()
    q = make_plane(store)
    made = keys.new_id
    fast = ID_SLACK_S - 60.0
    monkeypatch.setattr(
        "lakeshore.submit.new_id",
        lambda priority=5, at=None: made(priority, at if at is not None else store.now() + fast),
    )
    inv = q.udf(jobs.add_one).submit(1)
    later = q.udf(jobs.add_one).submit(2, _delay_s=2 * ID_SLACK_S)
    assert q.get(inv).not_before == 0.0
    ops = q.plane.ops("default")
    tickets, _ = live_tickets(store, ops.keys, 10, due_by=store.now() + 60.0)
    assert [ops.keys.id_of(t.key) for t in tickets] == [inv]
    assert later


def test_a_draining_worker_does_not_wait_for_a_child_of_a_delayed_parent() -> None:
    """A delayed first run is not work yet for idle_exit, and neither is a child waiting
    for it; a child of a parent that is due does hold the worker."""
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    parent = f.submit(1, _delay_s=3600)
    child = f.submit(2, _after=[parent])
    stop = threading.Event()
    done: list[int] = []
    t = threading.Thread(
        target=lambda: done.append(dls.run_worker(q, idle_exit=0.5, stop=stop, allow=ALLOW))
    )
    t.start()
    t.join(20.0)
    stop.set()
    t.join(10.0)
    assert done == [0], "the draining worker stayed for delayed work"
    assert q.status(child) == "queued"


def test_a_delayed_record_is_schema_2_so_a_0_4_worker_leaves_it_alone() -> None:
    """A 0.4 worker would fail a record due more than a day ahead as implausible; the
    delayed submit's scheduled_at makes the record v2, which such a worker leaves alone."""
    from lakeshore.codec import unpack_plain

    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    inv = f.submit(1, _delay_s=2 * 86400)
    plain = f.submit(1)
    ops = q.plane.ops("default")
    raw = {i: unpack_plain(q.store.get(ops.keys.ticket_of_id(i) or "")[0]) for i in (inv, plain)}
    assert raw[inv]["v"] == 2 and raw[inv]["scheduled_at"] == q.get(inv).not_before
    assert raw[plain]["v"] == 1 and "scheduled_at" not in raw[plain]


def test_the_upstream_spelling_passes_a_delay_and_parents_through() -> None:
    """dreamlake.lakeshore's ``UDF.submit`` hands lakeshore's own ``_`` options on."""
    import dreamlake.lakeshore as up

    q = up.Dispatch(":memory:")
    add = up.udf(queue="default")(jobs.add_one)
    parent = add.submit(1, _dispatch=q, _delay_s=60)
    child = add.submit(2, _dispatch=q, _after=[parent])
    assert q.get(parent).scheduled_at == q.get(parent).not_before > q.get(parent).submitted_at
    assert q.get(child).after == (parent,)
