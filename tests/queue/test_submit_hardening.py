"""Issue 15, items 3, 4, 5 and 10, the rate-limit message and hostile key objects: a submit
that returned an id has a runnable invocation, gc racing a keyed resubmit loses nothing, admission
never lets a slow submit exceed ``max_depth``.

Races are made deterministic with :class:`Gate`, a store wrapper that stops one named thread
at an exact request until the test lets it go; time is moved with injected clocks (the
claimer's and gc's ``now``, a store clock set ahead), never by sleeping.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import lakeshore as dls
import lakeshore.protocol.admission as adm
from lakeshore import codec
from lakeshore.keys import QueueKeys, new_id
from lakeshore.model import lifecycle
from lakeshore.model.record import Blob, Record
from lakeshore.protocol import idempotency
from lakeshore.protocol.admission import admit
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.gc import collect
from lakeshore.protocol.steps import ORPHAN_GRACE_S, QueueOps
from lakeshore.store import MemoryStore, PutMode, Store
from lakeshore.store.base import OVERWRITE
from tests import jobs
from tests.gating import Gate, Run
from tests.tiers import make_plane, record_key


@pytest.fixture
def gate(atomic_store: Store) -> Gate:
    return Gate(atomic_store)


def _live(q: Any, queue: str = "default") -> list[Record]:
    """The queue's live records: ``<id>/record``, or the ticket of one nothing moved yet."""
    ops = q.plane.ops(queue)
    ids = []
    for info in list(q.store.list(ops.keys.base + "/")):
        if info.key.endswith("/record"):
            ids.append(info.key.rsplit("/", 2)[1])
        elif info.key.startswith(ops.keys.tickets_prefix):
            ids.append(info.key.rsplit("/", 1)[1])
    out = []
    for inv in sorted(set(ids)):
        rec = Record.from_bytes(q.store.get(record_key(ops, inv))[0])
        if not rec.terminal:
            out.append(rec)
    return out


def _ticketed(q: Any, rec: Record) -> bool:
    ops = q.plane.ops(rec.queue)
    try:
        ops.store.get(ops.keys.ticket(rec.priority, rec.id))
    except dls.NotFound:
        return False
    return True


def _runnable(q: Any, inv: str) -> Record:
    """The invocation is live, has its ticket and its arguments."""
    rec = q.get(inv)
    assert rec.state == "queued", rec.state
    assert _ticketed(q, rec), "a queued record without its ticket: no worker will find it"
    q.plane.ops(rec.queue).get_blob(rec.args, "arguments")  # raises if the spilled args are gone
    return rec


def _finish(q: Any, n: int = 1) -> None:
    dls.run_worker(q, isolation="thread", max_jobs=n, idle_exit=2.0, max_poll_s=0.02)


# -- item 3: a slow submit loses its invocation ----------------------------------------------


def test_a_submit_stalled_before_its_ticket_longer_than_every_grace_still_runs(
    gate: Gate,
) -> None:
    # The submit's one write is its ticket: before it lands there is nothing for a claimer
    # or gc to judge (inline arguments: no folder either), however long the stall.
    q = make_plane(gate)
    f = q.udf(jobs.add_one)
    stall = gate.trap("PUT", lambda k: "/_tickets/" in k, "slow")
    slow = Run("slow", lambda: f.submit(41))
    stall.wait()  # about to write its ticket
    ops = q.plane.ops("default")
    later = q.store.now() + 2 * ORPHAN_GRACE_S  # two minutes on, in the store's clock
    claimer = Claimer(QueueOps(gate.inner, ops.keys), "w")
    assert claimer.claim(later) is None
    report = collect(ops, q.plane.settings, 0.0, later)
    assert (report.orphans, report.expired, report.objects) == ([], [], [])
    stall.go.set()
    inv = slow.result()
    _runnable(q, inv)  # the id submit returned is an invocation some worker will run
    [ticket] = list(ops.tickets())
    # a claimer whose clock runs two graces ahead claims it: a fresh ticket is no orphan
    held = claimer.claim(ticket.last_modified + 2 * ORPHAN_GRACE_S)
    assert held is not None and held.record.id == inv
    claimer.ops.finish(held, lifecycle.release(held.record, held.token, q.store.now()))
    _finish(q)
    assert q.result(inv, timeout=30) == 42


