"""The record's trace context (schema 2): ``traceparent`` and ``tracestate`` round-trip, make
the record v2 only when set, and a malformed or hostile value is dropped on read (the
record reads as untraced), never refused: an invocation runs the same with or without it."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from lakeshore import keys
from lakeshore.model.record import SINCE_V2, Blob, Record
from lakeshore.model.trace_context import checked_trace

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7, vendor@tenant=x y"


def _rec(**fields: Any) -> Record:
    return Record(
        id=keys.new_id(), ns="default", queue="q", fn="m:f", args=Blob(inline=b""), **fields
    )


def test_the_fields_round_trip_and_leave_the_record_schema_1() -> None:
    """Diagnostics only: a 0.4 worker ignores keys it does not know and runs the invocation
    as it should, so a traced record stays readable by it (v = 1)."""
    rec = _rec(traceparent=PARENT, tracestate=STATE)
    data = rec.to_bytes()
    obj = msgpack.unpackb(data)
    assert obj["v"] == 1 and obj["traceparent"] == PARENT and obj["tracestate"] == STATE
    back = Record.from_bytes(data)
    assert back == rec
    assert back.to_bytes() == data
    # beside a field that does change the meaning, the record is v2 all the same
    assert msgpack.unpackb(_rec(traceparent=PARENT, after_pass="ids").to_bytes())["v"] == 2


def test_an_untraced_record_is_stored_as_04_stored_it() -> None:
    assert SINCE_V2["traceparent"] == SINCE_V2["tracestate"] == ""
    obj = msgpack.unpackb(_rec().to_bytes())
    assert obj["v"] == 1 and "traceparent" not in obj and "tracestate" not in obj


HOSTILE_PARENTS: dict[str, Any] = {
    "upper case": PARENT.upper(),
    "version ff": "ff" + PARENT[2:],
    "version 01": "01" + PARENT[2:],  # only the version this reader knows is taken
    "zero trace id": f"00-{'0' * 32}-b7ad6b7169203331-01",
    "zero span id": f"00-0af7651916cd43dd8448eb211c80319c-{'0' * 16}-01",
    "short": PARENT[:-1],
    "long": PARENT + "-00",
    "trailing newline": PARENT[:-1] + "\n",
    "not hex": PARENT.replace("a", "g"),
    "huge": "0" * 200_000,
    "int": 1,
    "bytes": PARENT.encode(),
    "list": [PARENT],
    "map": {"traceparent": PARENT},
    "none": None,
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PARENTS))
def test_a_hostile_traceparent_is_dropped_with_its_tracestate(case: str) -> None:
    obj = msgpack.unpackb(_rec().to_bytes())
    obj.update(v=2, traceparent=HOSTILE_PARENTS[case], tracestate=STATE)
    rec = Record.from_bytes(msgpack.packb(obj, use_bin_type=True))
    assert (rec.traceparent, rec.tracestate) == ("", "")
    assert rec.fn == "m:f"  # the rest of the record is read as written


HOSTILE_STATES: dict[str, Any] = {
    "too long": "a=" + "b" * 600,
    "too many members": ",".join(f"k{i}=v" for i in range(33)),
    "duplicate key": "a=1,a=2",
    "upper-case key": "Key=1",
    "no value": "a=",
    "equals in value": "a=b=c",
    "control": "a=b\x1bc",
    "non-ascii": "a=é",
    "int": 5,
    "list": ["a=b"],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_STATES))
def test_a_hostile_tracestate_is_dropped_and_the_parent_kept(case: str) -> None:
    obj = msgpack.unpackb(_rec().to_bytes())
    obj.update(v=2, traceparent=PARENT, tracestate=HOSTILE_STATES[case])
    rec = Record.from_bytes(msgpack.packb(obj, use_bin_type=True))
    assert (rec.traceparent, rec.tracestate) == (PARENT, "")


def test_a_tracestate_alone_means_nothing() -> None:
    assert checked_trace("", STATE) == ("", "")
    assert checked_trace(PARENT, "") == (PARENT, "")
    assert checked_trace(PARENT, " , a=1 ,") == (PARENT, " , a=1 ,")  # empty members allowed
