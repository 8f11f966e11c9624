"""The tickets of reruns: a claimer or gc never drops the ticket of a live rerun, a lookup
racing a claim still finds the invocation, and status counts a rerun once.

Each race is made deterministic with the ``Gate`` store wrapper of ``tests/gating.py`` (one
named thread stopped at an exact request); time is
moved with the claimer's and gc's injected ``now``, never by sleeping.
"""

from __future__ import annotations

from typing import Any

import lakeshore as dls
from lakeshore import codec
from lakeshore.model import lifecycle
from lakeshore.protocol.census import queue_status
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.gc import collect
from lakeshore.protocol.queue_record import QueueSettings
from lakeshore.protocol.steps import QueueOps
from lakeshore.store import MemoryStore
from lakeshore.store.base import CREATE
from tests import jobs
from tests.gating import Gate, Run
from tests.tiers import make_plane


def _finished(q: Any) -> tuple[str, Any]:
    """A succeeded invocation whose ticket is gone; returns its id and its ops."""
    inv = q.udf(jobs.add_one).submit(1)
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    ops = q.plane.ops("default")
    assert q.status(inv) == "succeeded" and list(ops.tickets()) == []
    return inv, ops


def _ticket_alive(q: Any, ops: QueueOps, inv: str) -> bool:
    """The invariant: a live record has the ticket of its life."""
    rec, _ = ops.read(inv)
    assert not rec.terminal
    return any(i.key == ops.ticket_key(rec) for i in ops.tickets())


def test_a_claimer_never_drops_the_ticket_of_a_rerun_that_landed_after_it_read() -> None:
    """A stale ticket of the next life (left by a rerun that died before its compare-and-
    swap) is old; a claimer lists it and reads the record (still the earlier life). Then an
    operator reruns: the ticket is rewritten, the record moves, the rerun checks the ticket
    is there. The claimer, deciding from what it read, must not delete the new ticket."""
    gate = Gate(MemoryStore())
    q = make_plane(gate)
    inv, ops = _finished(q)
    rec, _ = ops.read(inv)
    ops.put_marker(lifecycle.rerun(rec, q.store.now()))  # a rerun that died after its ticket
    stale = ops.keys.ticket(rec.priority, inv, 1)
    claimer = Claimer(QueueOps(gate, ops.keys), "w2")
    trap = gate.trap("GET", lambda k: k == ops.keys.record(inv), "claimer", after=True)
    later = q.store.now() + 100  # the stale ticket is well past the rerun grace
    run = Run("claimer", lambda: claimer.claim(later))
    trap.wait()
    assert q.retry(inv) == 2  # the operator's rerun runs to its end meanwhile
    trap.go.set()
    run.result()
    assert [i.key for i in ops.tickets()] == [stale]
    assert _ticket_alive(q, ops, inv), "the queued rerun lost its ticket: it never runs"


def test_a_junk_ticket_at_a_rerun_key_is_not_dropped_over_the_rerun() -> None:
    """A producer may create tickets: one at ``<id>.1`` of a finished invocation holding
    junk. A claimer reads it and decides to drop it; a rerun overwrites it meanwhile. The
    drop must not take the rerun's ticket with it."""
    gate = Gate(MemoryStore())
    q = make_plane(gate)
    inv, ops = _finished(q)
    rec, _ = ops.read(inv)
    junk = ops.keys.ticket(rec.priority, inv, 1)
    q.store.put(junk, codec.encode({"not": "a record"}) + b"x" * 200, CREATE)
    claimer = Claimer(QueueOps(gate, ops.keys), "w2")
    trap = gate.trap("GET", lambda k: k == junk, "claimer", after=True)
    run = Run("claimer", lambda: claimer.claim(q.store.now()))
    trap.wait()
    assert q.retry(inv) == 2
    trap.go.set()
    run.result()
    assert _ticket_alive(q, ops, inv), "the queued rerun lost its ticket: it never runs"


def test_gc_never_deletes_the_ticket_of_a_rerun_in_flight() -> None:
    """gc lists the tickets, reads the expired record, then deletes its tickets and the
    record. A rerun whose ticket is already there and whose compare-and-swap (and ticket
    check) land between gc's read and gc's ticket delete must keep its ticket: gc's record
    delete then fails, so the invocation is live."""
    gate = Gate(MemoryStore())
    q = make_plane(gate)
    inv, ops = _finished(q)
    rec, etag = ops.read(inv)
    nxt = lifecycle.rerun(rec, q.store.now())
    ops.put_marker(nxt)  # `lakeshore retry`, step 2: the new life's ticket
    new = ops.ticket_key(nxt)
    trap = gate.trap("GET", lambda k: k == ops.keys.record(inv), "gc", after=True)
    gc_ops = QueueOps(gate, ops.keys)
    settings = QueueSettings(gate, ops.keys.ns)
    run = Run("gc", lambda: collect(gc_ops, settings, 0, q.store.now() + 10))
    trap.wait()  # gc has listed the tickets and read the terminal record
    ops.cas(nxt, etag)  # step 3: the record is queued in life 1
    assert [i.key for i in ops.tickets()] == [new]  # step 4: the ticket is there
    trap.go.set()
    run.result()
    assert q.status(inv) == "queued"
    assert _ticket_alive(q, ops, inv), "gc deleted a live invocation's ticket"


def test_a_lookup_racing_a_claim_and_completion_finds_the_invocation() -> None:
    """``read`` tries ``<id>/record`` and then the ticket. Between the two GETs the invocation can
    be claimed, run and its ticket deleted: the lookup must still find it."""
    gate = Gate(MemoryStore())
    q = make_plane(gate)
    inv = q.udf(jobs.add_one).submit(1)
    ops = q.plane.ops("default")
    trap = gate.trap("GET", lambda k: k == ops.keys.record(inv), "reader", after=True)
    reader = make_plane(gate)  # another process: it never saw the submit
    run = Run("reader", lambda: reader.status(inv))
    trap.wait()
    held = Claimer(ops, "w1").claim(q.store.now())
    assert held is not None and held.record.id == inv
    ops.finish(held, lifecycle.succeed(held.record, held.token, None, q.store.now()))
    assert list(ops.tickets()) == []
    trap.go.set()
    assert run.result() == "succeeded"


def test_status_counts_a_rerun_once_while_its_earlier_ticket_waits() -> None:
    """A rerun's ticket (``<id>.1``) and the earlier life's ticket still waiting for a
    worker's batch delete are two tickets of one invocation: it is one queued invocation."""
    q = make_plane(MemoryStore())
    inv, ops = _finished(q)
    rec, _ = ops.read(inv)
    ops.put_marker(rec)  # life 0's ticket, its batch delete not sent yet
    q.retry(inv)
    assert len(list(ops.tickets())) == 2
    st = queue_status(ops, q.store.now(), recent=0)
    assert (st.queued, st.running) == (1, 0)
