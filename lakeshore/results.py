"""Waiting for an invocation to end, and what it ended with: its value or its error.

Shared by every reader that waits by id (``Dispatch.result``, ``f.remote``, a work queue's
``call``): object storage cannot push, so the wait is a poll with a backoff. ``stream``
follows a generator's frames by id (``Dispatch.stream``, a work queue's ``stream``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from lakeshore import codec
from lakeshore.errors import (
    Failed,
    InvalidArgument,
    JobError,
    Killed,
    NotFinished,
    NotFound,
    TimedOut,
)
from lakeshore.model.record import Blob, Record, State
from lakeshore.plane import HasPlane, Plane, plane_of
from lakeshore.protocol import polling
from lakeshore.protocol.steps import QueueOps, unclaimed
from lakeshore.streams.journal import Frame
from lakeshore.streams.stream import follow

__all__ = ["job_error", "result", "stream", "wait"]

# a poll of an invocation never claimed re-reads its ticket this often
_TICKET_RECHECK_S = 10.0


def result(plane: Plane | HasPlane, inv: str, timeout: float | None = None) -> Any:
    """Wait for ``inv`` to end; its value (a generator's: the list of what it yielded).
    ``plane`` is a ``Dispatch`` or its ``Plane``.

    Raises:
        Failed, Killed, TimedOut: it ended that way. NotFinished: still live after
            ``timeout`` seconds. NotFound: no such invocation.
    """
    plane = plane_of(plane)
    ops, rec = wait(plane, inv, timeout)
    if rec.state != State.SUCCEEDED:
        raise job_error(rec)
    if rec.result is None and rec.journal is not None:
        # a streaming body: its result is what it yielded, read from the journal
        return [f.value for f in follow(ops, rec.id, 0, None, job_error)]
    blob = rec.result or Blob(inline=b"\xc0")
    return codec.decode(ops.get_blob(blob, f"result of {inv}", plane.max_payload_bytes))


def wait(plane: Plane | HasPlane, inv: str, timeout: float | None) -> tuple[QueueOps, Record]:
    """Poll invocation ``inv`` until it is terminal: its queue's steps and its record.
    ``plane`` is a ``Dispatch`` or its ``Plane``.

    Raises:
        NotFinished: still live after ``timeout`` seconds. NotFound: no such invocation.
        InvalidArgument: ``inv`` is not an id.
    """
    plane = plane_of(plane)
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.005
    ops, rec, etag = plane.locate(inv)
    looked = time.monotonic()
    while not rec.terminal:
        if deadline is not None and time.monotonic() >= deadline:
            raise NotFinished(
                f"result {inv}",
                f"still {rec.state} after {timeout} s",
                "wait longer (timeout=None waits for good), or check that a worker runs",
                id=inv,
                state=rec.state,
            )
        pause_s = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
        # polling is the only way to learn; the backoff keeps it cheap
        polling.pause(ops.store, pause_s)
        delay = min(delay * 1.5, 1.0)
        if unclaimed(etag) and time.monotonic() - looked < _TICKET_RECHECK_S:
            # still the ticket's: the record appears at the first move, so one GET a
            # poll; the ticket itself is looked at again now and then (gone: NotFound)
            with contextlib.suppress(NotFound):
                rec, etag = ops.read_record(inv)
            continue
        rec, etag = ops.read(inv)
        looked = time.monotonic()
    return ops, rec


def stream(
    plane: Plane | HasPlane,
    inv: str,
    since: int = 0,
    timeout: float | None = None,
    attempt: int | None = None,
) -> Iterator[Frame]:
    """The frames of invocation ``inv`` from ``since`` on (see ``Dispatch.stream``).
    ``plane`` is a ``Dispatch`` or its ``Plane``.

    Raises:
        Failed, Killed, TimedOut: the invocation ended that way (after its frames).
        NotFinished: ``timeout`` seconds passed while it was still queued or running.
        NotFound: no such invocation. InvalidArgument: a bad id or cursor.
    """
    if not isinstance(since, int) or since < 0:
        raise InvalidArgument(f"stream {inv}", f"since={since!r}", "pass an int >= 0")
    ops, rec, _ = plane_of(plane).locate(inv)
    return follow(ops, rec.id, since, timeout, job_error, since_attempt=attempt)


def job_error(rec: Record) -> JobError:
    """The error ``result`` raises for a record that ended other than succeeded."""
    err = rec.error or {}
    cls = {"failed": Failed, "killed": Killed, "timeout": TimedOut}[rec.state]
    remote = f"{err.get('type', '?')}: {err.get('message', '')}"
    fix = "fix the body or its input and submit again"
    if err.get("traceback", "").strip():
        # For Python callers; `lakeshore result` prints the traceback and says so instead.
        fix = f"this error's remote_traceback shows where the body raised; {fix}"
    todo = {
        "failed": fix,
        "killed": "it was cancelled; submit again if it should run",
        "timeout": "raise timeout_s / the deadline, or make the body faster",
    }[rec.state]
    return cls(
        f"result {rec.id}",
        f"invocation {rec.state} after {rec.attempt} attempt(s); remote error {remote}",
        todo,
        id=rec.id,
        state=rec.state,
        remote_type=err.get("type", ""),
        remote_message=err.get("message", ""),
        remote_traceback=err.get("traceback", ""),
    )
