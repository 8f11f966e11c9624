"""Topics: the journal as pub/sub, with many producers in many processes.

Each post is one create-only object ``lakeshore/<ns>/_topics/<name>/<seq>``: a producer takes
the next sequence number by creating its object, and one that loses the race tries the next.
So no seq is used twice or skipped, and a retried post cannot duplicate a frame (its bytes
carry a unique post id, so an ambiguous create is resolved by reading back). A handle finds
the tail without listing the whole topic; its probes only choose where the listing starts, so
a hole can make it longer, never wrong.

Readers follow the topic from a cursor (``stream``, ``listen``). ``close()`` posts an END
frame, after which every post is refused. ``trim`` always keeps the newest post, so the
numbering survives. Posting, reading and trimming step by step: docs/protocol.md#topics.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

from lakeshore import codec
from lakeshore.errors import (
    Conflict,
    CorruptSegment,
    InvalidArgument,
    NotFound,
    TooLarge,
    TopicClosed,
)
from lakeshore.keys import seq_name, topic_prefix
from lakeshore.protocol import polling
from lakeshore.store.base import CREATE, Store
from lakeshore.streams.journal import (
    END,
    VALUE,
    Frame,
    check_frame,
    decode_segment,
    encode_segment,
    fetch_segment,
    segment_seq,
    to_frame,
)

__all__ = ["Topic", "decode_post"]

_PAGE = 1000  # keys of one LIST page (S3's): a topic this short is located by one LIST
_MAX_SEQ = 10**12 - 1


def decode_post(data: bytes, where: str) -> tuple[int, bytes]:
    """The tag (VALUE or END) and the encoded value of one post, its wrapping checked.

    Raises:
        CorruptSegment: not a one-frame segment holding a ``{"post", "payload"}`` map.
        DecodeError: the wrapping map is not a lakeshore value.
    """
    _, _, frames = decode_segment(data, where)
    if len(frames) != 1:
        raise CorruptSegment(
            f"read {where}", f"a post holds {len(frames)} frames, not 1", "the post is corrupt"
        )
    tag, body = frames[0]
    if tag not in (VALUE, END):  # only journals end in an ERROR frame
        raise CorruptSegment(
            f"read {where}",
            "a post holds an ERROR frame, which no topic writes",
            "the post is corrupt",
        )
    inner = codec.decode(body, f"post {where}")
    if type(inner) is not dict or type(inner.get("payload")) is not bytes:
        raise CorruptSegment(
            f"read {where}", "the post does not wrap an encoded value", "the post is corrupt"
        )
    return tag, inner["payload"]


def _seq_of(key: str) -> int | None:
    """The seq a post key names; None for a foreign object in the topic's folder."""
    return segment_seq(key)


