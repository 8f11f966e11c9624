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
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.steps import QueueOps
from lakeshore.store import LocalStore, MemoryStore, Store
from tests import jobs
from tests.seaweed import Seaweed
from tests.tiers import FAKE_CREDS, TEST_BUCKET, make_plane
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

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        out = super().get(key, max_bytes)
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
    ops = q.plane.ops("default")
    store.slow_record_get = 1.8  # the claim's read of the record takes 1.8 s
    started = store.now()
    held = Claimer(ops, "A").claim(started, lease_s=2.0)
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
        # store's clock, and worker B (another process) requeues and takes the invocation.
        store.t += 2.5
        other = QueueOps(store, q.plane.ops("default").keys)
        taken.append(Claimer(other, "B").claim(store.now()))

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
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, report: list[str]
) -> None:
    open_store = _opener(kind, tmp_path)
    q = make_plane(open_store(), lease_s=30.0)
    inv = q.udf(jobs.add_one).submit(1)
    held = Claimer(q.plane.ops("default"), "A").claim(q.store.now())
    assert held is not None
    _stepped(monkeypatch, 40.0)  # NTP after a VM pause: 25 s would have been left
    other = make_plane(open_store(), lease_s=30.0)  # opened after the step
    ops = other.plane.ops("default")
    assert Claimer(ops, "").reap(other.store.now()) == 0
    rec = other.get(inv)
    assert rec.state == "running" and rec.attempt == 1 and rec.lease is not None
    assert rec.lease.expires_at - other.store.now() > 29.0
    report.append(f"wall-clock step +40 s on {kind}: 0 live leases taken over (25 s were left)")


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_a_backward_step_of_the_wall_clock_neither_rewinds_nor_shortens_leases(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_store = _opener(kind, tmp_path)
    q = make_plane(open_store(), lease_s=30.0)
    q.udf(jobs.add_one).submit(1)
    ops = q.plane.ops("default")
    held = Claimer(ops, "A").claim(q.store.now())
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
def test_a_wall_clock_step_on_one_machine_moves_no_s3_lease(
    seaweed: Seaweed, step: float, report: list[str]
) -> None:
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
    held = Claimer(worker.plane.ops("default"), "A").claim(stepping.now())
    assert held is not None
    jump[0] = step  # the worker machine's wall clock steps
    assert abs(stepping.now() - honest.store.now()) < 2.5  # before any new response
    for _ in range(3):  # and after new Date samples
        stepping.get(worker.plane.ops("default").keys.record(inv))
    assert abs(stepping.now() - honest.store.now()) < 2.5
    renewed = worker.plane.ops("default").heartbeat(held, stepping.now())
    assert renewed.record.lease is not None
    assert renewed.record.lease.expires_at - honest.store.now() > 27.0
    assert Claimer(honest.plane.ops("default"), "").reap(honest.store.now()) == 0
    assert Claimer(worker.plane.ops("default"), "").reap(stepping.now()) == 0
    assert honest.get(inv).attempt == 1
    off = abs(stepping.now() - honest.store.now())
    report.append(
        f"wall-clock step {step:+.0f} s on a worker (SeaweedFS): its store clock {off:.1f} s "
        "from another process's; 0 live leases taken over"
    )


def test_a_stop_that_comes_during_a_claim_starts_no_attempt() -> None:
    stop = threading.Event()

    class StopsWhileReading(MemoryStore):
        def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
            if "/_tickets/" in key:
                stop.set()  # SIGTERM arrives while the claim reads the ticket (its record)
            return super().get(key, max_bytes)

    q = make_plane(StopsWhileReading())
    jobs.RUNS.pop("stopped-claim", None)
    inv = q.udf(jobs.tracked).submit("stopped-claim")
    assert dls.run_worker(q, isolation="thread", stop=stop, idle_exit=5.0) == 0
    rec = q.get(inv)
    assert rec.state == "queued" and rec.attempt == 0
    assert jobs.RUNS["stopped-claim"] == 0


class Hangs(FakeClock):
    """A fake-clock store whose record writes can be made to hang, as a request stuck in
    retries and timeouts does."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = threading.Event()
        self.release = threading.Event()

    def put(self, key: str, data: bytes, mode: Any = None) -> str:
        if self.hang.is_set() and key.endswith("/record"):
            self.release.wait(120)
        return super().put(key, data, mode)


def test_a_heartbeat_stuck_in_a_request_still_stops_the_body_before_the_lease_ends(
    tmp_path: Path,
) -> None:
    store = Hangs()
    q = make_plane(store, lease_s=3.0)
    mark = tmp_path / "cancelled"
    inv = q.udf(jobs.wait_to_be_cancelled).submit(str(mark))
    stop = threading.Event()
    t = threading.Thread(
        target=dls.run_worker, args=(q,), kwargs={"isolation": "thread", "stop": stop}
    )
    t.start()
    try:
        poll(lambda: q.get(inv).state == "running", what="the body running")
        store.hang.set()  # from now on the heartbeat's write never comes back
        store.t += 2.7  # 0.3 s of the 3 s lease left: under the 0.5 s margin
        poll(mark.exists, timeout=30, what="the body stopped")
        assert q.get(inv).state == "running"  # its outcome write hangs like the heartbeat
    finally:
        store.release.set()
        stop.set()
        t.join(60)


class FailsOnce(FakeClock):
    """The first record write after the claim fails (a 503 after every retry)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next = False

    def put(self, key: str, data: bytes, mode: Any = None) -> str:
        if self.fail_next and key.endswith("/record"):
            self.fail_next = False
            raise dls.StoreUnavailable("put", "503 SlowDown after every retry", "retry later")
        return super().put(key, data, mode)


def test_a_late_claim_whose_renewal_fails_hands_the_job_back_unstarted() -> None:
    store = FailsOnce()
    q = make_plane(store, lease_s=30.0)
    jobs.RUNS.pop("renewal-failed", None)
    inv = q.udf(jobs.tracked).submit("renewal-failed")

    def late_answer() -> None:
        store.t += 22.0  # 8 s of the lease left when the claim returns
        store.fail_next = True  # and the renewal before the body fails

    store.after_claim_put = late_answer
    dls.run_worker(q, once=True, isolation="thread")
    rec = q.get(inv)
    assert jobs.RUNS["renewal-failed"] == 0  # never started on a lease about to end
    assert rec.state == "queued" and rec.attempt == 1 and rec.released == 1


def test_local_store_listings_give_times_in_the_store_clock(tmp_path: Path) -> None:
    # a store whose clock anchor is 120 s behind the wall clock (the wall clock was stepped
    # forward after the anchor was written): times must follow the store, not the wall
    store = LocalStore(tmp_path / "s", wall_clock=lambda: time.time() - 120.0)
    for size in (10, 100_000):
        store.put(f"k{size}", b"x" * size)
    now = store.now()
    for info in store.list(""):
        assert abs(info.last_modified - now) < 5.0, (info.key, info.last_modified - now)


def _python(code: str) -> Any:
    """Run ``code`` in a fresh interpreter (signal handlers of its own); it must exit 0."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out


_ONE_SIGNAL = """
import os, signal, threading
from lakeshore import worker

state = worker._State(None, "w", "thread", None, threading.Event())
restore = worker._install_signals(state)
state.stop.set()  # a slot saw its body process end by the group's SIGTERM first
os.kill(os.getpid(), signal.SIGTERM)  # then the worker's own copy of that signal arrives
print("signalled" if state.signalled() else "not signalled")
restore()
"""


def test_a_group_signal_that_ends_a_body_process_first_is_still_one_signal() -> None:
    out = _python(_ONE_SIGNAL)
    # one SIGTERM is a clean stop, never "second signal: exiting now" (exit 143)
    assert "second signal" not in out.stderr
    assert out.stdout.split() == ["signalled"]


def test_a_body_process_killed_by_sigterm_alone_is_a_failed_attempt(tmp_path: Path) -> None:
    # no signal reached the worker: the child's death is a failure like any other, counted,
    # so such an invocation cannot be handed back from worker to worker for ever
    q = make_plane(LocalStore(tmp_path / "store"), retry_backoff_s=0.0)
    inv = q.udf(jobs.add_one).submit(1, _max_attempts=2)
    dls.run_worker(
        q,
        isolation="process",
        on_start="tests.jobs:die_by_group_signal",
        idle_exit=0.5,
        max_poll_s=0.05,
    )
    rec = q.get(inv)
    assert rec.state == "failed" and rec.attempt == 2 and rec.released == 0
    assert rec.error is not None and rec.error["type"] == "WorkerChildDied"


_LATE_SIGNAL = """
import os, signal, threading, time
from lakeshore import worker

state = worker._State(None, "w", "thread", None, threading.Event())
restore = worker._install_signals(state)
before = state.signalled()  # nothing yet
# the signal lands a moment after a slot started asking (the kernel's pick of a thread, a
# busy machine): the slot's bounded wait still sees it
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
print(before, state.signalled(30.0))
restore()
"""


def test_a_slot_waits_for_a_group_signal_that_reaches_the_worker_a_moment_late() -> None:
    out = _python(_LATE_SIGNAL)
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.seaweedfs
def test_a_worker_warns_of_a_lease_too_short_for_a_date_clock(
    seaweed: Seaweed, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.tiers import seaweed_store

    with caplog.at_level("WARNING", logger="lakeshore.worker"):
        assert dls.run_worker(make_plane(seaweed_store(seaweed), lease_s=1.0), once=True) == 0
    assert "lease_s=1 is short for a clock read from server Date headers" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="lakeshore.worker"):
        assert dls.run_worker(make_plane(seaweed_store(seaweed), lease_s=3.0), once=True) == 0
        assert dls.run_worker(make_plane(MemoryStore(), lease_s=0.5), once=True) == 0
    assert "is short" not in caplog.text
