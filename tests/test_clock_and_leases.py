"""Issue 15, items 1, 2 and 12: a lease has its full length from the moment its write lands,
the store clock does not follow steps of the wall clock, and a stopping worker claims nothing.

Deterministic: a fake store clock advanced by the store's own requests, steps of the wall
clock injected with monkeypatch (memory, local) or through the S3 store's ``local_clock``
(SeaweedFS), and events instead of sleeps.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.protocol import QueueOps
from lakeshore.store import LocalStore, MemoryStore, Store
from tests import jobs
from tests.conftest import FAKE_CREDS, TEST_BUCKET, make_plane
from tests.seaweed import Seaweed
from tests.waiting import poll


class FakeClock(MemoryStore):
    """A memory store whose clock moves only when the test (or a slow request) moves it."""

    def __init__(self) -> None:
        super().__init__()
        self.t = 1_800_000_000.0
        self.slow_record_get = 0.0  # store seconds a record GET takes
        self.after_claim_put: Any = None  # called once the next claim's write has landed

    def now(self) -> float:
        return self.t

    def get(self, key: str) -> tuple[bytes, str]:
        out = super().get(key)
        if key.endswith("/record"):
            self.t += self.slow_record_get
        return out

    def put(self, key: str, data: bytes, mode: Any = None) -> str:
        etag = super().put(key, data, mode) if mode is not None else super().put(key, data)
        hook = self.after_claim_put
        if hook is not None and key.endswith("/record") and b"running" in data:
            self.after_claim_put = None
            hook()
        return etag


def test_a_slow_claim_still_writes_a_full_lease() -> None:
    store = FakeClock()
    q = make_plane(store, lease_s=2.0)
    inv = q.udf(jobs.add_one).submit(1)
    ops = q.ops("default")
    store.slow_record_get = 1.8  # the claim's read of the record takes 1.8 s
    started = store.now()
    held = ops.claim("A", started, lease_s=2.0)
    assert held is not None and held.record.id == inv
    assert held.record.lease is not None
    # the lease counts from the write, not from when the claim began (0.2 s left, before)
    assert held.record.lease.expires_at >= store.now() + 2.0
    assert held.record.started_at == pytest.approx(started + 1.8)


def test_a_claim_whose_write_came_back_after_its_lease_never_runs_the_body() -> None:
    store = FakeClock()
    q = make_plane(store, lease_s=2.0, retry_backoff_s=0.0)
    jobs.RUNS.pop("late-claim", None)
    inv = q.udf(jobs.tracked).submit("late-claim")
    taken: list[Any] = []

    def meanwhile() -> None:
        # A's claim landed, but its response takes 2.5 s: the lease has run out by the
        # store's clock, and worker B (another process) requeues and takes the job.
        store.t += 2.5
        other = QueueOps(store, q.ops("default").keys)
        taken.append(other.claim("B", store.now()))

    store.after_claim_put = meanwhile
    ran = dls.run_worker(q, once=True, isolation="thread", worker_id="A")
    assert ran == 1
    assert taken and taken[0] is not None and taken[0].record.attempt == 2
    rec = q.get(inv)
    assert rec.state == "running" and rec.lease is not None and rec.lease.worker == "B"
    assert jobs.RUNS["late-claim"] == 0  # A never started the body B now holds


def test_a_claim_that_came_back_late_but_can_renew_runs_the_body() -> None:
    store = FakeClock()
    q = make_plane(store, lease_s=3.0)
    inv = q.udf(jobs.add_one).submit(41)

    def slow_answer() -> None:
        store.t += 2.5  # only 0.5 s of the lease left when the claim returns

    store.after_claim_put = slow_answer
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    rec = q.get(inv)
    assert rec.state == "succeeded" and rec.attempt == 1
    assert q.result(inv) == 42
    assert rec.rev == 3  # submit, claim, the renewal before the body, the outcome


def _stepped(monkeypatch: pytest.MonkeyPatch, step: float) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + step)


def _opener(kind: str, tmp_path: Path) -> Any:
    if kind == "memory":
        shared = MemoryStore()
        return lambda: shared  # one process owns a memory store
    return lambda: LocalStore(tmp_path / "store")  # a new process on the same machine


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_a_forward_step_of_the_wall_clock_takes_no_live_lease(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_store = _opener(kind, tmp_path)
    q = make_plane(open_store(), lease_s=30.0)
    inv = q.udf(jobs.add_one).submit(1)
    held = q.ops("default").claim("A", q.store.now())
    assert held is not None
    _stepped(monkeypatch, 40.0)  # NTP after a VM pause: 25 s would have been left
    other = make_plane(open_store(), lease_s=30.0)  # opened after the step
    ops = other.ops("default")
    assert ops.reap(other.store.now()) == 0
    rec = other.get(inv)
    assert rec.state == "running" and rec.attempt == 1 and rec.lease is not None
    assert rec.lease.expires_at - other.store.now() > 29.0


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_a_backward_step_of_the_wall_clock_neither_rewinds_nor_shortens_leases(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_store = _opener(kind, tmp_path)
    q = make_plane(open_store(), lease_s=30.0)
    q.udf(jobs.add_one).submit(1)
    ops = q.ops("default")
    held = ops.claim("A", q.store.now())
    assert held is not None and held.record.lease is not None
    before = q.store.now()
    _stepped(monkeypatch, -40.0)
    later = make_plane(open_store(), lease_s=30.0)
    assert later.store.now() >= before  # the store's clock never runs backwards
    renewed = ops.heartbeat(held, later.store.now())
    assert renewed.record.lease is not None
    assert renewed.record.lease.expires_at >= held.record.lease.expires_at


def test_a_garbage_clock_anchor_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    LocalStore(tmp_path / "s")
    anchors = list((tmp_path / "s" / ".clock").iterdir())
    if not anchors:  # no boot id here: the wall clock is used and there is no anchor
        pytest.skip("this system has no boot id")
    anchors[0].write_text("soon")
    with pytest.raises(dls.StoreError, match="does not hold a time"):
        LocalStore(tmp_path / "s")


@pytest.mark.seaweedfs
@pytest.mark.parametrize("step", [40.0, -40.0])
def test_a_wall_clock_step_on_one_machine_moves_no_s3_lease(seaweed: Seaweed, step: float) -> None:
    from lakeshore.store.s3 import S3Store

    prefix = f"t/step-{time.time_ns()}"
    jump = [0.0]

    def s3(clock: Any = time.time) -> Store:
        return S3Store(
            TEST_BUCKET, prefix, endpoint_url=seaweed.endpoint, local_clock=clock, **FAKE_CREDS
        )

    stepping = s3(lambda: time.time() + jump[0])
    honest = make_plane(s3(), lease_s=30.0)
    worker = make_plane(stepping, lease_s=30.0)
    inv = honest.udf(jobs.add_one).submit(1)
    held = worker.ops("default").claim("A", stepping.now())
    assert held is not None
    jump[0] = step  # the worker machine's wall clock steps
    assert abs(stepping.now() - honest.store.now()) < 2.5  # before any new response
    for _ in range(3):  # and after new Date samples
        stepping.get(worker.ops("default").keys.record(inv))
    assert abs(stepping.now() - honest.store.now()) < 2.5
    renewed = worker.ops("default").heartbeat(held, stepping.now())
    assert renewed.record.lease is not None
    assert renewed.record.lease.expires_at - honest.store.now() > 27.0
    assert honest.ops("default").reap(honest.store.now()) == 0
    assert worker.ops("default").reap(stepping.now()) == 0
    assert honest.get(inv).attempt == 1


def test_a_stop_that_comes_during_a_claim_starts_no_attempt() -> None:
    stop = threading.Event()

    class StopsWhileReading(MemoryStore):
        def get(self, key: str) -> tuple[bytes, str]:
            if key.endswith("/record"):
                stop.set()  # SIGTERM arrives while the claim reads the record
            return super().get(key)

    q = make_plane(StopsWhileReading())
    jobs.RUNS.pop("stopped-claim", None)
    inv = q.udf(jobs.tracked).submit("stopped-claim")
    assert dls.run_worker(q, isolation="thread", stop=stop, idle_exit=5.0) == 0
    rec = q.get(inv)
    assert rec.state == "queued" and rec.attempt == 0
    assert jobs.RUNS["stopped-claim"] == 0


def test_a_body_process_killed_by_a_group_signal_stops_the_worker_claiming(
    tmp_path: Path,
) -> None:
    q = make_plane(LocalStore(tmp_path / "store"))
    inv = q.udf(jobs.add_one).submit(1)
    stop = threading.Event()
    done: list[int] = []
    t = threading.Thread(
        target=lambda: done.append(
            dls.run_worker(
                q,
                isolation="process",
                stop=stop,
                on_start="tests.jobs:die_by_group_signal",
                max_poll_s=0.05,
            )
        ),
        daemon=True,
    )
    t.start()
    try:
        poll(lambda: q.get(inv).released >= 1, timeout=60, what="the job handed back")
        t.join(30)  # the worker stops by itself: the signal was meant for it too
        returned_by_itself = not t.is_alive()
    finally:
        stop.set()
        t.join(30)
    rec = q.get(inv)
    assert returned_by_itself
    assert rec.state == "queued" and rec.attempt == 1 and rec.released == 1
