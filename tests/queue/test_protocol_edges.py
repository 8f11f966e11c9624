"""Protocol edges found in review: tickets in flight must survive, newer records are left alone,
concurrent keyed submits, head-of-line retries, and inputs that must fail fast."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.model import lifecycle
from lakeshore.model.record import SCHEMA_VERSION
from lakeshore.protocol import claim_listing, claim_memory, claims, idempotency
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.steps import QueueOps
from lakeshore.store import MemoryStore
from tests import jobs
from tests.tiers import make_plane


def test_the_ticket_of_a_requeue_in_flight_survives_a_claimer(q: Any) -> None:
    inv = q.udf(jobs.add_one).submit(1)
    ops = q.plane.ops("default")
    held = Claimer(ops, "w1").claim(q.store.now())
    assert held is not None
    # A retry is half done: the ticket is a marker again, the record still says running.
    back = lifecycle.fail(held.record, held.token, {"type": "E"}, q.store.now())
    ops.put_marker(back)
    assert Claimer(ops, "w2").claim(q.store.now()) is None  # finds the ticket, must leave it
    assert [i.key for i in ops.tickets()] == [ops.keys.ticket(back.priority, inv)]
    ops.finish(held, back)  # the retry completes: the invocation is findable
    time.sleep(max(0.0, back.not_before - q.store.now()) + 0.01)  # wait out the backoff itself
    other = QueueOps(q.store, ops.keys)  # another worker (the first remembers to look later)
    again = Claimer(other, "w2").claim(q.store.now())
    assert again is not None and again.record.attempt == 2


def test_the_ticket_of_a_running_job_survives_claimers_and_reapers(q: Any) -> None:
    inv = q.udf(jobs.add_one).submit(1)
    ops = q.plane.ops("default")
    held = Claimer(ops, "w1").claim(q.store.now())
    assert held is not None
    ticket = [i.key for i in ops.tickets()]
    assert ticket == [ops.keys.ticket(held.record.priority, inv)]  # it stays while it runs
    other = QueueOps(q.store, ops.keys)  # another worker, which has never seen the invocation
    assert Claimer(other, "w2").claim(q.store.now()) is None
    assert Claimer(other, "").reap(q.store.now()) == 0  # the lease holds: nothing to move
    assert [i.key for i in ops.tickets()] == ticket
    ops.finish(held, lifecycle.succeed(held.record, held.token, None, q.store.now()))
    assert list(ops.tickets()) == []  # terminal: the ticket is gone


def test_newer_records_are_left_alone(q: Any) -> None:
    f = q.udf(jobs.add_one)
    future, ok = f.submit(1), f.submit(2)
    ops = q.plane.ops("default")
    ticket = ops.keys.ticket_of_id(future)
    assert ticket is not None
    raw, _ = q.store.get(ticket)  # the record, before its first claim
    newer = raw.replace(b"\xa1v\x01", b"\xa1v" + bytes([SCHEMA_VERSION + 1]))
    assert newer != raw
    q.store.put(ticket, newer)
    assert dls.run_worker(q, idle_exit=0.3) == 1
    assert q.result(ok) == 3
    assert q.store.get(ticket)[0] == newer  # untouched
    with pytest.raises(dls.NotFound):
        q.store.get(ops.keys.record(future))  # and never claimed
    assert Claimer(ops, "").reap(q.store.now() + 3600) == 0


def test_a_young_key_without_record_is_waited_for_then_repaired(q: Any) -> None:
    f = q.udf(jobs.add_one)
    ops = q.plane.ops("default")
    first = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    # a first submitter is between key and record, and has half a second of its grace left
    at = q.store.now() - idempotency.KEY_REPAIR_GRACE_S + 0.5
    q.store.put(ops.keys.idem("race"), codec.encode({"id": first, "input_hash": "?", "at": at}))
    inv = f.submit(5, _key="race")  # waits for the record, never returns an id without one
    assert inv != first
    assert q.get(first).error["type"] == "SubmitAbandoned"  # fenced: it can never publish
    assert q.status(inv) == "queued"
    assert dls.run_worker(q, once=True) == 1 and q.result(inv, timeout=5) == 6


def test_retries_at_the_head_do_not_hide_work_behind_them(q: Any) -> None:
    f = q.udf(jobs.add_one)
    ops = q.plane.ops("default")
    for i in range(20):
        inv = f.submit(i)
        rec, etag = ops.read(inv)
        ops.cas(rec.next_write(not_before=q.store.now() + 3600), etag)  # backing off an hour
    fresh = f.submit(100)
    assert dls.run_worker(q, once=True) == 1
    assert q.result(fresh, timeout=5) == 101


def test_bad_options_and_calls_fail_at_submit(plane: Any) -> None:
    f = plane.udf(jobs.kw)
    with pytest.raises(dls.InvalidArgument, match="max_attempts"):
        f.submit(1, _max_attempts=0)
    with pytest.raises(dls.InvalidArgument, match="do not fit"):
        f.submit(1, 2, 3)  # c is keyword-only
    a = f.submit(1, b=2, _key="same", _strict_key=True)
    assert f.submit(b=2, a=1, _key="same", _strict_key=True) == a  # same call, other spelling
    assert f.submit(1, _key="same", _strict_key=True) == a  # defaults filled in
    with pytest.raises(dls.KeyReused):
        f.submit(1, b=5, _key="same", _strict_key=True)


def test_an_unsendable_result_fails_without_retrying(plane: Any) -> None:
    inv = plane.udf(jobs.unsendable).submit()
    assert dls.run_worker(plane, once=True) == 1
    with pytest.raises(dls.Failed, match="UnsendableValue"):
        plane.result(inv)
    assert plane.get(inv).attempt == 1


def test_strict_key_ignores_the_order_of_extra_keywords(plane: Any) -> None:
    e = plane.udf(jobs.echo)
    a = e.submit(x=1, y=2, _key="kw", _strict_key=True)
    assert e.submit(y=2, x=1, _key="kw", _strict_key=True) == a


def test_payloads_over_the_cap_are_refused(plane: Any) -> None:
    small = make_plane(plane.store, max_payload_bytes=1000, spill_bytes=100)
    f = small.udf(jobs.size_of)
    with pytest.raises(dls.InvalidArgument, match="over max_payload_bytes=1000"):
        f.submit(b"x" * 2000)
    # a result over the cap fails for good, without a retry
    inv = small.udf(jobs.big).submit(5000)
    dls.run_worker(small, once=True, isolation="thread")
    with pytest.raises(dls.Failed, match="ResultTooLarge"):
        small.result(inv, timeout=30)
    assert small.get(inv).attempt == 1
    # a record that claims huge spilled arguments is refused before they are fetched
    roomy = make_plane(plane.store, spill_bytes=100)
    inv = roomy.udf(jobs.size_of).submit(b"y" * 5000)
    dls.run_worker(small, once=True, isolation="thread")
    with pytest.raises(dls.Failed, match="over max_payload_bytes"):
        roomy.result(inv, timeout=30)


def test_the_ticket_of_a_rerun_in_flight_survives_a_claimer(q: Any) -> None:
    inv = q.udf(jobs.add_one).submit(1)
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    ops = q.plane.ops("default")
    rec, etag = ops.read(inv)
    assert rec.state == "succeeded" and list(ops.tickets()) == []
    # `lakeshore retry` is half done: the new ticket is written, the record still terminal
    nxt = lifecycle.rerun(rec, q.store.now())
    ops.put_marker(nxt)
    other = QueueOps(q.store, ops.keys)  # a claimer that reads the record right now
    assert Claimer(other, "w2").claim(q.store.now()) is None
    assert [i.key for i in ops.tickets()] == [ops.ticket_key(nxt)]  # kept
    ops.cas(nxt, etag)  # the retry completes
    again = Claimer(QueueOps(q.store, ops.keys), "w3").claim(q.store.now())
    assert again is not None and again.record.id == inv and again.record.attempt == 2


def test_retry_puts_back_a_ticket_dropped_while_it_ran(q: Any) -> None:
    inv = q.udf(jobs.add_one).submit(1)
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    ops = q.plane.ops("default")
    real_put = ops.put_marker
    calls = []

    def put_then_lose(rec: Any) -> str:
        etag = real_put(rec)
        calls.append(rec.id)
        if len(calls) == 1:  # a claimer judged this ticket stale and deleted it
            q.store.delete(ops.ticket_key(rec))
        return etag

    ops.put_marker = put_then_lose  # type: ignore[method-assign]
    assert q.retry(inv) == 2
    assert calls == [inv, inv]  # retry saw the ticket gone and wrote it again
    ops.put_marker = real_put  # type: ignore[method-assign]
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    assert q.result(inv) == 2


def test_an_idle_exit_waits_for_a_retry_backing_off(q: Any, tmp_path: Path) -> None:
    # A worker draining the queue must not leave a retry it has seen behind: the invocation would
    # stay queued with nobody to run it (SIGKILL test, CI run of 2026-12-01).
    slow = make_plane(q.store, retry_backoff_s=0.8)
    inv = slow.udf(jobs.fail_until).submit(str(tmp_path / "n"), 1)
    # a record claiming a retry far past the longest backoff is not waited for (one further
    # off than a day is failed: tests/queue/test_stalls_and_due_times.py)
    hostile = slow.udf(jobs.add_one).submit(1)
    ops = slow.plane.ops("default")
    rec, etag = ops.read(hostile)
    ops.cas(rec.next_write(not_before=slow.store.now() + 2 * lifecycle.MAX_BACKOFF_S), etag)
    ran = dls.run_worker(slow, isolation="thread", idle_exit=0.2, max_poll_s=0.05)
    assert ran == 2 and slow.result(inv, timeout=1) == "ok after 2"
    assert slow.get(hostile).state == "queued"
    # one pass (``once``) never waits for a retry
    again = slow.udf(jobs.fail_until).submit(str(tmp_path / "m"), 1)
    assert dls.run_worker(slow, once=True, isolation="thread", idle_exit=0.2) == 1
    assert slow.get(again).state == "queued" and slow.get(again).attempt == 1


class _FlakyClock(MemoryStore):
    """A store whose clock cannot be read a few times from a worker's slot (S3: no answer
    yet), and whose time the test moves by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = 0
        self.t: float | None = None

    def now(self) -> float:
        if self.fail > 0 and threading.current_thread().name.startswith("lakeshore-slot"):
            self.fail -= 1
            raise dls.StoreUnavailable("clock", "no answer", "retry")
        return super().now() if self.t is None else self.t


