"""Journals: durable, resumable streams of frames, written in batched segments.

A generator body's yields become VALUE frames. The worker batches them into segments — one
create-only object per batch, named by the sequence number of its first frame — and flushes a
batch when it holds ``flush_frames`` frames or ``flush_bytes`` bytes, or when its oldest frame
is ``flush_age_s`` old (so a slow generator's single yield shows up quickly, and a fast one does
not cost a PUT per yield). The last segment of a successful attempt ends with one END frame; an
attempt that fails for good ends with one ERROR frame. Nothing else ends a journal.

Segment object (msgpack)::

    {"a": attempt, "s": first_seq, "f": [[tag, payload], ...]}   tag: 0 VALUE, 1 END, 2 ERROR

VALUE payloads are values encoded with :mod:`lakeshore.codec`; an ERROR payload is the error
map (type, message, traceback) encoded the same way.
"""

from __future__ import annotations

import re
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lakeshore import codec
from lakeshore.errors import CorruptSegment, InvalidArgument, TooLarge
from lakeshore.store.base import CREATE, Store

__all__ = [
    "END",
    "ERROR",
    "MAX_FRAME_BYTES",
    "MAX_SEGMENT_BYTES",
    "VALUE",
    "Frame",
    "JournalWriter",
    "read_segments",
    "segment_seq",
]

VALUE, END, ERROR = 0, 1, 2
_TAGS = frozenset((VALUE, END, ERROR))  # which of the three a frame is
# The largest encoded value one frame carries (a yield, a topic post, a log chunk): the same
# as the default max_payload_bytes of arguments and results. A writer batches frames so that
# a segment's payloads never add up to more, so a segment is at most this plus its framing
# (a few bytes per frame), and a reader never fetches an object larger than that.
MAX_FRAME_BYTES = 256 << 20
MAX_SEGMENT_BYTES = MAX_FRAME_BYTES + (1 << 20)
_SEQ_NAME = re.compile(r"\d{12}\Z")


@dataclass(frozen=True)
class Frame:
    """One value of a stream: ``seq`` (0-based within its attempt or topic), ``value``, and
    the ``attempt`` that wrote it (0 for topics). The END and ERROR frames that close a
    journal are read by the stream's follower and never handed out."""

    seq: int
    value: Any
    attempt: int = 0

    @property
    def kind(self) -> str:
        """Deprecated since 0.5: always ``"value"``, the only frames a reader is handed."""
        warnings.warn(
            "Frame.kind is gone: every frame handed out is a value",
            DeprecationWarning,
            stacklevel=2,
        )
        return "value"


def encode_segment(attempt: int, first: int, frames: list[tuple[int, bytes]]) -> bytes:
    obj = {"a": attempt, "s": first, "f": [[k, p] for k, p in frames]}
    return codec.pack_plain(obj)


def decode_segment(data: bytes, where: str) -> tuple[int, int, list[tuple[int, bytes]]]:
    """``(attempt, first_seq, [(tag, payload), ...])`` of a segment, every part checked.

    Raises:
        CorruptSegment: not a segment map, or a part of the wrong type or range.
    """
    try:
        obj = codec.unpack_plain(data)  # bounded: a segment of a million empty frames is refused
    except Exception as e:
        raise _corrupt(where, f"not a journal segment ({type(e).__name__})") from None
    if type(obj) is not dict:
        raise _corrupt(where, "not a journal segment (no map)")
    attempt, first, frames = obj.get("a"), obj.get("s"), obj.get("f")
    if type(attempt) is not int or attempt < 0 or type(first) is not int or first < 0:
        raise _corrupt(where, "the segment's attempt and first seq are not integers >= 0")
    if type(frames) is not list:
        raise _corrupt(where, "the segment's frames are not a list")
    out = []
    for frame in frames:
        if (
            type(frame) is not list
            or len(frame) != 2
            or type(frame[0]) is not int
            or frame[0] not in _TAGS
            or type(frame[1]) is not bytes
        ):
            raise _corrupt(where, "a frame is not a pair of a known tag and bytes")
        out.append((frame[0], frame[1]))
    return attempt, first, out


def _corrupt(where: str, what: str) -> CorruptSegment:
    return CorruptSegment(
        f"read {where}", what, "the object is corrupt; the stream cannot be read past it"
    )


def check_frame(payload: bytes, op: str) -> None:
    """Refuse a frame payload that readers would refuse to fetch.

    Raises:
        InvalidArgument: ``payload`` is larger than ``MAX_FRAME_BYTES``.
    """
    if len(payload) > MAX_FRAME_BYTES:
        raise InvalidArgument(
            op,
            f"the encoded value is {len(payload)} bytes, over the frame limit of "
            f"{MAX_FRAME_BYTES} bytes",
            "write large outputs with dls.run.write and send their keys instead",
            size=len(payload),
            limit=MAX_FRAME_BYTES,
        )


def segment_seq(key: str) -> int | None:
    """The first seq a segment's key names (its last part, 12 digits); None if it names none."""
    name = key.rsplit("/", 1)[-1]
    return int(name) if _SEQ_NAME.match(name) else None


def fetch_segment(store: Store, key: str, max_bytes: int = MAX_SEGMENT_BYTES) -> bytes:
    """The bytes of one segment or topic post, never more than ``max_bytes``.

    Raises:
        CorruptSegment: the object is larger than any segment lakeshore writes.
        NotFound: the object is gone.
        StoreError: the store failed.
    """
    try:
        return store.get(key, max_bytes=max_bytes)[0]
    except TooLarge as e:
        raise _corrupt(
            key,
            f"the object is {e.details.get('size')} bytes, more than any segment "
            f"({max_bytes}); it was not read",
        ) from None


