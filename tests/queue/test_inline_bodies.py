"""Thread-isolated bodies run in their slot's own thread (issue 32, local planes), and a body
that does not stop is still walked away from: the watchdog concludes its attempt on a new
slot thread, and whatever the old thread's body returns later is never written.

Deterministic: the bodies block on events the test sets, states are polled with deadlines,
and the hand-off between a slot thread and the watchdog is driven with an injected clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.model import lifecycle
from lakeshore.model.record import Lease
from lakeshore.running.attempt import ABANDON_AFTER_S, Attempt
from lakeshore.store import MemoryStore
from tests.waiting import poll

LEASE_S = 1.5  # heartbeats every half second: a cancel or a lost lease is seen quickly


class Stuck:
    """A body that ignores being stopped: it returns only once the test releases it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()
        self.thread: threading.Thread | None = None

    def __call__(self) -> str:
        self.thread = threading.current_thread()
        self.started.set()
        self.release.wait(60)
        # its attempt was concluded and its log closed: not a byte more may reach the store
        # (enough to fill a log segment at once, were it still written)
        print("late output " * 7000)
        self.returned.set()
        return "late"


@pytest.fixture
def stuck() -> Iterator[Stuck]:
    body = Stuck()
    yield body
    body.release.set()  # never leave a thread blocked behind a failed test


def _shout(text: str) -> str:
    return text.upper()


def _serve(q: Any, **options: Any) -> tuple[threading.Thread, threading.Event, list[int]]:
    stop = threading.Event()
    ran: list[int] = []
    kwargs = {"isolation": "thread", "lease_s": LEASE_S, "stop": stop, **options}
    t = threading.Thread(target=lambda: ran.append(dls.run_worker(q, **kwargs)), daemon=True)
    t.start()
    return t, stop, ran


def _objects_of(store: MemoryStore, inv: str) -> dict[str, str]:
    """Every object of the invocation (record, result, ticket...) with its etag."""
    return {i.key: i.etag for i in store.list("lakeshore/") if inv in i.key}


def _after_release(stuck: Stuck) -> None:
    """Let the stuck body return, and wait until its old slot thread has left."""
    stuck.release.set()
    assert stuck.returned.wait(10)
    assert stuck.thread is not None
    stuck.thread.join(10)
    assert not stuck.thread.is_alive(), "the abandoned slot thread did not leave"


def test_a_thread_isolated_body_runs_in_its_slots_own_thread() -> None:
    """No hand-off to a body thread and back: that cost two thread wake-ups per attempt."""
    q = dls.Dispatch(":memory:")

    @q.udf
    def where() -> str:
        return threading.current_thread().name

    inv = where.submit()
    assert dls.run_worker(q, once=True) == 1
    assert q.result(inv, timeout=0) == "lakeshore-slot-0"


def test_a_cancelled_body_that_never_returns_is_abandoned_and_its_result_never_written(
    stuck: Stuck,
) -> None:
    store = MemoryStore()
    q = dls.Dispatch(":memory:", store=store)
    hung = q.udf(stuck).submit()
    t, stop, _ = _serve(q)
    try:
        assert stuck.started.wait(30)
        assert q.cancel(hung)
        nxt = q.udf(_shout).submit("ok")
        assert q.result(nxt, timeout=30) == "OK"  # the slot serves on, in a new thread
        assert q.status(hung) == "killed"
        assert stuck.thread is not None and stuck.thread.is_alive()  # still in its body
        before = _objects_of(store, hung)
        _after_release(stuck)
        assert _objects_of(store, hung) == before  # nothing written after the abandon
        assert q.get(hung).result is None
    finally:
        stop.set()
        t.join(30)
    assert not t.is_alive()


def test_a_body_past_its_timeout_is_abandoned_and_what_it_returns_is_dropped(
    stuck: Stuck,
) -> None:
    store = MemoryStore()
    q = dls.Dispatch(":memory:", store=store)
    hung = q.udf(stuck).submit(_timeout_s=0.2, _max_attempts=1)
    t, stop, ran = _serve(q, max_jobs=2)
    try:
        assert stuck.started.wait(30)
        poll(lambda: q.status(hung) == "timeout", what="timed out")
        nxt = q.udf(_shout).submit("ok")
        assert q.result(nxt, timeout=30) == "OK"  # the slot serves on, in a new thread
        t.join(30)
        assert not t.is_alive() and ran == [2]  # the worker returned with the body still stuck
        before = _objects_of(store, hung)
        _after_release(stuck)
        assert _objects_of(store, hung) == before
        assert q.get(hung).state == "timeout" and q.get(hung).result is None
    finally:
        stop.set()


