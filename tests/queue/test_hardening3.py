"""Hardening III (issue 31): outcome writes that survive a bad minute of the store, claims
that stall through gc, and producers that fill the claim scan with tickets never due.

Each test is named after its scenario and was seen to fail on the code before its fix.
Nothing sleeps to synchronise: stalls are made by a store wrapper that runs the racing
party's whole story inside the stalled request, and clocks are moved by hand.
"""

from __future__ import annotations

from typing import Any

import pytest

import lakeshore as dls
from lakeshore.errors import StoreUnavailable
from lakeshore.model.record import Record
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.gc import collect
from lakeshore.protocol.steps import CLAIM_FENCE_S, QueueOps
from lakeshore.store import MemoryStore, PutMode
from lakeshore.store.base import OVERWRITE
from tests import jobs
from tests.conftest import make_plane
from tests.forwarding import Forwarding


def drain(q: Any, n: int = 1, **kw: Any) -> None:
    kw.setdefault("isolation", "thread")
    kw.setdefault("idle_exit", 0.5)
    kw.setdefault("max_poll_s", 0.02)
    dls.run_worker(q, max_jobs=n, **kw)


# -- finding 5: one failed outcome write does not throw a finished result away ------------


class LosesOneOutcome(Forwarding):
    """Fails the first terminal write of a record with ``StoreUnavailable`` (what the S3
    store raises once its own retries are spent): before it reaches the store, or after it
    landed (its answer lost)."""

    def __init__(self, inner: MemoryStore, landed: bool) -> None:
        super().__init__(inner)
        self.landed = landed
        self.failed = 0

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        terminal = key.endswith("/record") and mode.name == "if_match" and not self.failed
        if terminal and Record.from_bytes(data).terminal:
            self.failed += 1
            if self.landed:
                self.inner.put(key, data, mode)
            raise StoreUnavailable(f"put {key}", "the store kept failing", "try later")
        return self.inner.put(key, data, mode)


@pytest.mark.parametrize("landed", [False, True], ids=["lost-before", "landed-unseen"])
def test_an_outcome_write_that_fails_once_is_sent_again_within_the_lease(
    landed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    store = LosesOneOutcome(MemoryStore(), landed)
    q = make_plane(store, lease_s=30.0)
    inv = q.udf(jobs.add_one).submit(41)
    with caplog.at_level("INFO", logger="lakeshore.worker"):
        drain(q)
    # the worker knows its write landed: not "fenced", not "could not be concluded"
    assert f"{inv} attempt 1 -> succeeded" in caplog.text
    assert store.failed == 1
    rec = q.get(inv)
    assert rec.state == "succeeded" and rec.attempt == 1  # not LeaseExpired, not run again
    assert q.result(inv) == 42


# -- finding 2: a claim that stalls through gc never runs the body twice ------------------


class StallsBeforeCreate(Forwarding):
    """Runs ``meanwhile`` once, inside the first create of a ``<id>/record``: the claimer
    has read the full ticket and is about to write, and the whole story of another worker
    and gc happens before its request reaches the store."""

    def __init__(self, inner: MemoryStore, meanwhile: Any) -> None:
        super().__init__(inner)
        self.meanwhile = meanwhile
        self.stalled = False

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        if key.endswith("/record") and mode.name == "create" and not self.stalled:
            self.stalled = True
            self.meanwhile()
        return self.inner.put(key, data, mode)


class Ticks:
    """A monotonic clock moved by hand, and a sleep that moves it."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_a_claim_that_stalls_while_the_invocation_finishes_and_is_collected_does_not_run_it_again(
    tmp_path: Any,
) -> None:
    inner = MemoryStore()
    q = make_plane(inner)
    marker = str(tmp_path / "runs")
    inv = q.udf(jobs.once_marker).submit(marker)
    ops = q.ops("default")
    ticks, gc_ticks = Ticks(), Ticks()

    def another_worker_and_gc() -> None:
        drain(q)  # W claims, runs and finishes it; its ticket is deleted when it stops
        assert q.status(inv) == "succeeded"
        report = collect(
            ops, q.settings, 0.0, inner.now() + 1, ticks=gc_ticks, sleep=gc_ticks.sleep
        )
        assert report.expired == [inv]
        ticks.t += 10 * CLAIM_FENCE_S  # the claimer's request took this long

    stalled = StallsBeforeCreate(inner, another_worker_and_gc)
    claimer = Claimer(QueueOps(stalled, ops.keys), "C", ticks=ticks)
    assert claimer.claim(inner.now()) is None  # its create landed, then it proved no ticket
    assert stalled.stalled
    assert list(inner.list(ops.keys.invocation_prefix(inv))) == []  # nothing brought back
    assert q_result_gone(q, inv)


def q_result_gone(q: Any, inv: str) -> bool:
    with pytest.raises(dls.NotFound):
        q.get(inv)
    return True


def test_gc_deletes_records_no_sooner_than_the_claim_fence_after_it_saw_their_tickets() -> None:
    inner = MemoryStore()
    q = make_plane(inner)
    ids = [q.udf(jobs.add_one).submit(i) for i in range(3)]
    drain(q, 3)
    ops = q.ops("default")
    ticks = Ticks()
    deleted_at: list[float] = []

    class Watch(Forwarding):
        def delete(self, key: str, if_match: str | None = None) -> None:
            if key.endswith("/record"):
                deleted_at.append(ticks.t)
            super().delete(key, if_match)

    watched = QueueOps(Watch(inner), ops.keys)
    listed = ticks.t
    report = collect(watched, q.settings, 0.0, inner.now() + 1, ticks=ticks, sleep=ticks.sleep)
    assert sorted(report.expired) == sorted(ids)
    assert len(deleted_at) == 3 and min(deleted_at) >= listed + CLAIM_FENCE_S
    assert len(ticks.slept) == 1  # one wait for the whole run, not one per invocation
