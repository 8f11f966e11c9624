"""Async producers (issue 35, docs/queue.md#async-producers): ``await f.asubmit(...)`` and
``await f.amap(...)`` publish what ``f.submit`` and ``f.map`` publish, on every tier; many
concurrent submits in one event loop get distinct ids that all read back; on S3 through
obstore no thread is started per call (every ``asyncio.to_thread`` goes through the loop's
default executor, which the tests replace by one that counts); failures are the same
lakeshore errors as the blocking verbs'. Also the typed options view at run time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.errors import InvalidArgument, MapFailed, StoreError, StoreUnavailable
from lakeshore.keys import QueueKeys
from lakeshore.protocol.gc import collect
from lakeshore.protocol.steps import ORPHAN_GRACE_S
from lakeshore.store import MemoryStore, PutMode, Store
from lakeshore.store.base import OVERWRITE
from tests import jobs
from tests.forwarding import Forwarding
from tests.gating import Gate, Run
from tests.tiers import FAKE_CREDS, make_plane


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting what is handed to it (each ``to_thread``)."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.calls = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls += 1
        return super().submit(fn, *args, **kwargs)


def run_counting(coro_fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``coro_fn()`` in a new loop whose default executor counts; (result, threads)."""
    pool = CountingExecutor()

    async def main() -> Any:
        asyncio.get_running_loop().set_default_executor(pool)
        return await coro_fn()

    try:
        return asyncio.run(main()), pool.calls
    finally:
        pool.shutdown(wait=True)


def _drain(q: Any, n: int) -> None:
    assert dls.run_worker(q, isolation="thread", concurrency=4, max_jobs=n, idle_exit=5) == n


# -- the same invocations as the blocking verbs, on every tier ----------------------------------


def test_asubmit_and_amap_publish_what_submit_publishes(q: Any) -> None:
    f = q.udf(jobs.add_one)
    g = q.udf(jobs.kw, queue="side")  # outside the default queue: the id index is written

    async def produce() -> tuple[str, str, list[str]]:
        one = await f.asubmit(1)
        other = await g.asubmit(1, b=5, c=7, _priority=8)
        many = await f.amap(range(10, 15))
        return one, other, many

    one, other, many = asyncio.run(produce())
    assert len({one, other, *many}) == 7
    rec = q.get(other)
    assert (rec.queue, rec.priority, rec.state) == ("side", 8, "queued")
    # a process that never saw the submit finds the id through the id index
    assert make_plane(q.plane.store).get(other).queue == "side"
    _drain(q, 7)  # a worker serves every queue of the namespace
    assert q.result(one, timeout=10) == 2 and q.result(other, timeout=10) == 13
    assert [q.result(i, timeout=10) for i in many] == [11, 12, 13, 14, 15]


def test_many_concurrent_asubmits_in_one_loop_get_distinct_ids_all_readable(q: Any) -> None:
    f = q.udf(jobs.echo)

    async def produce() -> list[str]:
        return list(await asyncio.gather(*(f.asubmit(i, tag="x") for i in range(60))))

    ids = asyncio.run(produce())
    assert len(set(ids)) == 60
    assert all(q.status(i) == "queued" for i in ids)
    assert [q.get(i).fn for i in ids] == [f.ref] * 60


def test_spilled_arguments_go_through_the_async_writes(q: Any) -> None:
    f = q.udf(jobs.size_of)
    blob = b"z" * (q.plane.spill_bytes + 1000)
    inv = asyncio.run(f.asubmit(blob))
    assert q.get(inv).args.ref is not None  # spilled to its own object
    _drain(q, 1)
    assert q.result(inv, timeout=10) == len(blob)


def test_a_keyed_asubmit_returns_the_id_the_key_names(q: Any) -> None:
    f = q.udf(jobs.add_one)

    async def produce() -> tuple[str, str]:
        return await f.asubmit(1, _key="k1"), await f.options(key="k1").asubmit(1)

    first, again = asyncio.run(produce())
    assert first == again == f.submit(1, _key="k1")


# -- no thread per call on obstore ---------------------------------------------------------------


@pytest.mark.seaweedfs
def test_on_obstore_asubmit_starts_no_thread_per_call(seaweed_s3: Store) -> None:
    q = make_plane(seaweed_s3)
    assert seaweed_s3.native_async  # type: ignore[attr-defined]
    f, g = q.udf(jobs.add_one), q.udf(jobs.add_one, queue="side")
    asyncio.run(f.asubmit(0))  # the queue's settings and the store's clock, read once
    asyncio.run(g.asubmit(0))

    async def produce() -> list[str]:
        ids = list(await asyncio.gather(*(f.asubmit(i) for i in range(20))))
        ids += list(await asyncio.gather(*(g.asubmit(i) for i in range(5))))
        return ids + await f.amap(range(20, 30))

    ids, threads = run_counting(produce)
    assert threads == 0
    assert len(set(ids)) == 35 and all(q.status(i) == "queued" for i in ids)


