"""Per-attempt logs: what a body prints (stdout, stderr) and logs (``logging``), kept in storage.

Capture works by routing, not by swapping streams per attempt: once installed, ``sys.stdout`` and
``sys.stderr`` are routers that send each write to the *sink* of the attempt running in the
current context (a context variable), or to the original stream when no attempt runs there.
A handler on the root logger routes log records the same way. Concurrent bodies in one worker
(threads) therefore never mix their logs. Output written below Python (C libraries writing to
file descriptor 1, child programs) is not captured.

Sinks feed a :class:`~lakeshore.streams.journal.JournalWriter` whose frames are text chunks, stored
under ``<id>/logs/<attempt>/<seq>`` in batched segments (a silent body writes nothing).
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from lakeshore import codec
from lakeshore.keys import QueueKeys
from lakeshore.store.base import Store
from lakeshore.streams.journal import JournalWriter, read_segments

__all__ = ["Sink", "capture", "log_writer", "logging_is_set_up", "read_logs"]

Sink = Callable[[str], None]
_SINK: contextvars.ContextVar[Sink | None] = contextvars.ContextVar("lakeshore_log", default=None)
_install_lock = threading.Lock()
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Router(io.TextIOBase):
    """A text stream that writes to the current attempt's sink, else to ``original``."""

    def __init__(self, original: Any) -> None:
        self.original = original

    def write(self, text: str) -> int:
        sink = _SINK.get()
        if sink is None:
            return int(self.original.write(text))
        sink(text)
        return len(text)

    def flush(self) -> None:
        if _SINK.get() is None:
            self.original.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:  # faulthandler, subprocess and friends want the real stream
        return int(self.original.fileno())

    def __getattr__(self, name: str) -> Any:  # buffer, errors, ...: those of the original
        return getattr(self.original, name)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.original, "encoding", "utf-8"))


class _RouteHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.setFormatter(logging.Formatter(_LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        sink = _SINK.get()
        if sink is not None:
            try:
                sink(self.format(record) + "\n")
            except Exception:  # a log line must never break the body
                self.handleError(record)
        else:
            # outside a body: being on the root, this handler keeps Python from showing a
            # warning of a program that set up no logging; show it as Python would have
            last, source = logging.lastResort, logging.getLogger(record.name)
            if last is not None and record.levelno >= last.level:
                shown_elsewhere = logging_is_set_up(source)
                if not shown_elsewhere:
                    last.handle(record)


def logging_is_set_up(logger: logging.Logger) -> bool:
    """Whether someone set up logging that would show ``logger``'s records: a handler on it
    or an ancestor, other than the one capture adds to the root (which shows only what a
    body logs, inside its capture)."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, _RouteHandler) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def _install() -> None:
    with _install_lock:
        if not isinstance(sys.stdout, _Router):
            sys.stdout = _Router(sys.stdout)
        if not isinstance(sys.stderr, _Router):
            sys.stderr = _Router(sys.stderr)
        root = logging.getLogger()
        if not any(isinstance(h, _RouteHandler) for h in root.handlers):
            root.addHandler(_RouteHandler())


@contextlib.contextmanager
def capture(sink: Sink | None) -> Iterator[None]:
    """Send this context's prints and log records to ``sink`` inside the block."""
    if sink is None:
        yield
        return
    _install()
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


def log_writer(store: Store, keys: QueueKeys, inv: str, attempt: int) -> JournalWriter:
    """The writer of one attempt's logs: batches flushed every half second or 64 KiB."""
    return JournalWriter(
        store,
        lambda seq: keys.logs(inv, attempt, seq),
        attempt,
        flush_frames=4096,
        flush_bytes=64 * 1024,
        flush_age_s=0.5,
    )


def text_sink(writer: JournalWriter) -> Sink:
    def sink(text: str) -> None:
        # Output is best effort: a store that refuses a log segment must not fail the body
        # (its print would raise) — the segment is lost, the body goes on.
        if text:
            with contextlib.suppress(Exception):
                writer.add(codec.encode(text, "log text"))

    return sink


def read_logs(
    store: Store, keys: QueueKeys, inv: str, attempt: int | None = None, start_after: str = ""
) -> Iterator[tuple[str, int, str]]:
    """Yield ``(segment key, attempt, text)`` of the stored log segments, in order."""
    prefix = keys.logs_prefix(inv, attempt)
    for key, att, _first, frames in read_segments(store, prefix, start_after or None):
        text = "".join(str(codec.decode(p, "log text")) for _k, p in frames)
        yield key, att, text


def follow_logs(
    store: Store,
    keys: QueueKeys,
    inv: str,
    finished: Callable[[], bool],
    attempt: int | None = None,
    timeout: float | None = None,
    poll_s: float = 0.5,
) -> Iterator[tuple[int, str]]:
    """Yield ``(attempt, text)`` as segments appear, until ``finished()`` is true and one
    last read found nothing new (or ``timeout`` seconds passed)."""
    last = ""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done = finished()
        for key, att, text in read_logs(store, keys, inv, attempt, last):
            last = key
            yield att, text
        if done or (deadline is not None and time.monotonic() >= deadline):
            return
        time.sleep(poll_s)  # polling the store is the only way to learn of new output
