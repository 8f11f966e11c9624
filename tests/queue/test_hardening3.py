"""Hardening III (issue 31): outcome writes that survive a bad minute of the store, claims
that stall through gc, and producers that fill the claim scan with tickets never due.

Each test is named after its scenario and was seen to fail on the code before its fix.
Nothing sleeps to synchronise: stalls are made by a store wrapper that runs the racing
party's whole story inside the stalled request, and clocks are moved by hand.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.errors import StoreUnavailable
from lakeshore.model.record import Record
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
        if key.endswith("/record") and not self.failed and mode.name == "if_match":
            if Record.from_bytes(data).terminal:
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
