"""Schedule objects on the store: ``lakeshore/<ns>/<queue>/_schedules/<name>``.

Every write is conditional: a new schedule is created create-only, and every later change
(a new definition, a firing's new state) is a compare-and-swap on the etag the writer read,
so of two writers that read the same version one wins and the other reads again. Only
``remove`` deletes, unconditionally: a firer whose compare-and-swap then meets no object
stops there. The firing itself (the keyed submit) is :mod:`lakeshore.firing`'s; the object's
fields and rules are :mod:`lakeshore.model.schedule`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from lakeshore.errors import NotFound, RecordError, TooLarge
from lakeshore.keys import QueueKeys, is_name
from lakeshore.model.schedule import MAX_OBJECT_BYTES, Schedule
from lakeshore.store.base import CREATE, Store, if_match

__all__ = ["Listed", "ScheduleObjects"]


@dataclass(frozen=True)
class Listed:
    """One schedule object as a listing shows it: its name and etag (no content)."""

    name: str
    etag: str


class ScheduleObjects:
    """The schedule objects of one queue."""

    def __init__(self, store: Store, keys: QueueKeys) -> None:
        self.store, self.keys = store, keys

    def list(self) -> list[Listed]:
        """The queue's schedules by name and etag: one ``LIST`` (a page per 1000). Keys that
        are no schedule name (anyone may write into the folder) are left out.

        Raises:
            StoreError: the store failed.
        """
        prefix = self.keys.schedules_prefix
        out = []
        for info in self.store.list(prefix):
            name = info.key[len(prefix) :]
            if is_name(name):
                out.append(Listed(name, info.etag))
        return out

    def read(self, name: str) -> tuple[Schedule, str]:
        """The schedule ``name`` and its etag: one ``GET``.

        Raises:
            NotFound: no such schedule.
            RecordError: the object is not a schedule lakeshore wrote (``NewerRecord`` for
                one of a newer lakeshore).
            InvalidArgument: a bad name. StoreError: the store failed.
        """
        where = self.keys.schedule(name)
        try:
            data, etag = self.store.get(where, max_bytes=MAX_OBJECT_BYTES)
        except TooLarge:
            raise RecordError(
                f"read {where}",
                f"not a schedule lakeshore wrote: over {MAX_OBJECT_BYTES} bytes",
                "remove it (lakeshore schedule rm) and set it again",
                key=where,
            ) from None
        return Schedule.from_bytes(data, where, name, self.keys.queue), etag

    def write(self, sched: Schedule, etag: str | None) -> tuple[Schedule, str]:
        """Write ``sched`` (with a new ``rev`` and ``wid``): create-only when ``etag`` is
        None, else compare-and-swap on it. Returns what was written and its etag.

        Raises:
            Conflict: the object changed (or appeared, or went) since ``etag`` was read.
            StoreError: the store failed.
        """
        new = sched.written()
        mode = CREATE if etag is None else if_match(etag)
        return new, self.store.put(self.keys.schedule(sched.name), new.to_bytes(), mode)

    def remove(self, name: str) -> bool:
        """Delete the schedule ``name``; False when there was none. Its invocations stay.

        Raises:
            InvalidArgument: a bad name. StoreError: the store failed.
        """
        where = self.keys.schedule(name)
        try:
            self.store.get(where, max_bytes=MAX_OBJECT_BYTES)
        except NotFound:
            return False
        except TooLarge:
            pass  # there is an object: junk in a schedule's place, removed all the same
        self.store.delete(where)
        return True
