"""``dreamlake.lakeshore``: a handle of an attempt whose lease ran out ends nothing, also when
the same ``SyncQueue`` object claimed the id again (issue 31, finding 4).

The lease is made to run out by moving the store's clock, never by sleeping past it.
"""

from __future__ import annotations

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.dispatch import DispatchError
from lakeshore.store import MemoryStore
from tests.forwarding import Forwarding


class Skewed(Forwarding):
    """A memory store whose clock the test moves forward (a consumer stalled that long)."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.offset = 0.0

    def now(self) -> float:
        return self.inner.now() + self.offset


@pytest.fixture
def skewed() -> Skewed:
    return Skewed()


@pytest.fixture
def q(skewed: Skewed) -> dls.SyncQueue:
    return dls.SyncQueue("gpu", dispatch=dls.Dispatch(":memory:", store=skewed, lease_s=10.0))


def _reclaimed(q: dls.SyncQueue, skewed: Skewed) -> tuple[dls.Job, dls.Job]:
    q.submit({"x": 1})
    old = q.claim()
    assert old is not None and old.attempt == 1
    skewed.offset += 11.0  # the consumer stalled past its 10 s lease
    new = q.claim()  # the expired attempt is settled and the id claimed again at once
    assert new is not None and new.id == old.id and new.attempt == 2
    return old, new


@pytest.mark.parametrize("verb", ["ack", "nack", "post"])
def test_an_older_handle_of_a_reclaimed_job_is_refused_and_the_newer_claim_stays_running(
    q: dls.SyncQueue, skewed: Skewed, verb: str
) -> None:
    old, new = _reclaimed(q, skewed)
    with pytest.raises(DispatchError, match="not running under worker"):
        if verb == "ack":
            q.ack(old, {"y": "stale"})
        elif verb == "nack":
            q.nack(old, error="stale", retry=False)
        else:
            q.post(old, "stale")
    assert new.ended == "" and old.ended == ""
    rec = q.dispatch.get(new.id)
    assert rec.state == "running" and rec.attempt == 2
    q.ack(new, {"y": "fresh"})
    assert q.result(new.id, timeout=5) == {"y": "fresh"}


def test_the_id_of_a_reclaimed_job_ends_the_newer_claim(q: dls.SyncQueue, skewed: Skewed) -> None:
    old, new = _reclaimed(q, skewed)
    q.ack(old.id, "by id")  # an id names the claim this object holds now
    assert new.ended == "succeeded"
    assert q.result(new.id, timeout=5) == "by id"
    with pytest.raises(DispatchError):
        q.ack(old, "again")


def test_a_job_claimed_by_another_queue_object_is_refused(q: dls.SyncQueue) -> None:
    other = dls.SyncQueue("gpu", dispatch=q.dispatch)
    q.submit(1)
    job = q.claim()
    assert job is not None
    with pytest.raises(DispatchError, match="not running under worker"):
        other.ack(job, "not mine")
    q.ack(job, "mine")
    assert q.result(job.id, timeout=5) == "mine"
