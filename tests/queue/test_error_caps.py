"""Long errors are clipped wherever they are stored or read, never a reason to refuse: records
0.3.0 wrote (it had no caps), the ERROR frame that ends a failed stream, any error map."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.store import MemoryStore
from lakeshore.streams.journal import MAX_FRAME_BYTES
from tests import jobs
from tests.tiers import make_plane

# -- bodies (module level) ------------------------------------------------------------------


def fails_loudly(n: int) -> Iterator[int]:
    """A stream that yields once, then fails with an ``n``-character message."""
    yield 1
    raise ValueError("x" * n)


# -- records written by 0.3.0 ---------------------------------------------------------------


def _as_0_3_0_after_a_failed_attempt(q: Any, inv: str, message: str) -> None:
    """Rewrite ``inv``'s queued record as a 0.3.0 worker left it after a failed attempt with
    retries left: attempt 1, queued again, the attempt's error unclipped (0.3.0 had no caps)."""
    ops = q.plane.ops("default")
    rec, etag = ops.read(inv)
    old = dataclasses.replace(
        rec,
        attempt=1,
        error={"type": "ValueError", "message": message, "traceback": "Traceback...\n" + message},
    )
    ops.put_marker(old)  # queued again after a first attempt: the record exists
    ops.cas(old, etag)
    assert ops.read_record(inv)[0].attempt == 1


def test_a_0_3_0_record_queued_again_after_a_long_error_is_retried_not_failed() -> None:
    """0.3.0 kept an attempt's whole error text in the record it queued again for the retry.
    An upgraded worker must run the retry, not replace the invocation with a CorruptRecord stub."""
    q = make_plane(MemoryStore())
    inv = q.udf(jobs.add_one, max_attempts=3).submit(1)
    _as_0_3_0_after_a_failed_attempt(q, inv, "bad input " + "x" * 100_000)
    dls.run_worker(q, max_jobs=1, idle_exit=0, isolation="thread")
    assert q.result(inv, timeout=10) == 2


def test_a_0_3_0_failed_record_with_a_long_error_still_reads_as_failed() -> None:
    q = make_plane(MemoryStore())
    inv = q.udf(jobs.add_one, max_attempts=1).submit(1)
    ops = q.plane.ops("default")
    rec, etag = ops.read(inv)
    old = dataclasses.replace(
        rec,
        state="failed",
        attempt=1,
        finished_at=rec.submitted_at,
        error={"type": "ValueError", "message": "y" * 100_000, "traceback": ""},
    )
    ops.cas(old, etag)  # the first move creates the record
    ops.store.delete(ops.ticket_key(old))  # a finished invocation has no ticket
    assert list(ops.tickets()) == []
    with pytest.raises(dls.Failed) as err:
        q.result(inv, timeout=5)
    assert "yyyy" in err.value.remote_message


# -- the ERROR frame of a failed stream -----------------------------------------------------


def test_a_failed_streams_error_frame_is_clipped_like_the_record() -> None:
    """The record's error is clipped to 64 KiB a text; the ERROR frame that ends the stream
    carried the raw error map (message and traceback, each as long as the exception text), so
    a long enough message made a segment no reader fetches (CorruptSegment instead of the
    invocation's error: with a 140 MiB message the segment was 294 MB, over the 257 MiB bound)."""
    q = make_plane(MemoryStore())
    inv = q.udf(fails_loudly, max_attempts=1).submit(2 << 20)
    dls.run_worker(q, once=True, isolation="thread")
    ops = q.plane.ops("default")
    sizes = [i.size for i in ops.store.list(ops.keys.journal_prefix(inv, 1))]
    assert sizes and max(sizes) < 1 << 20, sizes  # the 2 MiB message does not ride whole
    assert max(sizes) < MAX_FRAME_BYTES
    got = []
    with pytest.raises(dls.Failed, match="ValueError"):
        for frame in q.stream(inv):
            got.append(frame.value)
    assert got == [1]


def test_an_error_map_over_its_caps_is_clipped_when_read() -> None:
    """Whoever wrote it, a record's error map reads back within its caps (8 entries, keys of
    64 bytes, texts of 64 KiB): diagnostics are clipped, never a reason to refuse the record."""
    from lakeshore.model.record import LIMITS, MAX_ERROR_ENTRIES, MAX_ERROR_TEXT, Record

    q = make_plane(MemoryStore())
    inv = q.udf(jobs.add_one).submit(1)
    rec = q.plane.ops("default").read(inv)[0]
    error = {f"{'k' * 100}{i}": "t" * (MAX_ERROR_TEXT + 1) for i in range(12)}
    back = Record.from_bytes(dataclasses.replace(rec, error=error).to_bytes())
    assert back.error is not None and len(back.error) <= MAX_ERROR_ENTRIES
    for k, v in back.error.items():
        assert len(k.encode()) <= LIMITS["error.key"] and len(v.encode()) <= MAX_ERROR_TEXT
    # clipped keys keep their head and stay apart (a digest of the whole key ends each)
    assert len(back.error) == MAX_ERROR_ENTRIES
    assert all(k.startswith("k" * 40) for k in back.error)
    wide = Record.from_bytes(
        dataclasses.replace(rec, error={"é" * 40: "a", "ü" * 40: "b", "type": "X"}).to_bytes()
    )
    assert wide.error is not None and len(wide.error) == 3
    assert sorted(wide.error.values()) == ["X", "a", "b"]