def test_a_submit_is_one_put(gate: Gate) -> None:
    q = make_plane(gate)
    f = q.udf(jobs.add_one)
    f.submit(0)  # the queue settings are read once per producer
    gate.counts.clear()
    f.submit(1)
    assert gate.counts == Counter(PUT=1)  # the ticket, holding the record
    gate.counts.clear()
    f.submit(1, _key="k")
    assert gate.counts == Counter(PUT=2)  # key, ticket
    gate.counts.clear()
    f.submit(1, _key="k")
    # refused key create, key read, and the record it names (an id is returned only once
    # its ticket exists): <id>/record, missing before a claim, then the ticket
    assert gate.counts == Counter(PUT=1, GET=3)


# -- item 4: gc racing a keyed resubmit ---------------------------------------------------

# Where gc stops while a resubmit with the same key runs to its end.
GC_PAUSES = {
    "after deleting the record": ("DELETE", lambda k: k.endswith("/record"), True),
    "before reading the key": ("GET", lambda k: "/_keys/" in k, False),
    "before deleting the key": ("DELETE", lambda k: "/_keys/" in k, False),
}


def _expired_keyed(q: Any, f: Any, payload: bytes) -> str:
    first = f.submit(payload, _key="k")
    _finish(q)
    assert q.status(first) == "succeeded"
    return str(first)


def _gc(q: Any) -> Any:
    return collect(q.plane.ops("default"), q.plane.settings, 0.0, q.store.now() + 1)


@pytest.mark.parametrize("pause", list(GC_PAUSES))
def test_gc_racing_a_keyed_resubmit_leaves_one_runnable_invocation(
    gate: Gate, monkeypatch: pytest.MonkeyPatch, pause: str
) -> None:
    q = make_plane(gate, spill_bytes=64)
    f = q.udf(jobs.size_of)
    payload = b"x" * 1000  # spilled: the arguments are an object of their own
    first = _expired_keyed(q, f, payload)
    monkeypatch.setattr(idempotency, "KEY_REPAIR_GRACE_S", -1.0)  # the key is old enough to repair
    verb, match, after = GC_PAUSES[pause]
    stop = gate.trap(verb, match, "gc", after)
    gc = Run("gc", lambda: _gc(q))
    stop.wait()
    again = f.submit(payload, _key="k")  # runs to its end while gc is stopped
    stop.go.set()
    assert first in gc.result().expired
    _runnable(q, again)
    assert f.submit(payload, _key="k") == again  # the key names it: no second invocation
    assert [r.id for r in _live(q)] == [again]
    _finish(q)
    assert q.result(again, timeout=30) == 1000


