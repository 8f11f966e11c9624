"""Dependencies on every tier: ``_after=[ids]``, ``_after_failure``, ``fan_in``.

The issue's bar: a child never runs before all its parents succeeded, never stays queued
after a parent failed (while some worker serves its queue), parents may live in other
queues and be submitted by a process long gone, and a fan-in hands its body the parents'
ids or results in parent order. Claims are driven by hand where the order matters, and
workers run where the whole path does; nothing sleeps to synchronise.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import msgpack
import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.errors import Killed
from lakeshore.keys import new_id
from lakeshore.model import lifecycle
from lakeshore.model.record import Blob
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.steps import Claimed, QueueOps
from lakeshore.store import LocalStore, MemoryStore, PutMode, Store
from lakeshore.store.base import OVERWRITE
from tests import jobs
from tests.forwarding import Forwarding
from tests.gating import Gate, Run
from tests.handmade import handmade, put_by_hand
from tests.tiers import make_plane
from tests.waiting import poll


def square(x: int) -> int:
    return x * x


def total(parts: list[Any], extra: int = 0) -> Any:
    return [parts, extra]


def boom() -> None:
    raise ValueError("no")


def blob(n: int) -> bytes:
    return bytes([n % 256]) * 300


def drain(q: Any, jobs: int | None = None, **kw: Any) -> int:
    kw.setdefault("isolation", "thread")
    kw.setdefault("idle_exit", 3.0 if jobs is not None else 1.0)
    kw.setdefault("max_poll_s", 0.05)
    return dls.run_worker(q, max_jobs=jobs, **kw)


def succeed(ops: QueueOps, held: Claimed, value: Any = None) -> None:
    now = ops.store.now()
    ops.finish(
        held, lifecycle.succeed(held.record, held.token, Blob(inline=codec.encode(value)), now)
    )


def fail(ops: QueueOps, held: Claimed) -> None:
    error = {"type": "ValueError", "message": "no", "traceback": ""}
    ops.finish(held, lifecycle.fail(held.record, held.token, error, ops.store.now(), retry=False))


def claim(c: Claimer) -> Claimed | None:
    return c.claim(c.ops.store.now())


def look_again(c: Claimer, inv: str) -> None:
    """The claimer forgets what it read behind ``inv``'s ticket (as after its backoff)."""
    key = c.ops.keys.ticket_of_id(inv)
    assert key is not None
    c.forget(key)


# -- the whole path, on every tier ------------------------------------------------------------


def test_fan_in_hands_the_parents_ids_and_results_in_parent_order(q: Any) -> None:
    sq, tot = q.udf(square), q.udf(total)
    parents = sq.map([3, 1, 2])
    by_ids = tot.fan_in(parents, extra=7)
    by_results = tot.fan_in(list(reversed(parents)), 5, _results=True)
    assert drain(q, jobs=5) == 5
    assert q.result(by_ids) == [parents, 7]
    assert q.result(by_results) == [[4, 1, 9], 5]
    child = q.get(by_results)
    assert child.v == 2 and child.after_done == 3 and child.after_pass == "results"


def test_a_failed_parent_kills_its_children_and_theirs_naming_the_parent(q: Any) -> None:
    ok, bad = q.udf(square).submit(2), q.udf(boom).submit(_max_attempts=1)
    child = q.udf(total).submit([], _after=[ok, bad])
    grandchild = q.udf(total).submit([], _after=[child])
    # the two parents run; the worker stays (and kills) while the children wait on them
    assert drain(q) == 2
    rec = q.get(child)
    assert rec.state == "killed" and rec.attempt == 0 and rec.after_done == 1
    with pytest.raises(Killed) as err:
        q.result(child)
    assert err.value.remote_type == "ParentFailed"
    assert f"parent {bad} failed" in err.value.remote_message
    assert f"parent {child} was killed" in q.get(grandchild).error["message"]
    tickets = {info.key for info in q.plane.ops("default").tickets()}
    assert not {q.plane.ops("default").keys.ticket_of_id(i) for i in (child, grandchild)} & tickets


def test_after_failure_run_runs_the_child_once_every_parent_ended(q: Any) -> None:
    ok, bad = q.udf(square).submit(3), q.udf(boom).submit(_max_attempts=1)
    child = q.udf(total).fan_in([ok, bad], _results=True, _after_failure="run")
    assert drain(q, jobs=3) == 3
    assert q.result(child) == [[9, None], 0]  # a parent that did not succeed: None


