"""What a fan-in's body gets first: its parents' ids, or their results.

A fan-in (``reduce.fan_in(ids, ...)``) is a child whose record says what to hand its body
ahead of its own arguments (``after_pass``). The worker builds that argument when the
attempt starts, after the claim proved every parent done: the ids as the record lists them,
or each parent's result, read in parent order from wherever the parent lives (spilled
results included, each checked like any result). A parent that did not succeed (only a
child with ``after_failure="run"`` runs then) is handed as None. docs/dependencies.md.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from lakeshore import codec
from lakeshore.errors import Conflict, Failed, JobError, NotFound, TooLarge
from lakeshore.model.record import Blob, Record, State
from lakeshore.protocol.dependencies import Parents
from lakeshore.streams.stream import follow

if TYPE_CHECKING:
    from lakeshore.plane import Plane

__all__ = ["handed"]


def handed(plane: Plane, rec: Record) -> list[Any]:
    """The first argument of fan-in ``rec``'s body: its parents' ids (``after_pass="ids"``)
    or their results (``"results"``), in parent order. The results together may take no
    more than the worker plane's ``max_payload_bytes``.

    Raises:
        NotFound: a parent is gone (collected by gc). Conflict: a parent counted done is
            live again (rerun). TooLarge: the results add up to more than
            ``max_payload_bytes``. StoreError, RecordError: reading failed.
    """
    if rec.after_pass != "results":
        return list(rec.after)
    parents = Parents(plane.ops(rec.queue))
    budget = _Budget(plane.max_payload_bytes, rec.id)

    def result_of(inv: str) -> Any:
        found = parents.find(inv)
        if found is None:
            raise NotFound(
                f"read the parents of {rec.id}",
                f"parent {inv} is gone (collected by gc before this fan-in ran)",
                "keep results longer (the queue's result_retention_s), then submit the "
                "parent and the fan-in again",
                id=inv,
            )
        ops, parent = found
        if parent.state != State.SUCCEEDED:
            if parent.terminal and rec.after_failure == "run":
                return None
            raise Conflict(
                f"read the parents of {rec.id}",
                f"parent {inv} is {parent.state} (run again since it was counted)",
                "retry this invocation once the parent succeeded",
                id=inv,
                state=parent.state,
            )
        if parent.result is None and parent.journal is not None:
            # a generator parent: its result is what it yielded, as q.result gives it
            return [f.value for f in follow(ops, inv, 0, None, _ended_badly)]
        blob = parent.result or Blob(inline=codec.encode(None))
        budget.take(blob.size if blob.ref is not None else len(blob.inline or b""))
        data = ops.get_blob(blob, f"result of parent {inv}", plane.max_payload_bytes)
        return codec.decode(data, f"result of parent {inv}")

    try:
        return parents.side_by_side(result_of, rec.after)
    finally:
        parents.close()


def _ended_badly(rec: Record) -> JobError:
    # only for a parent read as succeeded that a rerun moved on meanwhile
    return Failed(
        f"read the journal of parent {rec.id}",
        f"the parent is {rec.state} now",
        "retry the fan-in once the parent succeeded",
        id=rec.id,
    )


class _Budget:
    """Bytes of the parents' results read so far, against the plane's limit."""

    def __init__(self, limit: int, inv: str) -> None:
        self._left = limit
        self._limit = limit
        self._inv = inv
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            self._left -= n
            if self._left < 0:
                raise TooLarge(
                    f"read the parents of {self._inv}",
                    f"the parents' results add up to more than max_payload_bytes={self._limit}",
                    "hand the ids instead (fan_in without _results) and read what you need, "
                    "or raise Dispatch(max_payload_bytes=...) on the workers",
                    limit=self._limit,
                )
