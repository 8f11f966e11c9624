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
from tests.conftest import make_plane


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


def test_a_process_that_competes_reads_the_record_before_trying_to_create_it() -> None:
    store = Tally()
    q = make_plane(store)
    ids = [q.udf(jobs.add_one).submit(i) for i in range(4)]
    keys = QueueKeys(q.ns, "default")
    first, second = Claimer(QueueOps(store, keys), "w1"), Claimer(QueueOps(store, keys), "w2")
    assert second.claim(store.now()) is not None  # another process took the oldest
    # alone, a process tries the create from the ticket, and loses to the other process
    got = [first.claim(store.now())]
    assert store.seen["lost create"] == 1
    # the other process claims one more, which the first one's listing still holds
    mine_so_far = {h.record.id for h in got if h is not None}
    theirs = next(i for i in ids[1:] if i not in mine_so_far)
    rec, etag = second.ops.read(theirs)
    second.ops.cas(lifecycle.claim(rec, "w2", "t", store.now()), etag)
    # once it has lost a race, it reads the record of a full ticket first: no lost write
    # for the ticket the other process took since the listing
    got.append(first.claim(store.now()))
    assert first.claim(store.now()) is None  # nothing left
    assert store.seen["lost create"] == 1
    mine = sorted(h.record.id for h in got if h is not None)
    assert sorted([*mine, theirs]) == sorted(ids[1:])


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