def test_where_the_store_has_no_async_client_the_writes_run_in_threads() -> None:
    # the counter sees the fallback: what makes the obstore test's zero mean something
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    inv, threads = run_counting(lambda: f.asubmit(1))
    assert not q.plane.store.native_async and threads >= 1
    assert q.status(inv) == "queued"


# -- the same errors ------------------------------------------------------------------------------


class Refusing(Forwarding):
    """Every PUT fails as an unavailable store would."""

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        raise StoreUnavailable(f"put {key}", "injected failure", "none: a test")


def test_errors_are_the_blocking_verbs_errors() -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    with pytest.raises(InvalidArgument, match="do not fit"):
        asyncio.run(f.asubmit(1, 2))  # type: ignore[call-arg]
    with pytest.raises(InvalidArgument, match="unknown option"):
        asyncio.run(f.asubmit(1, _prio=2))  # type: ignore[call-arg]
    with pytest.raises(InvalidArgument, match="underscore option"):
        asyncio.run(f.options(priority=2).asubmit(1, _key="k"))  # type: ignore[call-arg]
    broken = make_plane(Refusing(MemoryStore()))
    h = broken.udf(jobs.add_one)
    with pytest.raises(StoreUnavailable):
        asyncio.run(h.asubmit(1))
    with pytest.raises(MapFailed) as failed:
        asyncio.run(h.amap([1, 2]))
    assert failed.value.ids == [None, None]
    assert all(isinstance(e, StoreUnavailable) for e in failed.value.errors.values())


@pytest.mark.seaweedfs
def test_on_obstore_a_missing_bucket_is_the_same_store_error(seaweed: Any) -> None:
    from lakeshore.store.s3 import S3Store

    store = S3Store("no-such-bucket", "t", endpoint_url=seaweed.endpoint, **FAKE_CREDS)
    try:
        q = make_plane(store)
        f = q.udf(jobs.add_one)
        with pytest.raises(StoreError) as blocking:
            f.submit(1)
        with pytest.raises(StoreError) as awaited:
            asyncio.run(f.asubmit(1))
        assert type(awaited.value) is type(blocking.value)
        assert "does not exist" in str(awaited.value)
    finally:
        store.close()


# -- typed options at run time ----------------------------------------------------------------


def test_options_view_sends_its_options_and_the_underscore_spelling_still_works() -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    view = f.options(priority=9, max_attempts=2)
    a = view.submit(1)
    b = view.options(priority=1).submit(x=1)
    c = f.submit(1, _priority=7)  # type: ignore[call-arg]
    assert [(q.get(i).priority, q.get(i).max_attempts) for i in (a, b)] == [(9, 2), (1, 2)]
    assert q.get(c).priority == 7
    assert view.map([1, 2], keys=["m1", "m2"]) == view.map([1, 2], keys=["m1", "m2"])
    assert "priority=9" in repr(view)
    for batch in (
        lambda: view.options(key="k").map([1, 2]),
        lambda: asyncio.run(view.options(key="k").amap([1, 2])),
    ):
        with pytest.raises(InvalidArgument, match=r"same key[^—]*— pass one key per call: \.map"):
            batch()
    _drain(q, 5)
    worker = threading.Thread(
        target=dls.run_worker,
        args=(q,),
        kwargs={"isolation": "thread", "max_jobs": 1, "idle_exit": 30},
    )
    worker.start()
    try:
        assert view.options(result_timeout=30).remote(4) == 5
    finally:
        worker.join(60)


# -- a lost race, a fenced submit, a lost answer: the async path as the blocking one -------------


class LoopGate(Gate):
    """A :class:`Gate` whose async verbs run in the caller's thread, as an async client's
    do: a trap names the thread that runs the event loop."""

    async def aget(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        return self.get(key, max_bytes)

    async def aput(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        return self.put(key, data, mode)


def _in_loop(coro_fn: Callable[[], Any], prefix: str) -> Any:
    """Run ``coro_fn()`` in a new loop whose one thread (``to_thread``) is ``prefix_0``."""

    async def main() -> Any:
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=prefix)
        )
        return await coro_fn()

    return asyncio.run(main())


def _live_ids(q: Any) -> list[str]:
    """The queued invocations (a tombstone has a ticket too, of a killed record)."""
    ids = sorted(QueueKeys.id_of(t.key) for t in q.plane.ops("default").tickets())
    return [i for i in ids if q.status(i) == "queued"]