def test_a_body_whose_lease_was_taken_over_never_writes_over_the_new_holder(
    stuck: Stuck, caplog: pytest.LogCaptureFixture
) -> None:
    """The fence: once another holder's lease is on the record, nothing the stuck body's
    attempt does may change it — not when the watchdog concludes it, not when it returns."""
    store = MemoryStore()
    q = dls.Dispatch(":memory:", store=store)
    hung = q.udf(stuck).submit()
    caplog.set_level("INFO", logger="lakeshore.worker")
    t, stop, _ = _serve(q)
    try:
        assert stuck.started.wait(30)
        ops = q.plane.ops("default")
        rec, etag = ops.read(hung)
        far = store.now() + 3600
        other = rec.next_write(lease=Lease("another-worker", "other-token", far))
        ops.cas(other, etag)  # as if its lease had run out and another worker claimed it
        taken = _objects_of(store, hung)
        poll(lambda: _ended(caplog).startswith("fenced"), what="the attempt was concluded")
        assert _objects_of(store, hung) == taken  # the fenced conclusion wrote nothing
        _after_release(stuck)
        assert _objects_of(store, hung) == taken
        current = q.get(hung)
        assert current.lease is not None and current.lease.token == "other-token"
        assert current.result is None
    finally:
        stop.set()
        t.join(30)


def _ended(caplog: pytest.LogCaptureFixture) -> str:
    """How the worker's last concluded attempt ended, by its log line ("" before one)."""
    outcomes = [getattr(r, "attempt_outcome", "") for r in caplog.records]
    return next((o for o in reversed(outcomes) if o), "")


def test_a_stopping_worker_does_not_wait_for_a_body_that_never_returns(stuck: Stuck) -> None:
    store = MemoryStore()
    q = dls.Dispatch(":memory:", store=store)
    hung = q.udf(stuck).submit()
    t, stop, ran = _serve(q, grace_s=0.0)
    assert stuck.started.wait(30)
    stop.set()
    t.join(30)
    assert not t.is_alive() and ran == [1]
    rec = q.get(hung)
    assert rec.state == "queued" and rec.released == 1  # handed back, the attempt not counted
    before = _objects_of(store, hung)
    _after_release(stuck)
    assert _objects_of(store, hung) == before


def _held_attempt() -> Attempt:
    q = dls.Dispatch(":memory:")
    q.udf(str.upper).submit("x")
    held = q.plane.claimer("default", "w").claim(q.store.now())
    assert held is not None
    return Attempt(q.plane.ops("default"), held)


def test_a_body_that_returns_first_keeps_its_attempt_from_the_watchdog() -> None:
    att = _held_attempt()
    att.body_starts()
    assert not att.abandon_if_stuck(now=0.0)  # running and not stopped: never
    att.halt("killed")
    assert not att.abandon_if_stuck(now=0.0)  # the stop is first seen now
    assert not att.abandon_if_stuck(now=ABANDON_AFTER_S * 0.9)
    assert att.body_returned()  # in time: its own thread concludes
    assert not att.abandon_if_stuck(now=ABANDON_AFTER_S * 10)


def test_a_body_that_returns_after_the_watchdog_gave_up_finds_itself_abandoned() -> None:
    att = _held_attempt()
    att.body_starts()
    att.halt("timeout")
    assert not att.abandon_if_stuck(now=5.0)
    assert att.abandon_if_stuck(now=5.0 + ABANDON_AFTER_S)
    assert not att.abandon_if_stuck(now=100.0)  # taken over once
    assert not att.body_returned()  # its thread drops what the body returned and leaves


def test_a_body_in_a_child_process_is_never_abandoned_by_the_watchdog() -> None:
    """Only a body run in the slot's thread is walked away from this way (a child process
    is killed instead)."""
    att = _held_attempt()
    att.halt("killed")
    assert not att.abandon_if_stuck(now=0.0)
    assert not att.abandon_if_stuck(now=ABANDON_AFTER_S * 10)
    assert lifecycle.holds(att.held.record, att.held.token)
