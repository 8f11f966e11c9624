"""The work queue (issue 19): producers submit payloads, consumers claim, ack or nack.

Runs on the tiers whose conditional writes are atomic (memory, local, SeaweedFS). Leases
are made to run out by moving the store's clock (``Skewed``), never by sleeping past them.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.errors import (
    DecodeError,
    Failed,
    Fenced,
    InvalidArgument,
    Killed,
    NotFinished,
)
from lakeshore.model.record import Blob, Record
from lakeshore.store import Store
from lakeshore.store.base import OVERWRITE
from lakeshore.submit import submit_call
from lakeshore.work_queue import _PayloadBody
from tests import jobs
from tests.forwarding import Forwarding
from tests.tiers import date_clock_lease, make_plane, record_key
from tests.waiting import poll


class Skewed(Forwarding):
    """The inner store, with a clock the test moves forward (a consumer stalled that long)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.offset = 0.0

    def now(self) -> float:
        return self.inner.now() + self.offset


@pytest.fixture
def skewed(atomic_store: Store) -> Skewed:
    return Skewed(atomic_store)


@pytest.fixture
def q(skewed: Skewed) -> Any:
    return make_plane(skewed, lease_s=10.0, retry_backoff_s=5.0)


@pytest.fixture
def wq(q: Any) -> dls.WorkQueue:
    return dls.WorkQueue("work", q)


# -- the round trip -----------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [{"x": 1}, (1, "two", b"3"), None, [1.5, [2]], "text"])
def test_a_payload_goes_round_and_its_result_comes_back(wq: dls.WorkQueue, payload: Any) -> None:
    inv = wq.submit(payload)
    job = wq.claim()
    assert job is not None
    assert (job.id, job.payload, job.attempt, job.queue) == (inv, payload, 1, "work")
    assert wq.status(inv) == "running"
    job.ack({"echo": payload})
    assert wq.result(inv, timeout=5) == {"echo": payload}
    assert job.ended == "succeeded"
    assert wq.claim() is None


def test_the_record_names_no_function_and_the_cli_views_see_it(wq: dls.WorkQueue, q: Any) -> None:
    inv = wq.submit(7)
    rec = q.get(inv)
    assert rec.fn == "payload" and rec.is_payload and rec.queue == "work"


def test_a_key_makes_the_submit_idempotent_and_strict_keys_refuse_other_payloads(
    wq: dls.WorkQueue,
) -> None:
    a = wq.submit({"n": 1}, key="k1")
    assert wq.submit({"n": 1}, key="k1") == a
    assert wq.submit({"n": 2}, key="k1") == a  # not strict: the first wins
    with pytest.raises(dls.KeyReused):
        wq.submit({"n": 2}, key="k1", strict_key=True)
    assert wq.count() == 1


def test_higher_priority_is_claimed_first(wq: dls.WorkQueue) -> None:
    low = wq.submit("low", priority=1)
    high = wq.submit("high", priority=9)
    mid = wq.submit("mid")
    got = [j.id for j in wq.claim_many(3)]
    assert got == [high, mid, low]


def test_submit_many_returns_ids_in_order_and_keys_dedupe(wq: dls.WorkQueue) -> None:
    ids = wq.submit_many(range(6), keys=["a", "b", "a", None, None, "c"], concurrency=3)
    assert len(ids) == 6 and ids[0] == ids[2] and len(set(ids)) == 5
    payloads = sorted(j.payload for j in wq.claim_many(10))
    assert payloads == [0, 1, 3, 4, 5]


def test_an_unsendable_payload_or_a_bad_option_is_refused_before_anything_is_written(
    wq: dls.WorkQueue,
) -> None:
    with pytest.raises(InvalidArgument, match="object"):
        wq.submit(object())
    with pytest.raises(InvalidArgument):
        wq.submit(1, priority=12)
    with pytest.raises(InvalidArgument):
        wq.claim(lease_s=-1)
    with pytest.raises(InvalidArgument):
        wq.claim_many(0)
    with pytest.raises(InvalidArgument, match="unknown state"):
        wq.count("done")
    assert wq.counts() == dict.fromkeys(
        ["queued", "running", "succeeded", "failed", "killed", "timeout"], 0
    )