class Topic:
    """A named stream of frames in a namespace; safe for many producers and readers.

    Raises (constructor):
        InvalidArgument: a bad topic or namespace name.
    """

    def __init__(self, store: Store, ns: str, name: str) -> None:
        self.store = store
        self.name = name
        self.prefix = topic_prefix(ns, name)
        self._next = 0  # a lower bound for the next free seq; LIST finds the real one
        self._own_last = -1  # the seq of our own last VALUE post: known not to be END
        self._located = False  # _next was set near the tail (see _locate)
        self._lock = threading.Lock()  # one post at a time per handle (handles are shared)

    def __repr__(self) -> str:
        return f"Topic({self.name!r} on {self.store.url})"

    def _key(self, seq: int) -> str:
        return self.prefix + seq_name(seq)

    def _exists(self, seq: int) -> bool:
        """Whether post ``seq`` exists; its body is never fetched."""
        try:
            self.store.get(self._key(seq), max_bytes=0)
        except NotFound:
            return False
        except TooLarge:
            return True
        return True

    def _locate(self) -> int:
        """A lower bound of the first free seq, at most one page below it, found at a cost
        that does not grow with the topic's length: one page of the listing from the start
        (exact for a topic of up to a page), else existence probes that gallop from the
        page's last post and bisect until the gap is one page. A probe that lands in a hole
        only moves the bound down; the listing from the bound finds the true tail."""
        last = -1
        for listed, info in enumerate(self.store.list(self.prefix), 1):
            seq = _seq_of(info.key)
            if seq is not None:
                last = max(last, seq)
            if listed >= _PAGE:
                break
        else:
            return last + 1  # the whole topic fit in one page
        if last < 0:
            return 0  # a page of foreign objects: list it all
        lo, step, hi = last, _PAGE, -1
        while hi < 0:  # gallop: lo exists, lo + step is tried next
            probe = min(lo + step, _MAX_SEQ)
            if probe == lo:
                return lo + 1
            if self._exists(probe):
                lo, step = probe, step * 2
            else:
                hi = probe
        while hi - lo > _PAGE:  # bisect: lo exists, hi was missing
            mid = (lo + hi) // 2
            if self._exists(mid):
                lo = mid
            else:
                hi = mid
        return lo + 1

    def _tail(self) -> int:
        """The first free seq at or after what we know (LIST from our last known key)."""
        if not self._located:
            self._next = max(self._next, self._locate())
            self._located = True
        start = self._key(self._next - 1) if self._next > 0 else None
        nxt = self._next
        for info in self.store.list(self.prefix, start_after=start):
            seq = _seq_of(info.key)
            if seq is not None:
                nxt = max(nxt, seq + 1)
        self._next = nxt
        return nxt

    def post(self, value: Any) -> int:
        """Append ``value``; return its seq.

        Raises:
            TopicClosed: the topic was closed.
            InvalidArgument: the value cannot be sent.
            StoreError: the store failed.
        """
        payload = codec.encode(value, f"post to topic {self.name}")
        check_frame(payload, f"post to topic {self.name}")
        return self._append(VALUE, payload)

    def close(self) -> int:
        """Post the final END frame; readers stop there. Returns its seq.

        Raises:
            TopicClosed: already closed.
        """
        return self._append(END, codec.encode(None))

    def _append(self, tag: int, payload: bytes) -> int:
        with self._lock:
            return self._append_locked(tag, payload)

    def _append_locked(self, tag: int, payload: bytes) -> int:
        # The post id makes every post's bytes unique (ambiguous creates resolve by read-back).
        body = codec.encode({"post": secrets.token_hex(8), "payload": payload})
        seq = self._tail()
        backoff = 0.001
        while True:
            if seq > 0 and seq - 1 != self._own_last and self._tag_at(seq - 1) == END:
                raise TopicClosed(
                    f"post to topic {self.name}",
                    "the topic was closed",
                    "use a new topic name, or read this one to its END",
                )
            try:
                self.store.put(self._key(seq), encode_segment(0, seq, [(tag, body)]), CREATE)
            except Conflict:
                # Another producer took this seq: find the new tail, spread out a little.
                time.sleep(random.uniform(0, backoff))
                backoff = min(backoff * 2, 0.05)
                seq = max(seq + 1, self._tail())
                continue
            self._next = seq + 1
            if tag == VALUE:
                self._own_last = seq
            return seq

    def _tag_at(self, seq: int) -> int:
        return decode_post(fetch_segment(self.store, self._key(seq)), self._key(seq))[0]

    def _read(self, since: int, after: str | None) -> Iterator[tuple[str, Frame | None]]:
        """``(key, frame)`` of each post from ``since`` on; ``None`` for the END post."""
        for info in self.store.list(self.prefix, start_after=after):
            seq = _seq_of(info.key)
            if seq is None or seq < since:
                continue
            tag, payload = decode_post(fetch_segment(self.store, info.key), info.key)
            yield info.key, None if tag == END else to_frame(0, seq, payload)

    def stream(self, since: int = 0) -> Iterator[Frame]:
        """The frames posted so far, from ``since`` on; stops at the current end (or END).

        Raises:
            StoreError: the store failed.
        """
        start = self._key(since - 1) if since > 0 else None
        for _, frame in self._read(since, start):
            if frame is None:  # the END post
                return
            yield frame

    def listen(
        self, since: int = 0, timeout: float | None = None, max_poll_s: float = 0.5
    ) -> Iterator[Frame]:
        """Follow the topic live from ``since``: yields new frames as they are posted, ends at
        END, or after ``timeout`` seconds without a new frame (None: wait for good).

        Raises:
            StoreError: the store failed.
        """
        after = self._key(since - 1) if since > 0 else None
        quiet_since = time.monotonic()
        delay = 0.005
        while True:
            got = False
            for key, frame in self._read(since, after):
                after, got = key, True
                if frame is None:  # the END post
                    return
                yield frame
            if got:
                quiet_since, delay = time.monotonic(), 0.005
                continue
            if timeout is not None and time.monotonic() - quiet_since >= timeout:
                return
            polling.pause(self.store, delay)  # no push from object storage: poll, backing off
            delay = min(delay * 2, max_poll_s)

    def trim(self, keep_last: int | None = None, older_than_s: float | None = None) -> int:
        """Delete old posts: all but the newest ``keep_last``, and/or those older than
        ``older_than_s`` (store clock). The newest post always stays. Returns how many went.

        Raises:
            InvalidArgument: neither limit given, or a negative one.
        """
        if (
            (keep_last is None and older_than_s is None)
            or (keep_last or 0) < 0
            or (older_than_s or 0) < 0
        ):
            raise InvalidArgument(
                f"trim topic {self.name}",
                "give keep_last and/or older_than_s, both >= 0",
                "e.g. trim(keep_last=1000) or trim(older_than_s=86400)",
            )
        infos = list(self.store.list(self.prefix))
        keep = max(1, keep_last if keep_last is not None else 1)
        doomed = infos[: max(0, len(infos) - keep)] if keep_last is not None else infos[:-1]
        if older_than_s is not None:
            cutoff = self.store.now() - older_than_s
            doomed = [i for i in doomed if i.last_modified < cutoff]
        for info in doomed:
            self.store.delete(info.key)
        return len(doomed)