def test_a_cancelled_or_unknown_parent_ends_the_child(q: Any) -> None:
    parent = q.udf(square).submit(1)
    q.cancel(parent)
    ghost = new_id()  # an id nobody submitted
    cancelled = q.udf(total).submit([], _after=[parent])
    unknown = q.udf(total).submit([], _after=[ghost])
    assert drain(q) == 0
    assert f"parent {parent} was killed" in q.get(cancelled).error["message"]
    assert f"parent {ghost} was not found" in q.get(unknown).error["message"]


def test_parents_in_other_queues_are_found_by_id(q: Any) -> None:
    elsewhere = q.udf(square, queue="maps").map([1, 2])  # found by the id index
    default = q.udf(square).submit(3)  # the default queue has no index entry
    child = q.udf(total, queue="reduce").fan_in([*elsewhere, default], _results=True)
    assert drain(q, jobs=4, queues=["maps", "default", "reduce"]) == 4
    assert q.result(child) == [[1, 4, 9], 0]


def test_a_producer_that_exited_leaves_ids_another_process_can_depend_on(q: Any) -> None:
    first = make_plane(q.store)  # the producer of the parents, gone after this
    parents = first.udf(square, queue="maps").map([4, 5])
    del first
    second = make_plane(q.store)  # knows only the ids
    child = second.udf(total).fan_in(parents, _results=True)
    del second
    worker = make_plane(q.store)
    worker.udf(square, queue="maps")
    worker.udf(total)
    assert drain(worker, jobs=3, queues=["maps", "default"]) == 3
    assert make_plane(q.store).result(child) == [[16, 25], 0]


def test_map_gives_every_call_the_same_parents(q: Any) -> None:
    gate = q.udf(square).submit(2)
    children = q.udf(total).map([[1], [2]], _after=[gate])
    assert all(q.get(c).after == (gate,) for c in children)
    assert drain(q, jobs=3) == 3
    assert [q.result(c) for c in children] == [[[1], 0], [[2], 0]]


def test_rerunning_a_failed_parent_then_its_killed_child_runs_the_child(q: Any) -> None:
    bad = q.udf(square).submit(6)
    ops = q.plane.ops("default")
    c = Claimer(ops, "w")
    held = claim(c)
    assert held is not None and held.record.id == bad
    fail(ops, held)
    child = q.udf(total).fan_in([bad], _results=True)
    assert claim(c) is None and q.get(child).state == "killed"
    q.retry(bad)
    q.retry(child)  # counts parents from where it stopped: at the parent that failed
    assert drain(q, jobs=2) == 2
    assert q.result(child) == [[36], 0]


# -- never before the parents: claims by hand ------------------------------------------------


def test_a_child_is_claimable_only_once_every_parent_succeeded(q: Any) -> None:
    p1, p2 = q.udf(square).map([1, 2])
    child = q.udf(total).submit([], _after=[p1, p2])
    ops = q.plane.ops("default")
    c = Claimer(ops, "w")
    first, second = claim(c), claim(c)
    assert first is not None and second is not None
    assert {first.record.id, second.record.id} == {p1, p2}
    assert claim(c) is None  # both parents running: the child waits
    held = {first.record.id: first, second.record.id: second}
    succeed(ops, held[p1])
    look_again(c, child)
    assert claim(c) is None  # one parent still running
    rec = q.get(child)
    assert rec.state == "queued" and rec.after_done == 1  # the progress mark, for everyone
    succeed(ops, held[p2])
    look_again(c, child)
    got = claim(c)
    assert got is not None and got.record.id == child and got.record.after_done == 2


