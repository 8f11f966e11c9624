"""The retry rule's record fields (schema 2): they round-trip, raise ``v`` to 2 only when
set, leave a record that does not use them byte for byte as 0.4 wrote it, and a hostile
value is refused on read — a worker fails that invocation and goes on serving."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack
import pytest

import lakeshore as dls
from lakeshore import keys
from lakeshore.errors import RecordError
from lakeshore.model.record import SINCE_V2, Blob, Record
from lakeshore.store.base import Store
from tests import jobs
from tests.handmade import handmade, put_by_hand
from tests.tiers import make_plane

RULE = {
    "retry_for": ("ValueError", "mypkg.errors.Flaky", "tests.x.f.<locals>.E"),
    "no_retry_for": ("KeyError",),
    "retry_backoff_cap_s": 3600.0,
    "retry_jitter": 1.0,
}


def _rec(**fields: Any) -> Record:
    return Record(
        id=keys.new_id(), ns="default", queue="q", fn="m:f", args=Blob(inline=b""), **fields
    )


@pytest.mark.parametrize("name", sorted(RULE))
def test_each_field_round_trips_and_is_written_as_schema_2(name: str) -> None:
    rec = _rec(**{name: RULE[name]})
    data = rec.to_bytes()
    obj = msgpack.unpackb(data)
    assert obj["v"] == 2 and name in obj
    back = Record.from_bytes(data)
    assert getattr(back, name) == RULE[name] and back == dataclasses.replace(rec, v=2)
    assert back.to_bytes() == data  # read as written: writing it again changes nothing


def test_a_record_that_keeps_the_defaults_is_stored_as_04_stored_it() -> None:
    assert {"retry_for", "no_retry_for", "retry_backoff_cap_s", "retry_jitter"} <= set(SINCE_V2)
    rec = _rec()
    obj = msgpack.unpackb(rec.to_bytes())
    assert obj["v"] == 1 and not set(RULE) & set(obj)
    back = Record.from_bytes(rec.to_bytes())
    assert (back.retry_for, back.no_retry_for) == ((), ())
    assert (back.retry_backoff_cap_s, back.retry_jitter) == (300.0, 0.0)


HOSTILE: dict[str, Any] = {
    "retry_for": "ValueError",  # a str, not a list of names
    "no_retry_for": [1],
    "retry_for:spaces": ["a b"],
    "retry_for:control": ["a\x1bb"],
    "retry_for:long": ["x" * 257],
    "retry_for:many": [f"m.E{i}" for i in range(33)],
    "retry_for:empty": [""],
    "retry_for:dots": [".."],
    "retry_for:map": {"a": 1},
    "retry_backoff_cap_s": -1.0,
    "retry_backoff_cap_s:huge": 3601.0,
    "retry_backoff_cap_s:nan": math.nan,
    "retry_backoff_cap_s:str": "300",
    "retry_jitter": 1.01,
    "retry_jitter:negative": -0.5,
    "retry_jitter:bool": True,
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_value_is_refused_on_read(case: str) -> None:
    name = case.split(":")[0]
    obj = msgpack.unpackb(_rec().to_bytes())
    obj.update(v=2, **{name: HOSTILE[case]})
    with pytest.raises(RecordError) as e:
        Record.from_bytes(msgpack.packb(obj, use_bin_type=True))
    assert name in str(e.value)


def test_hostile_rules_are_failed_by_the_first_worker_and_good_work_runs(
    atomic_store: Store,
) -> None:
    q = make_plane(atomic_store)
    bad = []
    for case in ("retry_for:spaces", "retry_for:many", "retry_backoff_cap_s:huge"):
        inv = keys.new_id()
        obj = handmade(q, inv, v=2, **{case.split(":")[0]: HOSTILE[case]})
        put_by_hand(q, inv, msgpack.packb(obj, use_bin_type=True))
        bad.append(inv)
    good = [q.udf(jobs.add_one).submit(i) for i in range(3)]
    dls.run_worker(q, isolation="thread", idle_exit=0.5, max_poll_s=0.05)
    assert [q.result(i, timeout=5) for i in good] == [1, 2, 3]
    for inv in bad:
        rec = q.get(inv)
        assert rec.state == "failed" and rec.error is not None
        assert rec.error["type"] == "CorruptRecord"