def test_a_clock_that_cannot_be_read_does_not_end_a_worker() -> None:
    store = _FlakyClock()
    q = make_plane(store)
    inv = q.udf(jobs.add_one).submit(1)
    store.fail = 2  # the slot's first clock reads fail: the claim is tried again
    assert dls.run_worker(q, isolation="thread", idle_exit=0.5, max_poll_s=0.05) == 1
    assert q.result(inv, timeout=1) == 2


def test_a_retry_is_waited_for_until_a_pass_that_began_after_it_was_due() -> None:
    store = _FlakyClock()
    store.t = 1000.0
    q = make_plane(store)
    ticks = [0.0]
    mine = Claimer(q.plane.ops("default"), "mine", ticks=lambda: ticks[0])
    inv = q.udf(jobs.add_one).submit(1)
    ops = q.plane.ops("default")
    rec, etag = ops.read(inv)
    ops.cas(rec.next_write(not_before=1100.0, attempt=1), etag)  # backing off for 100 s
    assert mine.claim(store.now()) is None and mine.retry_pending()
    store.t = 1150.0  # due: another worker takes it first
    assert Claimer(ops, "other").claim(store.now()) is not None
    assert mine.retry_pending()  # no pass of its own since it was due
    assert mine.claim(store.now()) is None and not mine.retry_pending()
    # a retry read as due further away than any backoff (and the clocks' slack) is not
    # waited for; one within reach is, but never longer than the longest backoff from when
    # it was read (a store clock stepped back cannot hold a worker)
    fresh = Claimer(ops, "fresh", ticks=lambda: ticks[0])
    for due in (1150.0 + lifecycle.MAX_BACKOFF_S + 60, 1400.0):  # too far, then within reach
        inv = q.udf(jobs.add_one).submit(2)
        rec, etag = ops.read(inv)
        ops.cas(rec.next_write(not_before=due, attempt=1), etag)
        assert fresh.claim(store.now()) is None
        assert fresh.retry_pending() == (due == 1400.0)
    store.t = 1000.0  # the store clock steps back: the retry is due further away now
    ticks[0] = lifecycle.MAX_BACKOFF_S + 31.0
    assert not fresh.retry_pending()