def test_gc_finishing_while_a_keyed_resubmit_is_between_its_reads_and_writes(
    gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_plane(gate, spill_bytes=64)
    f = q.udf(jobs.size_of)
    payload = b"y" * 1000
    first = _expired_keyed(q, f, payload)
    monkeypatch.setattr(idempotency, "KEY_REPAIR_GRACE_S", -1.0)
    gc_stop = gate.trap("DELETE", lambda k: k.endswith("/record"), "gc", after=True)
    gc = Run("gc", lambda: _gc(q))
    gc_stop.wait()  # the record is gone, the key still names it
    # the resubmit reads the key, finds no record, and stops before writing anything
    resub_stop = gate.trap("GET", lambda k: k.endswith(f"{first}/record"), "resub", after=True)
    resub = Run("resub", lambda: f.submit(payload, _key="k"))
    resub_stop.wait()
    gc_stop.go.set()
    assert first in gc.result().expired  # gc removed everything, the key too
    resub_stop.go.set()
    again = resub.result()
    _runnable(q, again)
    assert f.submit(payload, _key="k") == again
    assert [r.id for r in _live(q)] == [again]
    _finish(q)
    assert q.result(again, timeout=30) == 1000


def test_gc_sweeping_the_folder_of_a_slow_submit_fences_it_out(gate: Gate) -> None:
    q = make_plane(gate, spill_bytes=64)
    f = q.udf(jobs.size_of)
    stall = gate.trap("PUT", lambda k: "/_tickets/" in k, "slow")
    slow = Run("slow", lambda: f.submit(b"z" * 1000))
    stall.wait()  # spilled arguments written, no ticket
    # gc, 2 minutes later in the store's clock: an orphaned folder
    report = collect(
        q.plane.ops("default"), q.plane.settings, 0.0, q.store.now() + 2 * ORPHAN_GRACE_S
    )
    [orphan] = report.orphans
    stall.go.set()
    with pytest.raises(dls.Conflict, match="abandoned"):
        slow.result()  # no id returned: nothing was submitted
    assert _live(q) == []
    assert q.get(orphan).error["type"] == "SubmitAbandoned"  # type: ignore[index]


# -- item 5: key repair after a crash that left spilled arguments -------------------------


def test_key_repair_after_a_crash_that_left_spilled_arguments(atomic_plane: Any) -> None:
    q = make_plane(atomic_plane.store, spill_bytes=64)
    ops = q.plane.ops("default")
    f = q.udf(jobs.size_of)
    crashed = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    old = q.store.now() - 3600  # the key was taken an hour ago
    q.store.put(ops.keys.idem("k"), codec.encode({"id": crashed, "input_hash": "?", "at": old}))
    q.store.put(ops.keys.args(crashed), codec.encode(((b"o" * 500,), {})))  # then it died
    inv = f.submit(b"n" * 700, _key="k")
    _runnable(q, inv)
    assert f.submit(b"n" * 700, _key="k") == inv
    _finish(q)
    assert q.result(inv, timeout=30) == 700  # the resubmitter's arguments


# -- item 10: max_depth exceeded, and a queue that refuses forever ------------------------


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_slow_submit_whose_slot_was_repaired_never_exceeds_max_depth(
    gate: Gate, monkeypatch: pytest.MonkeyPatch, keyed: bool
) -> None:
    q = make_plane(gate)
    q.configure("adm", max_depth=1, on_full="reject", rate_limit="1000/h")
    ops = q.plane.ops("adm")
    f = q.udf(queue="adm")(jobs.add_one)
    options = {"_key": "k"} if keyed else {}
    stall = gate.trap("PUT", lambda k: "/_tickets/" in k, "slow")  # slot taken, no record
    slow = Run("slow", lambda: f.submit(1, **options))
    stall.wait()
    monkeypatch.setattr(adm, "SLOT_REPAIR_AGE_S", -1.0)  # the slot looks 30 s old
    # a worker's repair frees the slot of the slow submit, which has no record
    assert adm.repair_slots(ops, q.store.now()) == [ops.keys.slot(0)]
    other = f.submit(2)
    stall.go.set()
    with pytest.raises((dls.Conflict, dls.QueueFull)):
        slow.result()  # never an id whose record is a tombstone
    assert [r.id for r in _live(q, "adm")] == [other]
    assert len(list(q.store.list(ops.keys.slots_prefix))) == 1
    assert len(list(q.store.list(ops.keys.rate_prefix))) == 1  # the slow one gave its back
    _finish(q)
    assert q.result(other, timeout=30) == 3
    assert f.submit(3)  # and the queue takes work again


def test_a_slot_with_garbage_in_it_does_not_block_the_queue_forever(
    q: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q.configure("adm", max_depth=1)
    ops = q.plane.ops("adm")
    q.store.put(ops.keys.slot(0), b"\xff\xfe not a slot")
    monkeypatch.setattr(adm, "SLOT_REPAIR_AGE_S", -1.0)
    with pytest.raises(dls.QueueFull):  # a producer does not read slots
        q.udf(queue="adm")(jobs.add_one).submit(1)
    assert adm.repair_slots(ops, q.store.now()) == [ops.keys.slot(0)]  # a worker's repair
    assert q.udf(queue="adm")(jobs.add_one).submit(1)


def test_a_leaked_slot_of_a_missing_record_is_fenced_then_freed(
    q: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q.configure("adm", max_depth=1)
    ops = q.plane.ops("adm")
    dead = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    q.store.put(ops.keys.slot(0), f"{dead} x".encode())  # a submitter died here
    monkeypatch.setattr(adm, "SLOT_REPAIR_AGE_S", -1.0)
    assert adm.repair_slots(ops, q.store.now()) == [ops.keys.slot(0)]  # a worker's repair
    assert q.udf(queue="adm")(jobs.add_one).submit(1)
    rec, _ = ops.read(dead)  # a late submit of that id could not publish now
    assert rec.state == "failed" and rec.error["type"] == "SubmitAbandoned"  # type: ignore[index]


# -- the rate-limit message ---------------------------------------------------------------


def test_a_refused_submit_names_the_rate_limit_with_its_period(plane: Any) -> None:
    ops = plane.plane.ops("adm")
    at = 1_000_000.5  # one window for every call
    for i in range(5):
        admit(ops, f"i{i}", None, (5, 1), "reject", 0.0, lambda: at)
    with pytest.raises(dls.QueueFull) as err:
        admit(ops, "i5", None, (5, 1), "reject", 0.0, lambda: at)
    assert "rate limit reached (5/s)" in str(err.value)
    assert "rate_limit = 5" not in str(err.value)
    e = err.value
    assert (e.queue, e.reason, e.limit, e.limit_text) == ("adm", "rate_limit", 5, "5/s")
    with pytest.raises(dls.QueueFull, match=r"rate limit reached \(6/min\)"):
        for i in range(7):
            admit(ops, f"m{i}", None, (6, 60), "reject", 0.0, lambda: at)


def test_a_refused_submit_names_max_depth(q: Any) -> None:
    q.configure("adm", max_depth=1)
    f = q.udf(queue="adm")(jobs.add_one)
    f.submit(1)
    with pytest.raises(dls.QueueFull, match=r"the queue is full \(max_depth = 1\)") as err:
        f.submit(2)
    assert (err.value.reason, err.value.limit, err.value.limit_text) == ("max_depth", 1, "1")


def test_an_unknown_submit_option_is_refused_naming_the_valid_ones() -> None:
    store = MemoryStore()
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    with pytest.raises(dls.InvalidArgument, match="unknown option\\(s\\) _prio — the options") as e:
        f.submit(1, _prio=3)
    for name in ("_priority", "_key", "_max_attempts", "_timeout_s", "_deadline_s"):
        assert name in e.value.todo
    with pytest.raises(dls.InvalidArgument, match="_keys, concurrency and progress"):
        f.map([1, 2], _retries=3)
    assert list(store.list("")) == []  # nothing was written
    assert q.get(f.submit(1, _priority=3)).priority == 3  # the spelled-right one still works
    g = q.udf(underscored)  # a parameter named like an option goes by position
    with pytest.raises(dls.InvalidArgument, match="passed by position"):
        g.submit(1, _x=2)
    assert codec.decode(q.plane.ops("default").get_blob(q.get(g.submit(1, 2)).args, "args")) == (
        (1, 2),
        {},
    )


def underscored(a: int, _x: int = 0) -> int:
    return a + _x


# -- hostile idempotency key objects ------------------------------------------------------

HOSTILE_KEYS = {
    "not msgpack": b"\xc1garbage",
    "a list": codec.encode([1, 2]),
    "no id": codec.encode({"input_hash": "?"}),
    "an int id": codec.encode({"id": 5, "input_hash": "?"}),
    "not an id": codec.encode({"id": "../../etc", "input_hash": "?"}),
    "a text time": codec.encode({"id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "at": "soon"}),
    "a bytes hash": codec.encode({"id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "input_hash": b"?"}),
}


@pytest.mark.parametrize("body", list(HOSTILE_KEYS))
@pytest.mark.parametrize("strict", [False, True], ids=["lax", "strict"])
def test_a_hostile_key_object_gives_a_clear_error(q: Any, body: str, strict: bool) -> None:
    ops = q.plane.ops("default")
    q.store.put(ops.keys.idem("k"), HOSTILE_KEYS[body])
    with pytest.raises(dls.StoreError, match="not one lakeshore wrote"):
        q.udf(jobs.add_one).submit(1, _key="k", _strict_key=strict)
    assert _live(q) == []  # nothing was published


@pytest.mark.parametrize("body", list(HOSTILE_KEYS))
def test_gc_keeps_going_past_a_hostile_key_object(q: Any, body: str) -> None:
    f = q.udf(jobs.add_one)
    first = f.submit(1, _key="k")
    _finish(q)
    ops = q.plane.ops("default")
    q.store.put(ops.keys.idem("k"), HOSTILE_KEYS[body])
    assert _gc(q).expired == [first]
    assert q.store.get(ops.keys.idem("k"))[0] == HOSTILE_KEYS[body]  # not ours: left alone


class Skewed(Gate):
    """A Gate whose store clock the test moves forward (for submitters and claimers)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.ahead = 0.0

    def now(self) -> float:
        return self.inner.now() + self.ahead


def test_a_keyed_retry_during_a_stalled_submit_never_gets_an_id_that_will_not_run() -> None:
    # Submitter 1 stalls (or dies) right after taking the key. A quick retry with the key
    # must not return that id while it has no record: a later repair abandons it.
    gate = Skewed(MemoryStore())
    q = make_plane(gate)
    f = q.udf(jobs.add_one)
    stall = gate.trap("PUT", lambda k: "/_tickets/" in k, "first")
    first = Run("first", lambda: f.submit(1, _key="k"))
    stall.wait()  # the key is written, nothing else
    gate.ahead = 5.0
    retry = Run("retry", lambda: f.submit(1, _key="k"))  # waits for the record
    gate.ahead = 31.0  # the first submit is judged dead: the key is repaired
    later = f.submit(1, _key="k")
    stall.go.set()
    assert retry.result() == later
    assert first.result() == later  # fenced out, it started over from the key
    assert q.status(later) == "queued"
    assert [i.key.rsplit("/", 1)[1] for i in q.plane.ops("default").tickets()].count(later) == 1


class RetriedCreate(Gate):
    """The ticket's create lands, but its answer is lost and the store's retry meets the
    object it wrote: Conflict (what S3 answers a retried If-None-Match PUT)."""

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        if "/_tickets/" in key and mode.name == "create" and self.counts["TICKET"] == 0:
            self.counts["TICKET"] += 1
            self.inner.put(key, data, mode)
            raise dls.Conflict("put", "exists", "retry")
        return super().put(key, data, mode)


@pytest.mark.parametrize("options", [{}, {"_key": "k"}], ids=["plain", "keyed"])
def test_a_ticket_create_whose_answer_was_lost_still_returns_the_id(
    options: dict[str, Any],
) -> None:
    gate = RetriedCreate(MemoryStore())
    q = make_plane(gate)
    inv = q.udf(jobs.add_one).submit(41, **options)
    assert gate.counts["TICKET"] == 1  # the lost answer happened
    _runnable(q, inv)
    assert [QueueKeys.id_of(i.key) for i in q.plane.ops("default").tickets()] == [inv]
    _finish(q)
    assert q.result(inv, timeout=30) == 42


def test_a_ticket_create_that_meets_a_tombstone_is_refused() -> None:
    # The same Conflict, but the object there is not the one this submit wrote: a tombstone.
    q = make_plane(MemoryStore())
    ops = q.plane.ops("default")
    inv = new_id(5)
    assert ops.fence(inv, q.store.now(), "judged dead")
    args = Blob(inline=codec.encode(((1,), {})))
    rec = Record(id=inv, ns=q.ns, queue="default", fn="tests.jobs:add_one", args=args)
    assert ops.submit(rec) is False
    assert q.get(inv).error["type"] == "SubmitAbandoned"  # type: ignore[index]


def test_a_stalled_keyed_submit_fenced_by_a_tombstone_at_its_ticket_starts_over(
    gate: Gate,
) -> None:
    # gc judges the folder of a keyed submit stalled before its ticket an orphan and fences
    # its id; the submit's ticket create then meets the tombstone, and the submit moves its
    # key to a new id that runs (the caller gets that id, never the fenced one).
    q = make_plane(gate, spill_bytes=64)
    f = q.udf(jobs.size_of)
    ops = q.plane.ops("default")
    stall = gate.trap("PUT", lambda k: "/_tickets/" in k, "slow")
    slow = Run("slow", lambda: f.submit(b"k" * 1000, _key="k"))
    stall.wait()  # key taken, arguments spilled, no ticket
    report = collect(ops, q.plane.settings, 0.0, q.store.now() + 2 * ORPHAN_GRACE_S)
    [fenced] = report.orphans
    assert q.get(fenced).error["type"] == "SubmitAbandoned"  # type: ignore[index]
    stall.go.set()
    inv = slow.result()
    assert inv != fenced
    _runnable(q, inv)
    assert f.submit(b"k" * 1000, _key="k") == inv  # the key names the new id
    assert [r.id for r in _live(q)] == [inv]
    _finish(q)
    assert q.result(inv, timeout=30) == 1000