# -- working(), the context manager ---------------------------------------------------------------


def test_working_on_an_empty_queue_yields_none(wq: dls.WorkQueue) -> None:
    with wq.working() as job:
        assert job is None
    assert len(wq) == 0


def test_working_acks_on_success_and_nacks_on_an_exception(wq: dls.WorkQueue, q: Any) -> None:
    ok, bad = wq.submit("ok"), wq.submit("bad")
    with wq.working() as job:
        assert job is not None and job.id == ok
    assert wq.result(ok, timeout=5) is None
    with pytest.raises(RuntimeError, match="boom"), wq.working() as job:
        assert job is not None and job.id == bad
        raise RuntimeError("boom")
    rec = q.get(bad)
    assert rec.state == "queued" and rec.attempt == 1
    assert rec.error["type"] == "RuntimeError" and "boom" in rec.error["traceback"]


def test_working_releases_on_keyboard_interrupt_without_counting_the_attempt(
    wq: dls.WorkQueue, q: Any
) -> None:
    inv = wq.submit("x")
    with pytest.raises(KeyboardInterrupt), wq.working():
        raise KeyboardInterrupt
    rec = q.get(inv)
    assert rec.state == "queued" and rec.released == 1 and rec.error is None
    job2 = wq.claim()
    assert job2 is not None and job2.id == inv and job2.attempt == 2


def test_with_job_heartbeats_while_the_block_runs(skewed: Skewed) -> None:
    q = make_plane(skewed, lease_s=date_clock_lease(skewed.inner, 0.6))
    wq = dls.WorkQueue("work", q)
    inv = wq.submit(1)
    job = wq.claim()
    assert job is not None
    first = job.record.lease.expires_at
    with job:
        poll(lambda: job.record.lease.expires_at > first + 0.1, 30, "a heartbeat")
        assert not job.lost
    assert q.status(inv) == "succeeded"


# -- fencing --------------------------------------------------------------------------------------