class _CountingDeletes(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.tickets_deleted: list[str] = []

    def delete(self, key: str, if_match: str | None = None) -> None:
        if "/_tickets/" in key:
            self.tickets_deleted.append(key)
        super().delete(key, if_match=if_match)  # delete_many comes here too, key by key


def test_two_workers_of_one_process_delete_each_ticket_once() -> None:
    # Each worker has its own claim scheduler; a ticket whose delete waits in the process's
    # batch is skipped by both, not read and deleted again by the other worker.
    store = _CountingDeletes()
    q = make_plane(store)
    ids = q.udf(jobs.add_one).map(range(40))
    workers = [
        threading.Thread(
            target=dls.run_worker,
            args=(q,),
            kwargs={"isolation": "thread", "idle_exit": 0.3, "max_poll_s": 0.05, "worker_id": w},
        )
        for w in ("w1", "w2")
    ]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert [q.result(i, timeout=1) for i in ids] == list(range(1, 41))
    assert sorted(store.tickets_deleted) == sorted(set(store.tickets_deleted))
    assert len(store.tickets_deleted) == 40


def test_a_pass_that_ran_out_of_listings_or_overlapped_another_does_not_end_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Scaled down: one ticket per listing, one listing per pass (real: 1000 and 4).
    monkeypatch.setattr(claim_listing, "_LISTING", 1)
    monkeypatch.setattr(claims, "_LISTS_PER_CLAIM", 1)
    store = _FlakyClock()
    store.t = 1000.0
    q = make_plane(store)
    ops = q.plane.ops("default")
    f = q.udf(jobs.add_one)
    a1, a2, k = f.submit(1), f.submit(2), f.submit(3)
    rec, etag = ops.read(k)
    ops.cas(rec.next_write(not_before=1100.0, attempt=1), etag)
    other, mine = Claimer(ops, "other"), Claimer(ops, "mine")
    held = [other.claim(store.now(), lease_s=100.0), other.claim(store.now(), lease_s=100.0)]
    assert {h.record.id for h in held if h is not None} == {a1, a2}
    for _ in range(6):  # one ticket a pass (a full ticket of a claimed invocation costs two)
        assert mine.claim(store.now()) is None
        if mine.retry_pending():
            break
    assert mine.retry_pending()
    store.t = 1090.0
    held = [ops.heartbeat(h, store.now()) for h in held if h is not None]  # leases to 1190
    store.t = 1150.0
    mine.listing.listed_at = -1e9  # its listing has aged out (as after LISTING_S)
    # the pass lists one running invocation and has no listing left: K was never looked at
    assert mine.claim(store.now()) is None and mine.retry_pending()
    # a pass that found nothing while another slot's pass (begun before K was due) is in
    # flight does not count past that pass's start
    monkeypatch.setattr(claims, "_LISTS_PER_CLAIM", 4)
    mine._passes.append(1050.0)
    for _ in range(4):
        got = mine.claim(store.now())
        if got is not None:
            assert got.record.id == k  # it is due: claimed, not waited for
            break
    else:
        raise AssertionError("the due retry was not claimed")
    mine._passes.remove(1050.0)
    # the wait is capped from when the retry was read: its wait, the slack and the grace
    fresh_ticks = [0.0]
    late = Claimer(ops, "late", ticks=lambda: fresh_ticks[0])
    r = f.submit(4)
    rec, etag = ops.read(r)
    ops.cas(rec.next_write(not_before=store.now() + 280.0, attempt=1), etag)
    for _ in range(10):  # a fresh scheduler reads its way down to the retry
        assert late.claim(store.now()) is None
        if late.retry_pending(grace=60.0):
            break
    assert late.retry_pending(grace=60.0)
    fresh_ticks[0] = 280.0 + claim_memory.SLACK_S + 59.0
    assert late.retry_pending(grace=60.0) and not late.retry_pending(grace=0.0)
    fresh_ticks[0] = 280.0 + claim_memory.SLACK_S + 61.0
    assert not late.retry_pending(grace=60.0)
