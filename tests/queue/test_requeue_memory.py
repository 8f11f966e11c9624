"""A retry (or a release) that the worker's own claimer read halfway: between the ticket's
new marker and the record's compare-and-swap, another slot of the same worker lists the new
ticket and reads the record still running, and remembers to pass the ticket over until the
lease ends. The finishing slot must make its claimer look again after its write, or the
retry waits for the lease: a draining worker (``idle_exit``) even left before it.

Made deterministic with the ``Gate`` store wrapper (one named thread stopped at the
record's write); store time is the store's own, never slept on."""

from __future__ import annotations

from lakeshore.model import lifecycle
from lakeshore.model.record import State
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.steps import QueueOps
from lakeshore.store import MemoryStore
from tests import jobs
from tests.gating import Gate, Run
from tests.tiers import make_plane


def _retry_read_halfway(retry: bool) -> None:
    gate = Gate(MemoryStore())
    q = make_plane(gate)
    inv = q.udf(jobs.add_one, max_attempts=3).submit(1)
    ops = QueueOps(gate, q.plane.ops("default").keys)
    claimer = Claimer(ops, "w1")  # shared by the worker's slots, as run_worker shares it
    held = claimer.claim(gate.now(), lease_s=600)
    assert held is not None and held.record.attempt == 1
    rec = held.record
    now = gate.now()
    if retry:  # a failure retried at once (no backoff)
        final = lifecycle.fail(rec, held.token, {"type": "E", "message": "", "traceback": ""}, now)
        final = final.next_write(not_before=now)
    else:  # a release at a stop
        final = lifecycle.release(rec, held.token, now)
    trap = gate.trap("PUT", lambda k: k == ops.keys.record(inv), "slot-a")
    finishing = Run("slot-a", lambda: ops.finish(held, final))
    trap.wait()  # the marker is written; the record still says running
    assert claimer.claim(gate.now()) is None  # the other slot: running, lease 600 s off
    trap.go.set()
    finishing.result()
    again = claimer.claim(gate.now())
    assert again is not None, "the claimer passed over a queued invocation until its lease end"
    assert again.record.id == inv and again.record.state == State.RUNNING


def test_a_retry_read_halfway_by_another_slot_is_claimed_at_once() -> None:
    _retry_read_halfway(retry=True)


def test_a_release_read_halfway_by_another_slot_is_claimed_at_once() -> None:
    _retry_read_halfway(retry=False)


def test_another_worker_that_read_a_release_halfway_looks_again_within_a_second() -> None:
    """A worker stopping releases its attempt; another worker's poll falls between the new
    marker and the record's write. It must not pass the ticket over until the lease end:
    the releasing worker is leaving, and nobody else would run the invocation till then."""
    gate = Gate(MemoryStore())
    q = make_plane(gate)
    inv = q.udf(jobs.add_one).submit(1)
    ops = QueueOps(gate, q.plane.ops("default").keys)
    leaving, other = Claimer(ops, "w1"), Claimer(QueueOps(gate, ops.keys), "w2")
    held = leaving.claim(gate.now(), lease_s=600)
    assert held is not None
    final = lifecycle.release(held.record, held.token, gate.now())
    trap = gate.trap("PUT", lambda k: k == ops.keys.record(inv), "w1-stop")
    stopping = Run("w1-stop", lambda: ops.finish(held, final))
    trap.wait()
    now = gate.now()
    assert other.claim(now) is None  # running, as far as it can tell
    trap.go.set()
    stopping.result()
    assert other.claim(now + 0.5) is None  # remembered for a moment: no GET per poll
    again = other.claim(now + 1.5)  # not 600 s later
    assert again is not None and again.record.id == inv


def test_a_running_invocation_behind_an_old_marker_is_still_remembered_to_its_lease_end() -> None:
    """The short look applies to fresh markers only: an attempt 2 that runs long behind the
    marker of its retry costs an idle worker no GET per poll."""
    gate = Gate(MemoryStore())
    q = make_plane(gate)
    inv = q.udf(jobs.add_one, max_attempts=3).submit(1)
    ops = QueueOps(gate, q.plane.ops("default").keys)
    first, other = Claimer(ops, "w1"), Claimer(QueueOps(gate, ops.keys), "w2")
    held = first.claim(gate.now(), lease_s=600)
    assert held is not None
    now = gate.now()
    failed = lifecycle.fail(
        held.record, held.token, {"type": "E", "message": "", "traceback": ""}, now
    )
    ops.finish(held, failed.next_write(not_before=now))
    later = now + 60  # the marker of the retry is a minute old
    again = first.claim(later, lease_s=600)
    assert again is not None and again.record.attempt == 2 and again.record.id == inv
    assert other.claim(later) is None  # reads it: running
    gets = gate.counts["GET"]
    assert other.claim(later + 5) is None and gate.counts["GET"] == gets  # passed over unread