def to_frame(attempt: int, seq: int, payload: bytes) -> Frame:
    """The value frame ``seq`` of ``attempt``, its payload decoded.

    Raises:
        DecodeError: the payload is not a lakeshore value.
    """
    return Frame(seq, codec.decode(payload, "frame"), attempt)


class JournalWriter:
    """Batches frames of one attempt into create-only segments under ``prefix``.

    ``key_of(first_seq)`` names a segment. Thread-safe: the body adds frames from its thread
    while a timer flushes old batches from another.
    """

    def __init__(
        self,
        store: Store,
        key_of: Any,
        attempt: int,
        *,
        flush_frames: int = 1024,
        flush_bytes: int = 256 * 1024,
        flush_age_s: float = 0.05,
    ) -> None:
        self.store = store
        self.key_of = key_of
        self.attempt = attempt
        self.flush_frames = flush_frames
        self.flush_bytes = flush_bytes
        self.flush_age_s = flush_age_s
        self.frames = 0  # frames written or pending
        self.segments = 0
        self._pending: list[tuple[int, bytes]] = []
        self._pending_bytes = 0
        self._first = 0
        self._oldest = 0.0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._error: BaseException | None = None
        # started by the first frame: most attempts stream nothing and log nothing, and a
        # thread per writer per attempt would be pure overhead on the hot path
        self._timer: threading.Thread | None = None

    def add(self, payload: bytes) -> None:
        """Append a VALUE frame (already encoded).

        Raises:
            InvalidArgument: the payload is larger than ``MAX_FRAME_BYTES``.
        """
        check_frame(payload, "stream a value")
        with self._lock:
            self._raise_if_failed()
            if self._pending and self._pending_bytes + len(payload) > MAX_FRAME_BYTES:
                self._flush_locked()  # keeps every segment within what readers fetch
            if self._timer is None:
                self._timer = threading.Thread(
                    target=self._age_loop, name="lakeshore-journal", daemon=True
                )
                self._timer.start()
            if not self._pending:
                self._oldest = time.monotonic()
                self._wake.notify()
            self._pending.append((VALUE, payload))
            self._pending_bytes += len(payload)
            self.frames += 1
            if len(self._pending) >= self.flush_frames or self._pending_bytes >= self.flush_bytes:
                self._flush_locked()

    def close(self, tag: int | None = None, payload: bytes = b"\xc0") -> None:
        """Flush what is pending, with a final END or ERROR frame when ``tag`` is given."""
        with self._lock:
            self._closed = True
            self._wake.notify()
            if tag is not None:
                self._pending.append((tag, payload))
                self.frames += 1
            if self._pending:
                self._flush_locked()
            self._raise_if_failed()

    def _flush_locked(self) -> None:
        first, batch = self._first, self._pending
        self._pending, self._pending_bytes = [], 0
        self._first += len(batch)
        try:
            self.store.put(self.key_of(first), encode_segment(self.attempt, first, batch), CREATE)
            self.segments += 1
        except BaseException as e:  # surfaced to the body on its next yield
            self._error = e

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _age_loop(self) -> None:
        with self._lock:
            while not self._closed:
                if not self._pending:
                    self._wake.wait()
                    continue
                due = self._oldest + self.flush_age_s - time.monotonic()
                if due > 0:
                    self._wake.wait(due)
                    continue
                self._flush_locked()


def read_segments(
    store: Store,
    prefix: str,
    start_after: str | None = None,
    since: int = 0,
    max_bytes: int = MAX_SEGMENT_BYTES,
) -> Iterator[tuple[str, int, int, list[tuple[int, bytes]]]]:
    """Yield ``(key, attempt, first_seq, frames)`` for the segments under ``prefix``, in order.

    A segment's key names its first seq, so the listing alone shows which segments hold only
    frames before ``since``: those are not fetched (resuming far into a journal costs the
    listing and the segments from ``since`` on, whatever came before). Seqs count from 0 in
    each attempt's folder, so only a segment followed by another of the *same* folder can be
    judged that way: the last segment of a folder is always read (a listing over several
    attempts' folders, such as every attempt's logs, reads each attempt's last segment). No
    object larger than ``max_bytes`` is fetched.

    Raises:
        CorruptSegment: a segment is malformed, too large, or names another first seq than
            its key.
        StoreError: the store failed.
    """
    held: str | None = None  # the last listed key, fetched once its successor is known
    for info in store.list(prefix, start_after=start_after):
        if held is not None:
            nxt = segment_seq(info.key)
            if nxt is None or nxt > since or not _same_folder(held, info.key):
                yield _read_one(store, held, max_bytes)  # it may hold frames >= since
        held = info.key
    if held is not None:
        yield _read_one(store, held, max_bytes)


def _same_folder(a: str, b: str) -> bool:
    """Whether two segment keys are in one folder: one attempt's, whose seqs go on."""
    return a.rpartition("/")[0] == b.rpartition("/")[0]


def _read_one(
    store: Store, key: str, max_bytes: int
) -> tuple[str, int, int, list[tuple[int, bytes]]]:
    attempt, first, frames = decode_segment(fetch_segment(store, key, max_bytes), key)
    named = segment_seq(key)
    if named is not None and named != first:  # the name is what readers skip by: it must hold
        raise _corrupt(key, f"the segment's first seq {first} is not the {named} its key names")
    return key, attempt, first, frames