def test_an_asubmit_fenced_out_before_its_ticket_is_abandoned(atomic_store: Store) -> None:
    gate = LoopGate(atomic_store)
    q = make_plane(gate, spill_bytes=64)
    f = q.udf(jobs.size_of)
    stall = gate.trap("PUT", lambda k: "/_tickets/" in k, "slow")
    slow = Run("slow", lambda: asyncio.run(f.asubmit(b"z" * 1000)))
    stall.wait()  # spilled arguments written, no ticket
    ops = q.plane.ops("default")
    report = collect(ops, q.plane.settings, 0.0, q.store.now() + 2 * ORPHAN_GRACE_S)
    [orphan] = report.orphans  # gc fences the folder: a tombstone at the submit's id
    stall.go.set()
    with pytest.raises(dls.Conflict, match="abandoned") as err:
        slow.result()  # no id returned: nothing was submitted
    assert err.value.details["id"] == orphan
    assert _live_ids(q) == []
    assert q.get(orphan).error["type"] == "SubmitAbandoned"  # type: ignore[index]


def test_a_keyed_asubmit_fenced_out_starts_over_under_a_new_id(atomic_store: Store) -> None:
    gate = Gate(atomic_store)
    q = make_plane(gate, spill_bytes=64)
    f = q.udf(jobs.size_of)
    stall = gate.trap("PUT", lambda k: "/_tickets/" in k, "slow_0")  # the loop's thread
    slow = Run("slow", lambda: _in_loop(lambda: f.asubmit(b"k" * 1000, _key="k"), "slow"))
    stall.wait()  # key taken, arguments spilled, no ticket
    ops = q.plane.ops("default")
    [fenced] = collect(ops, q.plane.settings, 0.0, q.store.now() + 2 * ORPHAN_GRACE_S).orphans
    stall.go.set()
    inv = slow.result()
    assert inv != fenced and _live_ids(q) == [inv]
    assert asyncio.run(f.asubmit(b"k" * 1000, _key="k")) == inv  # the key names the new id
    _drain(q, 1)
    assert q.result(inv, timeout=10) == 1000


def test_asubmits_racing_on_one_key_get_one_invocation(atomic_store: Store) -> None:
    gate = Gate(atomic_store)
    q = make_plane(gate)
    f = q.udf(jobs.add_one)
    # the first stops right after taking the key, the second right after reading it
    took = gate.trap("PUT", lambda k: "/_keys/" in k, "first_0", after=True)
    read = gate.trap("GET", lambda k: "/_keys/" in k, "second_0", after=True)
    first = Run("first", lambda: _in_loop(lambda: f.asubmit(1, _key="k"), "first"))
    took.wait()
    second = Run("second", lambda: _in_loop(lambda: f.asubmit(1, _key="k"), "second"))
    read.wait()  # the key names the first's id, which has no record yet
    took.go.set()
    inv = first.result()
    read.go.set()
    assert second.result() == inv
    assert _live_ids(q) == [inv]


class RetriedCreate(Forwarding):
    """The ticket's create lands, but its answer is lost and the store's retry meets the
    object it wrote: Conflict (what S3 answers a retried If-None-Match PUT)."""

    tickets = 0

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        if "/_tickets/" in key and mode.name == "create" and self.tickets == 0:
            self.tickets += 1
            self.inner.put(key, data, mode)
            raise dls.Conflict("put", "exists", "retry")
        return self.inner.put(key, data, mode)


@pytest.mark.parametrize("options", [{}, {"_key": "k"}], ids=["plain", "keyed"])
def test_an_asubmit_whose_ticket_answer_was_lost_still_returns_the_id(
    options: dict[str, Any],
) -> None:
    store = RetriedCreate(MemoryStore())
    q = make_plane(store)
    inv = asyncio.run(q.udf(jobs.add_one).asubmit(41, **options))
    assert store.tickets == 1  # the lost answer happened
    assert _live_ids(q) == [inv] and q.status(inv) == "queued"
    _drain(q, 1)
    assert q.result(inv, timeout=10) == 42


class InFlight(MemoryStore):
    """Counts the async PUTs in flight and the tasks alive while each one is."""

    def __init__(self) -> None:
        super().__init__()
        self.now_in_flight = self.most_in_flight = self.most_tasks = 0

    async def aput(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        self.now_in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.now_in_flight)
        self.most_tasks = max(self.most_tasks, len(asyncio.all_tasks()))
        try:
            await asyncio.sleep(0)  # let the other publishers in
            return await super().aput(key, data, mode)
        finally:
            self.now_in_flight -= 1


def test_amap_holds_concurrency_publishers_not_a_task_per_call() -> None:
    store = InFlight()
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    ids = asyncio.run(f.amap(range(200), concurrency=3))
    assert len(set(ids)) == 200 and all(q.status(i) == "queued" for i in ids)
    assert store.most_in_flight == 3
    assert store.most_tasks <= 3 + 1  # the publishers and the main task
