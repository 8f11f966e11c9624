"""Records and bytes made by hand, as a hostile producer or an old version would write them."""

from __future__ import annotations

from typing import Any

import msgpack

from lakeshore import codec
from lakeshore.model.record import Blob, Record

ADD_ONE = "tests.jobs:add_one"


def ext(code: int, payload: bytes) -> bytes:
    """An ext object framed by hand (msgpack's ExtType refuses the negative codes)."""
    n, c = len(payload), code.to_bytes(1, "big", signed=True)
    fixed = {1: b"\xd4", 2: b"\xd5", 4: b"\xd6", 8: b"\xd7", 16: b"\xd8"}
    if n in fixed:
        return fixed[n] + c + payload
    if n < 2**8:
        return b"\xc7" + n.to_bytes(1, "big") + c + payload
    if n < 2**16:
        return b"\xc8" + n.to_bytes(2, "big") + c + payload
    return b"\xc9" + n.to_bytes(4, "big") + c + payload


def deep_tuple(levels: int) -> bytes:
    """``(((…(1,)…),),)``: the encoding of a tuple nested ``levels`` deep, built by hand
    (encode refuses it now)."""
    data = b"\x01"
    for _ in range(levels):
        data = ext(1, b"\x91" + data)
    return data


def handmade(q: Any, inv: str, **fields: Any) -> dict[str, Any]:
    """A well-formed record map of ``add_one(1)`` on the default queue, then ``fields``."""
    args = Blob(inline=codec.encode(((1,), {})))
    rec = Record(id=inv, ns=q.ns, queue="default", fn=ADD_ONE, args=args)
    obj: dict[str, Any] = msgpack.unpackb(rec.to_bytes())
    obj.update(fields)
    return obj


def put_by_hand(q: Any, inv: str, data: bytes) -> None:
    """What a producer with write access can do: a ticket and any record bytes."""
    ops = q.plane.ops("default")
    q.store.put(ops.keys.ticket(5, inv), b"by hand")
    q.store.put(ops.keys.record(inv), data)