class Counting(Forwarding):
    """Counts requests by verb and key; ``frozen`` stops its clock (what a claimer
    remembers then stays remembered, however slow the test runs)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.counts: Counter[tuple[str, str]] = Counter()
        self.frozen: float | None = None

    def now(self) -> float:
        return self.inner.now() if self.frozen is None else self.frozen

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self.counts["GET", key] += 1
        return super().get(key, max_bytes)

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        self.counts["PUT", key] += 1
        return super().put(key, data, mode)

    def verbs(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for (verb, _), n in self.counts.items():
            out[verb] += n
        return out


def test_what_looking_at_a_waiting_child_costs() -> None:
    store = Counting(MemoryStore())
    q = make_plane(store)
    parent = q.udf(square, queue="maps").submit(3)
    child = q.udf(total, queue="reduce").submit([], _after=[parent])
    maps, reduce = q.plane.ops("maps"), q.plane.ops("reduce")
    held = claim(Claimer(maps, "a"))
    assert held is not None
    c = Claimer(reduce, "b")
    store.frozen = store.now()
    store.counts.clear()
    assert claim(c) is None
    # the child's ticket; the parent's record looked for in the child's queue and in the
    # default queue, then the id index, then its record in its own queue
    assert store.verbs() == Counter(GET=5)
    store.counts.clear()
    assert claim(c) is None
    assert store.verbs() == Counter()  # remembered: no request at all until its backoff
    look_again(c, child)
    store.counts.clear()
    assert claim(c) is None
    assert store.verbs() == Counter(GET=2)  # the child's ticket and the parent's record
    succeed(maps, held)
    look_again(c, child)
    store.counts.clear()
    got = claim(c)
    assert got is not None and got.record.id == child
    assert store.verbs() == Counter(GET=2, PUT=1)  # the same, and the claim


def test_a_parent_seen_done_is_not_read_again() -> None:
    store = Counting(MemoryStore())
    q = make_plane(store)
    parents = q.udf(square, queue="maps").map([1, 2, 3])
    child = q.udf(total).submit([], _after=parents)
    maps, home = q.plane.ops("maps"), q.plane.ops("default")
    a = Claimer(maps, "a")
    held = [claim(a) for _ in parents]
    succeed(maps, held[0])  # type: ignore[arg-type]
    succeed(maps, held[1])  # type: ignore[arg-type]
    c = Claimer(home, "b")
    assert claim(c) is None
    assert q.get(child).after_done == 2 and q.get(child).v == 2
    store.counts.clear()
    look_again(c, child)
    assert claim(c) is None
    reads = {key for (verb, key), _ in store.counts.items() if verb == "GET"}
    assert not any(parents[0] in key or parents[1] in key for key in reads)
    assert any(parents[2] in key for key in reads)


# -- workers: draining, races --------------------------------------------------------------


def test_a_draining_worker_stays_for_a_child_whose_parent_runs_elsewhere() -> None:
    store = Counting(MemoryStore())
    q = make_plane(store)
    parent = q.udf(square).submit(7)
    child = q.udf(total).fan_in([parent], _results=True)
    ops = q.plane.ops("default")
    held = claim(Claimer(ops, "elsewhere"))  # another worker runs the parent
    assert held is not None
    runs: list[int] = []

    worker = threading.Thread(target=lambda: runs.append(drain(q, idle_exit=0.2)))
    worker.start()
    record = ops.keys.record(parent)
    # two looks at the parent are at least one backoff (0.5 s) apart: longer than idle_exit
    poll(lambda: store.counts["GET", record] >= 2, 30, "the child is looked at twice")
    assert worker.is_alive()
    succeed(ops, held, 49)
    worker.join(30)
    assert runs == [1]
    assert q.result(child) == [[49], 0]


def test_two_claimers_that_find_a_child_ready_claim_it_once(atomic_plane: Any) -> None:
    q = atomic_plane
    parent = q.udf(square).submit(1)
    child = q.udf(total).submit([], _after=[parent])
    ops = q.plane.ops("default")
    a, b = Claimer(ops, "a"), Claimer(ops, "b")
    held = claim(a)
    assert held is not None and held.record.id == parent
    assert claim(a) is None and claim(b) is None  # both saw the child wait
    succeed(ops, held)
    look_again(a, child)
    look_again(b, child)

    got: list[Claimed | None] = []
    start = threading.Barrier(2)

    def race(c: Claimer) -> None:
        start.wait()
        got.append(claim(c))

    threads = [threading.Thread(target=race, args=(c,)) for c in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [g for g in got if g is not None]
    assert len(got) == 2 and len(winners) == 1
    assert q.get(child).state == "running" and q.get(child).attempt == 1


def chain(parts: list[Any], tag: str) -> list[Any]:
    return [tag, parts]


def test_a_dag_under_several_workers_runs_each_child_after_its_parents(atomic_plane: Any) -> None:
    q = atomic_plane
    sq, ch = q.udf(square), q.udf(chain)
    layer1 = sq.map(range(6))
    layer2 = [ch.fan_in(layer1[i : i + 3], f"m{i}") for i in (0, 3)]
    top = ch.fan_in(layer2, "top", _results=True)
    bad = q.udf(boom).submit(_max_attempts=1)
    orphan = ch.fan_in([layer1[0], bad], "orphan")

    counts: list[int] = []
    workers = [
        threading.Thread(target=lambda: counts.append(drain(q, concurrency=2, idle_exit=2.0)))
        for _ in range(2)
    ]
    for w in workers:
        w.start()
    poll(lambda: q.get(top).terminal and q.get(orphan).terminal, 60, "the DAG ends")
    for w in workers:
        w.join(60)
    assert sum(counts) == 6 + 2 + 1 + 1  # every body once: squares, two merges, top, boom
    assert q.result(top) == ["top", [["m0", layer1[:3]], ["m3", layer1[3:]]]]
    assert q.get(orphan).state == "killed"
    for child, parents in [(layer2[0], layer1[:3]), (layer2[1], layer1[3:]), (top, layer2)]:
        rec = q.get(child)
        assert rec.attempt == 1
        assert all(rec.started_at >= q.get(p).finished_at for p in parents)  # type: ignore[operator]


# -- interleavings, made exact with a gate ---------------------------------------------------


def test_a_parent_that_ends_while_the_child_is_judged_is_counted_at_the_next_look(
    atomic_store: Store,
) -> None:
    gate = Gate(atomic_store)
    q = make_plane(gate)
    p1, p2 = q.udf(square, queue="maps").map([1, 2])
    child = q.udf(total).submit([], _after=[p1, p2])
    maps, home = q.plane.ops("maps"), q.plane.ops("default")
    x = Claimer(maps, "x")
    h1, h2 = claim(x), claim(x)
    assert h1 is not None and h2 is not None
    succeed(maps, h1)
    # the judge stops right after it read p2 as running; p2 then succeeds
    trap = gate.trap("GET", lambda k: k == maps.keys.record(p2), "judge", after=True)
    j = Claimer(home, "j")
    judging = Run("judge", lambda: claim(j))
    trap.wait()
    succeed(maps, h2)
    trap.go.set()
    assert judging.result() is None  # judged on what it read: still waiting
    rec = q.get(child)
    assert rec.state == "queued" and rec.after_done == 1
    look_again(j, child)
    got = claim(j)
    assert got is not None and got.record.id == child and got.record.after_done == 2


def test_a_kill_that_loses_to_a_claim_is_a_clean_miss(atomic_store: Store) -> None:
    gate = Gate(atomic_store)
    q = make_plane(gate)
    parent = q.udf(square, queue="maps").submit(5)
    child = q.udf(total).submit([], _after=[parent])
    maps, home = q.plane.ops("maps"), q.plane.ops("default")
    x = Claimer(maps, "x")
    held = claim(x)
    assert held is not None
    fail(maps, held)
    # claimer a saw the parent failed and is about to kill the child: it stops before its write
    trap = gate.trap("PUT", lambda k: k == home.keys.record(child), "a")
    a = Claimer(home, "a")
    killing = Run("a", lambda: claim(a))
    trap.wait()
    q.retry(parent)  # meanwhile the parent runs again and succeeds,
    again = claim(x)
    assert again is not None and again.record.id == parent
    succeed(maps, again)
    got = claim(Claimer(home, "b"))  # and another claimer takes the child
    assert got is not None and got.record.id == child
    trap.go.set()
    assert killing.result() is None  # its kill lost: nothing written, nothing dropped
    rec = q.get(child)
    assert rec.state == "running" and rec.lease is not None and rec.lease.worker == "b"
    assert home.keys.ticket_of_id(child) in {i.key for i in home.tickets()}


def test_a_fan_in_in_a_body_process_gets_the_results_too(tmp_path: Any) -> None:
    q = make_plane(LocalStore(str(tmp_path / "store")))
    parents = q.udf(jobs.add_one).map([1, 2])
    child = q.udf(jobs.echo).fan_in(parents, "tail", _results=True, key="k")
    assert drain(q, jobs=3, isolation="process") == 3
    assert q.result(child) == {"args": ([2, 3], "tail"), "kwargs": {"key": "k"}}


HOSTILE = {
    "after": "not a list",
    "after_done": 5,  # past its one parent: claimable before it
    "after_failure": "ignore",
    "after_pass": "everything",
}


def test_hostile_dependency_fields_fail_that_record_and_work_goes_on(atomic_store: Store) -> None:
    q = make_plane(atomic_store)
    parent = new_id()  # never submitted: a child waiting for it would be killed, not run
    bad = {}
    for field, value in HOSTILE.items():
        inv = new_id()
        fields = {"after": [parent], field: value, "v": 2}
        put_by_hand(q, inv, msgpack.packb(handmade(q, inv, **fields), use_bin_type=True))
        bad[inv] = field
    good = q.udf(jobs.add_one).map(range(3))
    assert drain(q) == 3
    assert [q.result(i) for i in good] == [1, 2, 3]
    for inv, field in bad.items():
        rec = q.get(inv)
        assert rec.state == "failed" and rec.error["type"] == "CorruptRecord", field
        assert field in rec.error["message"]
