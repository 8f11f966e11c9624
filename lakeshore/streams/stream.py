"""Reading an invocation's stream: follow its journal by id, from any process, any time.

What a reader sees:

* frames of the invocation's **current attempt**, from ``since`` on (seq is 0-based within
  an attempt); each frame carries its ``attempt``;
* if the attempt fails and a retry starts, the reader moves to the new attempt and continues
  from its seq 0 (the new attempt's frames replace the old ones; ``frame.attempt`` tells);
* the iterator ends at END, raises the remote error at ERROR — but only after the record
  confirms that this attempt really is the final one, so a reader never ends on the error of
  an attempt that is being retried, nor on the END of an attempt that was fenced out;
* killed or timed-out invocations raise their error once the journal is drained.

Cost while waiting: one LIST of the attempt's journal and one GET of the record per poll, with
the poll interval backing off to ``max_poll_s``. Resuming at ``since`` fetches only the
segments from the one holding ``since`` on: segment keys name their first seq, so the listing
tells which earlier segments to pass over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from lakeshore.errors import JobError, NotFinished
from lakeshore.model.record import Record, State
from lakeshore.protocol import polling
from lakeshore.protocol.steps import QueueOps
from lakeshore.streams.journal import END, ERROR, VALUE, Frame, read_segments, to_frame

__all__ = ["follow"]


def follow(
    ops: QueueOps,
    inv: str,
    since: int,
    timeout: float | None,
    job_error: Callable[[Record], JobError],
    max_poll_s: float = 0.5,
    since_attempt: int | None = None,
) -> Iterator[Frame]:
    """Yield the frames of ``inv`` from ``since``; see the module docstring. When
    ``since_attempt`` names the attempt the cursor belongs to and the invocation has moved to
    another attempt since, reading starts at that attempt's seq 0 instead.

    Raises:
        JobError: the invocation ended failed, killed or timed out.
        NotFinished: ``timeout`` seconds passed without the stream ending.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    rec = ops.read(inv)[0]
    attempt, cursor, last_key = rec.attempt, since, None
    if since_attempt is not None and since_attempt != rec.attempt:
        cursor = 0  # the cursor belongs to an earlier attempt, whose frames were replaced
    delay = 0.005
    settled = False  # saw the terminal record, and drained the journal after that
    while True:
        fresh = False
        if attempt > 0:
            for key, _, first, frames in read_segments(
                ops.store, ops.keys.journal_prefix(inv, attempt), last_key, since=cursor
            ):
                last_key, fresh = key, True
                for i, (tag, payload) in enumerate(frames):
                    seq = first + i
                    if tag == VALUE:
                        if seq >= cursor:
                            yield to_frame(attempt, seq, payload)
                            cursor = seq + 1
                        continue
                    rec = ops.read(inv)[0]
                    if rec.terminal and rec.attempt == attempt and tag in (END, ERROR):
                        if tag == END and rec.state == State.SUCCEEDED:
                            return
                        raise job_error(rec)
                    # the end of an attempt the record does not confirm: keep following
        rec = ops.read(inv)[0]
        if rec.attempt > attempt:
            attempt, cursor, last_key, settled = rec.attempt, 0, None, False
            continue
        if rec.terminal:
            # Every segment was written before the terminal record, but our last LIST may
            # predate the last of them: drain once more with a LIST issued after this GET.
            if settled:
                if rec.state == State.SUCCEEDED:
                    return
                raise job_error(rec)
            settled = True
            continue
        if deadline is not None and time.monotonic() >= deadline:
            raise NotFinished(
                f"stream {inv}",
                f"still {rec.state} after {timeout} s (read up to seq {cursor - 1})",
                f"resume with since={cursor}, attempt={attempt}",
                id=inv,
                state=rec.state,
                since=cursor,
                attempt=attempt,
            )
        if fresh:
            delay = 0.005
            continue
        # nothing new: poll with backoff (a memory store wakes us at the next write)
        polling.pause(ops.store, delay)
        delay = min(delay * 2, max_poll_s)
