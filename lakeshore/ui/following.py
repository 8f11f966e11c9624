"""An invocation's stream and logs as the dashboard follows them: read once, for every tab.

Each read lists what was written after the last segment read (one LIST for the journal of
the current attempt, one for the logs) and fetches only the new segments. The first read
of a long journal lists it and fetches only the segments that hold its newest
``MAX_FRAMES`` frames. A segment that is corrupt stops the following of that journal (the
page says why; likewise a log segment that does not decode); any other error is said and
tried again at the next read.

No segment larger than ``max_segment_bytes`` (``MAX_SEGMENT_READ``) is fetched: anything in
the store may be hostile, and a page read holds one segment at a time, so what a read holds
is bounded whatever the store holds. A larger segment (the listing says its size) is named
where its frames or text would be, and the following goes on after it.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lakeshore import codec
from lakeshore.errors import CorruptSegment, DecodeError, LakeshoreError, TooLarge
from lakeshore.model.record import Record
from lakeshore.protocol.steps import QueueOps
from lakeshore.store.base import ObjectInfo, Store
from lakeshore.streams.journal import VALUE, decode_segment, segment_seq

__all__ = [
    "MAX_FRAMES",
    "MAX_LOG_CHARS",
    "MAX_SEGMENT_READ",
    "MAX_SHOWN",
    "Following",
    "shown",
]

MAX_SHOWN = 4096  # characters of a value's repr on a page
MAX_FRAMES = 1000  # frames kept (the newest)
MAX_LOG_CHARS = 64 * 1024  # characters of log output kept per attempt (the tail)
MAX_LOG_ATTEMPTS = 5  # the newest attempts whose logs are kept
MAX_FRAME_SHOWN = 1 << 20  # a frame larger than this is named by its size, not decoded
# bytes of one journal or log segment a read fetches: a writer's batch (256 KiB of frames by
# default, 64 KiB of log text) and one frame it would show fit, with room to spare
MAX_SEGMENT_READ = 2 << 20


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
    max_segment_bytes: int = MAX_SEGMENT_READ
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
            for seg in _segments(store, prefix, self.journal_after, since, self.max_segment_bytes):
                self.journal_after = seg.key
                if seg.frames is None:
                    self.frames.append({"seq": seg.first, "value": seg.skipped()})
                    continue
                for i, (tag, payload) in enumerate(seg.frames):
                    if tag == VALUE and seg.first + i >= since:
                        self.frames.append({"seq": seg.first + i, "value": _frame(payload)})
            self.journal_problem = None
        except CorruptSegment as e:
            self.journal_problem, self.journal_stuck = f"the stream stops here: {e}", True
        except LakeshoreError as e:
            self.journal_problem = f"could not read the stream (trying again): {e}"
        if len(self.frames) > MAX_FRAMES:
            del self.frames[: len(self.frames) - MAX_FRAMES]

    def _read_logs(self, store: Store, ops: QueueOps, inv: str) -> None:
        try:
            prefix = ops.keys.logs_prefix(inv)
            if self.logs_after is None:  # long logs: only the newest segments are fetched
                self.logs_after = _tail_start(store, prefix, self.max_segment_bytes)
            for seg in _segments(store, prefix, self.logs_after or None, 0, self.max_segment_bytes):
                self.logs_after = seg.key
                if seg.frames is None:
                    text = f"\n{seg.skipped()}\n"
                else:
                    text = "".join(str(codec.decode(p, "log text")) for _k, p in seg.frames)
                if self.logs and self.logs[-1]["attempt"] == seg.attempt:
                    self.logs[-1]["text"] = (self.logs[-1]["text"] + text)[-MAX_LOG_CHARS:]
                else:
                    self.logs.append({"attempt": seg.attempt, "text": text[-MAX_LOG_CHARS:]})
                    del self.logs[:-MAX_LOG_ATTEMPTS]
            self.logs_problem = None
        except (CorruptSegment, DecodeError) as e:
            self.logs_problem, self.logs_stuck = f"the logs stop here: {e}", True
        except LakeshoreError as e:
            self.logs_problem = f"could not read the logs (trying again): {e}"


@dataclass
class _Segment:
    """A journal or log segment as a read found it: ``frames`` None when it was too large
    to fetch (``attempt`` then comes from its key, -1 when that names none)."""

    key: str
    attempt: int
    first: int
    frames: list[tuple[int, bytes]] | None
    size: int
    limit: int

    def skipped(self) -> str:
        return (
            f"(a segment of {self.size} bytes, more than the {self.limit} the dashboard reads: "
            "not shown)"
        )


def _segments(
    store: Store, prefix: str, start_after: str | None, since: int, max_bytes: int
) -> Iterator[_Segment]:
    """The segments under ``prefix`` in order, as ``read_segments`` reads them (one that
    holds only frames before ``since`` is not fetched), except that none larger than
    ``max_bytes`` is fetched: it comes without its frames.

    Raises:
        CorruptSegment: a segment is malformed, larger than its listing said, or names
            another first seq than its key (or, too large, names none).
        StoreError: the store failed.
    """
    held: ObjectInfo | None = None  # fetched once its successor is known
    for info in store.list(prefix, start_after=start_after):
        if held is not None:
            nxt = segment_seq(info.key)
            if nxt is None or nxt > since:
                yield _segment(store, held, max_bytes)
        held = info
    if held is not None:
        yield _segment(store, held, max_bytes)


def _segment(store: Store, info: ObjectInfo, max_bytes: int) -> _Segment:
    named = segment_seq(info.key)
    if info.size > max_bytes:
        if named is None:
            raise _corrupt(info.key, f"an object of {info.size} bytes that names no seq")
        return _Segment(info.key, _attempt_of(info.key), named, None, info.size, max_bytes)
    try:
        data = store.get(info.key, max_bytes=max_bytes)[0]
    except TooLarge as e:  # segments are written once: it was not what the listing said
        raise _corrupt(info.key, f"larger than listed ({e.details.get('size')} bytes)") from None
    attempt, first, frames = decode_segment(data, info.key)
    if named is not None and named != first:
        raise _corrupt(info.key, f"its first seq {first} is not the {named} its key names")
    return _Segment(info.key, attempt, first, frames, len(data), max_bytes)


def _attempt_of(key: str) -> int:
    """The attempt a segment's key names (``.../<attempt>/<seq>``), -1 when none."""
    parts = key.rsplit("/", 2)
    return int(parts[-2]) if len(parts) == 3 and parts[-2].isdigit() else -1


def _corrupt(key: str, what: str) -> CorruptSegment:
    return CorruptSegment(f"read {key}", what, "the object is corrupt; it is not read past")


def _tail_start(store: Store, prefix: str, max_bytes: int) -> str:
    """Where to start reading a folder of log segments so that only the newest ones, about
    ``MAX_LOG_CHARS`` per kept attempt in all, are fetched ("" for the whole folder); one
    over ``max_bytes`` costs nothing (it is named, not fetched)."""
    infos = list(store.list(prefix))
    room = MAX_LOG_CHARS * MAX_LOG_ATTEMPTS
    start = len(infos)
    while start > 0 and room - _cost(infos[start - 1], max_bytes) >= 0:
        start -= 1
        room -= _cost(infos[start], max_bytes)
    return infos[start - 1].key if start > 0 else ""


def _cost(info: ObjectInfo, max_bytes: int) -> int:
    return info.size if info.size <= max_bytes else 0


def _frame(payload: bytes) -> str:
    if len(payload) > MAX_FRAME_SHOWN:
        return f"(a value of {len(payload)} bytes: too large to show here)"
    try:
        return shown(codec.decode(payload, "frame"))
    except LakeshoreError as e:
        return f"(undecodable frame: {e})"
