"""The W3C trace context a record carries (``traceparent``, ``tracestate``), checked; pure.

A producer's trace continues in the worker that runs its invocation: the submit stores the
two headers of the W3C Trace Context recommendation in the record, and the attempt takes
them as its spans' parent (``lakeshore.tracing``). What a record holds may be hostile, so
both are checked against the recommendation's grammar with strict bounds before a worker
hands them to a tracer. A malformed value is dropped, not refused: the trace is for people
looking at it, nothing decides by it, and an invocation must run the same with or without it.
"""

from __future__ import annotations

import re

__all__ = ["MAX_TRACESTATE", "MAX_TRACESTATE_MEMBERS", "TRACEPARENT_LEN", "checked_trace"]

# version 00 only: "00-" 32 hex digits "-" 16 hex digits "-" 2 hex digits, lower case
TRACEPARENT_LEN = 55
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}\Z")
# the recommendation asks vendors to pass at least 512 characters on; more is dropped here,
# since every write of the record pays for it
MAX_TRACESTATE = 512
MAX_TRACESTATE_MEMBERS = 32
_KEY = r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(rf"{_KEY}={_VALUE}\Z")


def _parent_ok(value: object) -> bool:
    if type(value) is not str or len(value) != TRACEPARENT_LEN:
        return False
    m = _TRACEPARENT.match(value)
    # all-zero ids are invalid in the recommendation: a tracer would start a new trace
    return m is not None and m.group(1) != "0" * 32 and m.group(2) != "0" * 16


def _state_ok(value: object) -> bool:
    if type(value) is not str or len(value) > MAX_TRACESTATE:
        return False
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]  # empty members are allowed, and ignored
    if len(members) > MAX_TRACESTATE_MEMBERS:
        return False
    keys = [m.partition("=")[0] for m in members]
    return len(set(keys)) == len(keys) and all(_MEMBER.match(m) for m in members)


def checked_trace(traceparent: object, tracestate: object) -> tuple[str, str]:
    """The trace context of a record as ``(traceparent, tracestate)``, each ``""`` where
    missing or malformed: a ``tracestate`` counts only beside a valid ``traceparent``."""
    if not _parent_ok(traceparent):
        return "", ""
    assert isinstance(traceparent, str)
    if tracestate == "" or not _state_ok(tracestate):
        return traceparent, ""
    assert isinstance(tracestate, str)
    return traceparent, tracestate