def test_two_consumers_never_hold_the_same_live_job(q: Any) -> None:
    ids = set(dls.WorkQueue("work", q).submit_many(range(40), concurrency=4))
    consumers = [dls.WorkQueue("work", q) for _ in range(2)]
    taken: list[list[str]] = [[], []]
    start = threading.Barrier(2)

    def consume(n: int) -> None:
        start.wait()
        while (job := consumers[n].claim()) is not None:
            taken[n].append(job.id)  # held, not acked: nobody else may get it

    threads = [threading.Thread(target=consume, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not set(taken[0]) & set(taken[1])
    assert sorted(taken[0] + taken[1]) == sorted(ids)


def test_a_consumer_paused_past_its_lease_cannot_ack_once_another_took_over(
    q: Any, skewed: Skewed
) -> None:
    wq1, wq2 = dls.WorkQueue("work", q), dls.WorkQueue("work", q)
    inv = wq1.submit("job")
    stalled = wq1.claim()
    assert stalled is not None
    skewed.offset += 11.0  # the first consumer stalls past its 10 s lease
    assert wq2.claim() is None  # the expired lease is ended: a failed attempt, backing off
    skewed.offset += 5.5
    taker = wq2.claim()
    assert taker is not None and taker.id == inv and taker.attempt == 2
    with pytest.raises(Fenced):
        stalled.ack("late")
    with pytest.raises(Fenced):
        stalled.heartbeat()
    taker.ack("on time")
    assert wq1.result(inv, timeout=5) == "on time"


def test_a_consumer_paused_past_its_lease_cannot_ack_even_when_nobody_took_over(
    q: Any, skewed: Skewed, wq: dls.WorkQueue
) -> None:
    inv = wq.submit("job", max_attempts=1)
    job = wq.claim()
    assert job is not None
    skewed.offset += 11.0
    with pytest.raises(Fenced):
        job.ack("late")
    assert job.ended != "succeeded"
    rec = q.get(inv)
    assert rec.state == "failed" and rec.error["type"] == "LeaseNotRenewed"


def test_a_heartbeat_keeps_the_job_from_a_second_consumer(q: Any, skewed: Skewed) -> None:
    wq1, wq2 = dls.WorkQueue("work", q), dls.WorkQueue("work", q)
    inv = wq1.submit("job")
    job = wq1.claim()
    assert job is not None
    skewed.offset += 8.0
    assert job.heartbeat() > 9.0
    skewed.offset += 8.0  # 16 s after the claim, 8 s after the heartbeat
    assert wq2.claim() is None
    job.ack(1)
    assert wq1.result(inv, timeout=5) == 1


def test_a_cancelled_job_refuses_its_consumers_heartbeat_and_ack(wq: dls.WorkQueue, q: Any) -> None:
    inv = wq.submit("job")
    job = wq.claim()
    assert job is not None
    assert wq.cancel(inv)
    with pytest.raises(Fenced):
        job.heartbeat()
    assert job.lost
    with pytest.raises(Fenced, match="cancelled"):
        job.ack(1)
    with pytest.raises(Fenced, match="cancelled"):
        job.nack("x")  # still refused: the job ended when the ack found it cancelled
    with pytest.raises(Killed):
        wq.result(inv, timeout=5)


def test_a_job_is_ended_once(wq: dls.WorkQueue) -> None:
    wq.submit(1)
    job = wq.claim()
    assert job is not None
    job.ack(1)
    for end in (lambda: job.ack(2), lambda: job.nack("x"), job.release, job.heartbeat):
        with pytest.raises(InvalidArgument, match="already ended"):
            end()


def test_a_result_over_the_cap_is_refused_and_the_job_stays_held(skewed: Skewed) -> None:
    q = make_plane(skewed, max_payload_bytes=1000)
    wq = dls.WorkQueue("work", q)
    inv = wq.submit(1)
    job = wq.claim()
    assert job is not None
    with pytest.raises(InvalidArgument, match="max_payload_bytes"):
        job.ack(b"x" * 5000)
    assert q.status(inv) == "running"
    job.ack(b"small")
    assert wq.result(inv, timeout=5) == b"small"


# -- nack, retries and backoff --------------------------------------------------------------------


def test_nack_retries_after_the_backoff_until_max_attempts(
    wq: dls.WorkQueue, q: Any, skewed: Skewed
) -> None:
    inv = wq.submit("job", max_attempts=2)
    job = wq.claim()
    assert job is not None
    assert job.nack(ValueError("first")) == "queued"
    rec = q.get(inv)
    assert rec.not_before >= skewed.now() + 4.0  # retry_backoff_s=5 after attempt 1
    assert wq.claim() is None  # backing off
    skewed.offset += 5.5
    job = wq.claim()
    assert job is not None and job.attempt == 2
    assert job.nack("second") == "failed"  # two attempts used
    with pytest.raises(Failed, match="second") as err:
        wq.result(inv, timeout=5)
    assert err.value.remote_type == "Nacked"
    assert wq.count("failed") == 1


def test_nack_without_retry_fails_at_once(wq: dls.WorkQueue) -> None:
    inv = wq.submit("job", max_attempts=5)
    job = wq.claim()
    assert job is not None
    assert job.nack("bad input", retry=False) == "failed"
    assert wq.status(inv) == "failed"


def test_a_payload_past_its_deadline_is_never_handed_out(wq: dls.WorkQueue, skewed: Skewed) -> None:
    inv = wq.submit("late", deadline_s=30)
    skewed.offset += 31
    assert wq.claim() is None
    assert wq.status(inv) == "timeout"


# -- streaming, counting, RPC ----------------------------------------------------------------------


def test_posted_values_stream_to_readers_and_a_result_can_follow(wq: dls.WorkQueue) -> None:
    a, b = wq.submit("a"), wq.submit("b")
    job = wq.claim()
    assert job is not None and job.id == a
    for i in range(3):
        job.post({"step": i})
    frames = wq.stream(a, timeout=30)
    assert [next(frames).value for _ in range(3)] == [{"step": i} for i in range(3)]
    job.ack()  # no result: the posted values are it, as for a generator body
    assert list(frames) == []
    assert wq.result(a, timeout=5) == [{"step": i} for i in range(3)]
    job = wq.claim()
    assert job is not None and job.id == b
    job.post("partial")
    job.ack("final")
    assert wq.result(b, timeout=5) == "final"
    assert [f.value for f in wq.stream(b)] == ["partial"]


def test_count_and_len_follow_the_states(wq: dls.WorkQueue, q: Any) -> None:
    assert len(wq) == 0 and wq.count("running") == 0
    wq.submit_many(range(5))
    assert len(wq) == 5
    held = wq.claim_many(3)
    assert (wq.count("queued"), wq.count("running")) == (2, 3)
    held[0].ack(0)
    held[1].nack("no", retry=False)
    held[2].release()
    counts = wq.counts()
    assert (counts["queued"], counts["running"], counts["succeeded"], counts["failed"]) == (
        3,
        0,
        1,
        1,
    )


def test_call_submits_and_waits_for_a_consumer(wq: dls.WorkQueue, q: Any) -> None:
    consumer = dls.WorkQueue("work", q)

    def serve() -> None:
        job = consumer.claim(wait=60)
        assert job is not None
        job.ack(job.payload * 2)

    t = threading.Thread(target=serve)
    t.start()
    assert wq.call(21, timeout=60) == 42
    t.join(60)
    with pytest.raises(NotFinished):
        wq.call(1, timeout=0.2)


def test_queue_verbs_take_a_job_or_the_id_of_one_this_object_holds(wq: dls.WorkQueue) -> None:
    a, b = wq.submit(1), wq.submit(2)
    assert [j.id for j in wq.claim_many(2)] == [a, b]
    wq.post(a, "frame")
    assert wq.heartbeat(a) > 0
    wq.ack(a, "done")
    assert wq.nack(b, "no", retry=False) == "failed"
    with pytest.raises(InvalidArgument, match="holds no such job"):
        dls.WorkQueue("work", wq.plane).ack(a)
    assert wq.result(a, timeout=5) == "done"


# -- sharing a queue with function workers; hostile payloads --------------------------------------


def test_function_workers_and_consumers_pass_each_others_work_over(q: Any) -> None:
    f = q.udf(jobs.add_one, queue="work")
    call = f.submit(1)
    wq = dls.WorkQueue("work", q)
    payload = wq.submit("p")
    job = wq.claim()
    assert job is not None and job.id == payload
    job.ack("done")
    assert wq.claim() is None
    assert dls.run_worker(q, queues=["work"], isolation="thread", max_jobs=1, idle_exit=0) == 1
    assert q.result(call, timeout=5) == 2
    assert q.status(payload) == "succeeded"


def test_a_worker_leaves_payloads_queued(q: Any) -> None:
    wq = dls.WorkQueue("work", q)
    inv = wq.submit("p")
    assert dls.run_worker(q, queues=["work"], isolation="thread", idle_exit=0) == 0
    assert q.status(inv) == "queued" and q.get(inv).attempt == 0


def test_a_payload_that_is_not_one_value_is_failed_and_the_next_one_is_claimed(
    wq: dls.WorkQueue, q: Any
) -> None:
    body = _PayloadBody("work")
    body.__dict__["signature"] = None  # bind nothing: a producer that wrote its own record
    bad = submit_call(q, body, (1, 2), {})  # two values: not a payload
    good = wq.submit("good")
    job = wq.claim()
    assert job is not None and job.id == good
    rec = q.get(bad)
    assert rec.state == "failed" and rec.error["type"] == DecodeError.__name__


# -- the async spelling ---------------------------------------------------------------------------


def test_the_async_queue_runs_the_same_verbs(q: Any) -> None:
    async def main() -> None:
        aq = dls.AsyncWorkQueue("work", q)
        inv = await aq.submit({"n": 1})
        assert await aq.count() == 1
        async with aq.working() as job:
            assert job is not None and job.payload == {"n": 1}
            await aq.post(job, "frame")
        assert await aq.result(inv, timeout=5) == ["frame"]
        assert [f.value async for f in aq.stream(inv)] == ["frame"]
        async with aq.working() as job:
            assert job is None
        inv2 = await aq.submit(2)
        job = await aq.claim()
        assert job is not None and job.id == inv2
        await aq.ack(job, 4)
        assert aq.sync.result(inv2) == 4

    asyncio.run(main())


def test_a_cancelled_task_releases_its_job(q: Any) -> None:
    aq = dls.AsyncWorkQueue("work", q)
    inv = aq.sync.submit("x")
    inside = asyncio.Event()

    async def consume() -> None:
        async with aq.working() as job:
            assert job is not None
            inside.set()
            await asyncio.sleep(3600)

    async def main() -> None:
        task = asyncio.create_task(consume())
        await inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    rec = q.get(inv)
    assert rec.state == "queued" and rec.released == 1


# -- function conveniences ------------------------------------------------------------------------


def test_remote_submits_and_waits_and_local_runs_here(q: Any) -> None:
    f = q.udf(jobs.add_one)
    assert f.local(1) == 2 == f(1)
    worker = threading.Thread(
        target=dls.run_worker, args=(q,), kwargs={"isolation": "thread", "max_jobs": 1}
    )
    worker.start()
    assert f.remote(41, _result_timeout=60) == 42
    worker.join(60)
    with pytest.raises(NotFinished):
        f.remote(1, _result_timeout=0.1)
    with pytest.raises(InvalidArgument, match="_result_timeout"):
        f.remote(1, _result_timeout=-1)


# -- what a review found ---------------------------------------------------------------------------


def test_a_heartbeat_thread_woken_past_the_lease_never_renews_it(
    wq: dls.WorkQueue, q: Any, skewed: Skewed
) -> None:
    inv = wq.submit("job", max_attempts=1)
    job = wq.claim()
    assert job is not None
    skewed.offset += 11.0  # the process was stopped past its 10 s lease
    with pytest.raises(Fenced), job:  # its heartbeat thread wakes first and must not renew
        poll(lambda: job.lost, 30, "the heartbeat thread to give the lease up")
    assert job.ended != "succeeded"
    assert q.status(inv) != "succeeded"


def _rewrite_args(q: Any, inv: str, args: bytes) -> None:
    """Replace the arguments of ``inv``'s record as someone with write access could."""
    ops = q.plane.ops(q.get(inv).queue)
    key = record_key(ops, inv)
    rec = Record.from_bytes(q.store.get(key)[0])
    forged = rec.next_write(args=Blob(inline=args))
    q.store.put(key, forged.to_bytes(), OVERWRITE)


@pytest.mark.parametrize(
    "args", [5, [1, 2, 3], (1, 2), ({"a": 1}, {}), None, ("x", {}), ((1,), []), ((1,), {1: 2})]
)
def test_a_forged_argument_shape_is_failed_by_consumers_and_workers_alike(
    q: Any, args: Any
) -> None:
    wq = dls.WorkQueue("work", q)
    bad = wq.submit("p")
    _rewrite_args(q, bad, codec.encode(args))
    good = wq.submit("good")
    job = wq.claim()
    assert job is not None and job.id == good  # the forged one was failed on the way
    assert q.get(bad).state == "failed" and q.get(bad).error["type"] == "DecodeError"
    f = q.udf(jobs.add_one)
    call = f.submit(1)
    _rewrite_args(q, call, codec.encode(args))
    after = f.submit(2)
    assert dls.run_worker(q, isolation="thread", max_jobs=2, idle_exit=0) == 2
    assert q.status(call) == "failed" and q.result(after) == 3


def test_a_spilled_object_larger_than_its_record_says_is_not_read(q: Any) -> None:
    ops = q.plane.ops("work")
    q.store.put("elsewhere/huge", b"x" * 100_000)
    blob = Blob(ref="elsewhere/huge", size=10, sha256="0" * 64)
    with pytest.raises(dls.StoreError, match="does not match its size"):
        ops.get_blob(blob, "forged payload")


def test_a_task_cancelled_while_claiming_releases_what_its_thread_claimed(q: Any) -> None:
    aq = dls.AsyncWorkQueue("work", q)

    async def main() -> None:
        task = asyncio.create_task(aq.claim(wait=30))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.to_thread(aq.sync.submit, "x")  # its claim thread finds this one
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (rec,) = [q.get(i) for i in [next(iter(aq.sync._held))]]
    assert rec.state == "queued" and rec.attempt == 1 and rec.released == 1


def test_an_empty_work_queue_is_still_true_and_lease_lengths_are_checked(
    wq: dls.WorkQueue,
) -> None:
    assert wq and len(wq) == 0
    for bad in (True, 0.0, -1, float("nan"), "10"):
        with pytest.raises(InvalidArgument, match="lease length"):
            wq.claim(lease_s=bad)
