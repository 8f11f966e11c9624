"""The ticket protocol's costs: what a claim and a wait spend where processes compete and
where an invocation has not been claimed yet (counted on a store wrapper, never timed)."""

from __future__ import annotations

from collections import Counter

import pytest

import lakeshore as dls
from lakeshore.keys import QueueKeys, band_of_id, new_id
from lakeshore.model import lifecycle
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.steps import QueueOps
from lakeshore.store import MemoryStore
from lakeshore.store.base import OVERWRITE, PutMode
from tests import jobs
from tests.tiers import make_plane


class Tally(MemoryStore):
    """Counts record GETs, ticket GETs and record creates that lost."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self.seen["ticket GET" if "/_tickets/" in key else "record GET"] += (
            key.endswith("/record") or "/_tickets/" in key
        )
        return super().get(key, max_bytes)

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        try:
            return super().put(key, data, mode)
        except dls.Conflict:
            if key.endswith("/record") and mode.name == "create":
                self.seen["lost create"] += 1
            raise


def test_a_process_whose_picks_were_mostly_taken_reads_the_record_before_the_create() -> None:
    store = Tally()
    q = make_plane(store)
    ids = [q.udf(jobs.add_one).submit(i) for i in range(12)]
    keys = QueueKeys(q.ns, "default")
    first, second = Claimer(QueueOps(store, keys), "w1"), Claimer(QueueOps(store, keys), "w2")
    assert first.claim(store.now()) is not None  # the oldest; its listing holds the rest
    for inv in ids[1:]:  # another process takes every one of them since that listing
        rec, etag = second.ops.read(inv)
        second.ops.cas(lifecycle.claim(rec, "w2", "t", store.now()), etag)
    # a pick that was taken is a lost create while most picks went through; once most of
    # the recent ones were taken (7 in a row), the record is read first: no lost write
    assert first.claim(store.now()) is None
    assert store.seen["lost create"] == 7
    assert first.claim(store.now()) is None  # each is remembered as running now
    assert store.seen["lost create"] == 7


def test_waiting_for_a_job_no_one_claimed_costs_one_get_a_poll() -> None:
    store = Tally()
    q = make_plane(store)
    inv = q.udf(jobs.add_one).submit(1)
    store.seen.clear()
    with pytest.raises(dls.NotFinished):
        q.result(inv, timeout=0.3)  # no worker: every poll finds the record missing
    assert store.seen["record GET"] >= 4
    assert store.seen["ticket GET"] == 1  # the lookup; the polls do not read it again


def test_ids_carry_their_band_and_stay_distinct_and_ordered_within_a_millisecond() -> None:
    for priority in range(10):
        ids = [new_id(priority) for _ in range(2000)]
        assert len(set(ids)) == len(ids) and ids == sorted(ids)
        assert {band_of_id(i) for i in ids} == {str(9 - priority)}
    with pytest.raises(dls.InvalidArgument):
        new_id(10)
