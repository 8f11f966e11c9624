"""An invocation's stream and logs as the dashboard follows them: read once, for every tab.

Each read lists what was written after the last segment read (one LIST for the journal of
the current attempt, one for the logs) and fetches only the new segments. The first read
of a long journal lists it and fetches only the segments that hold its newest
``MAX_FRAMES`` frames. A segment that is corrupt stops the following of that journal (the
page says why; likewise a log segment that does not decode); any other error is said and
tried again at the next read.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field
from typing import Any

from lakeshore import codec
from lakeshore.errors import CorruptSegment, DecodeError, LakeshoreError
from lakeshore.model.record import Record
from lakeshore.protocol.steps import QueueOps
from lakeshore.running.logs import read_logs
from lakeshore.store.base import Store
from lakeshore.streams.journal import VALUE, read_segments, segment_seq

__all__ = ["MAX_FRAMES", "MAX_LOG_CHARS", "MAX_SHOWN", "Following", "shown"]

MAX_SHOWN = 4096  # characters of a value's repr on a page
MAX_FRAMES = 1000  # frames kept (the newest)
MAX_LOG_CHARS = 64 * 1024  # characters of log output kept per attempt (the tail)
MAX_LOG_ATTEMPTS = 5  # the newest attempts whose logs are kept
MAX_FRAME_SHOWN = 1 << 20  # a frame larger than this is named by its size, not decoded


_REPR = reprlib.Repr()  # attributes, not keywords: Python 3.11 takes none
_REPR.maxlevel = 8
_REPR.maxtuple = _REPR.maxlist = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 64
_REPR.maxstring = MAX_SHOWN
_REPR.maxother = _REPR.maxlong = 200


def shown(value: Any) -> str:
    """A decoded value as the page shows it: a repr that stops early in long containers
    and strings (never the whole of a large value), clipped."""
    text = _REPR.repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…"


@dataclass
class Following:
    """What was read of one attempt's stream and of the invocation's logs."""

    attempt: int
    frames: list[dict[str, Any]] = field(default_factory=list)  # {seq, value}
    journal_after: str | None = None
    journal_problem: str | None = None
    journal_stuck: bool = False  # a corrupt segment: read no further
    logs: list[dict[str, Any]] = field(default_factory=list)  # {attempt, text}
    logs_after: str | None = None
    logs_problem: str | None = None
    logs_stuck: bool = False
    started: bool = False

    def read(self, store: Store, ops: QueueOps, rec: Record) -> None:
        """Read what was written since the last read.

        Raises:
            nothing: a problem is kept in ``journal_problem`` / ``logs_problem``.
        """
        if rec.attempt > 0 and not self.journal_stuck:
            self._read_journal(store, ops.keys.journal_prefix(rec.id, rec.attempt))
        if not self.logs_stuck:
            self._read_logs(store, ops, rec.id)

    def _read_journal(self, store: Store, prefix: str) -> None:
        try:
            since = 0
            if not self.started:  # a long journal: only its newest frames are fetched
                keys = [info.key for info in store.list(prefix)]
                last = segment_seq(keys[-1]) if keys else None
                since = max(0, last - MAX_FRAMES) if last is not None else 0
                self.started = True
            for key, _, first, frames in read_segments(
                store, prefix, self.journal_after, since=since
            ):
                self.journal_after = key
                for i, (tag, payload) in enumerate(frames):
                    if tag == VALUE and first + i >= since:
                        self.frames.append({"seq": first + i, "value": _frame(payload)})
            self.journal_problem = None
        except CorruptSegment as e:
            self.journal_problem, self.journal_stuck = f"the stream stops here: {e}", True
        except LakeshoreError as e:
            self.journal_problem = f"could not read the stream (trying again): {e}"
        if len(self.frames) > MAX_FRAMES:
            del self.frames[: len(self.frames) - MAX_FRAMES]

    def _read_logs(self, store: Store, ops: QueueOps, inv: str) -> None:
        try:
            if self.logs_after is None:  # long logs: only the newest segments are fetched
                self.logs_after = _tail_start(store, ops.keys.logs_prefix(inv))
            for key, attempt, text in read_logs(store, ops.keys, inv, None, self.logs_after):
                self.logs_after = key
                if self.logs and self.logs[-1]["attempt"] == attempt:
                    self.logs[-1]["text"] = (self.logs[-1]["text"] + text)[-MAX_LOG_CHARS:]
                else:
                    self.logs.append({"attempt": attempt, "text": text[-MAX_LOG_CHARS:]})
                    del self.logs[:-MAX_LOG_ATTEMPTS]
            self.logs_problem = None
        except (CorruptSegment, DecodeError) as e:
            self.logs_problem, self.logs_stuck = f"the logs stop here: {e}", True
        except LakeshoreError as e:
            self.logs_problem = f"could not read the logs (trying again): {e}"


def _tail_start(store: Store, prefix: str) -> str:
    """Where to start reading a folder of log segments so that only the newest ones, about
    ``MAX_LOG_CHARS`` per kept attempt in all, are fetched ("" for the whole folder)."""
    infos = list(store.list(prefix))
    room = MAX_LOG_CHARS * MAX_LOG_ATTEMPTS
    start = len(infos)
    while start > 0 and room - infos[start - 1].size >= 0:
        start -= 1
        room -= infos[start].size
    return infos[start - 1].key if start > 0 else ""


def _frame(payload: bytes) -> str:
    if len(payload) > MAX_FRAME_SHOWN:
        return f"(a value of {len(payload)} bytes: too large to show here)"
    try:
        return shown(codec.decode(payload, "frame"))
    except LakeshoreError as e:
        return f"(undecodable frame: {e})"
