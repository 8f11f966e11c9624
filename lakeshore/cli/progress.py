"""The status line of ``lakeshore worker`` on a terminal, below its log lines:

    worker: 2 running, 17 attempts done: 14 succeeded, 1 failed, 2 retried

**Where the counts come from.** The worker's own records on the ``lakeshore.worker``
logger, by the ``attempt_event`` they carry: ``started`` (a debug record), ``ended`` (with
the state the attempt left, ``attempt_outcome``) and ``unconcluded`` (its outcome could not
be written). Nothing of the worker's state is read, so the line never
disagrees with the log. The line holds numbers and fixed words only: no text from the store
reaches it.

**Drawing.** A carriage return and spaces, no escape sequence: any terminal can show it. The
line is blanked before a log line is written and drawn again after it, so log lines stay
whole; its text changes at most once per ``interval`` (a quarter of a second).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TextIO

__all__ = ["StatusLine", "Tally", "show_progress", "worker_log"]

# outcome word -> label, in the order the line shows them; succeeded and failed always
_LABELS = {
    "succeeded": "succeeded",
    "failed": "failed",
    "queued": "retried",  # the attempt failed; the invocation waits for another one
    "timeout": "timed out",
    "killed": "killed",
    "released": "released",
    "lost": "lost",  # fenced, or the outcome could not be written
    "other": "other",
}
_LOST = ("fenced",)
_INTERVAL_S = 0.25


class Tally(logging.Handler):
    """Counts the worker's attempts from its log records (attach it to ``lakeshore.worker``,
    at ``DEBUG``: the start of an attempt is a debug record)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._counts_lock = threading.Lock()
        self.running = 0
        self.outcomes: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        # the worker marks the records of an attempt's life with ``attempt_event`` (and the
        # ended one with ``attempt_outcome``): read those, never the wording of the message
        event = getattr(record, "attempt_event", None)
        if event == "started":
            with self._counts_lock:
                self.running += 1
            return
        if event == "ended":
            word = str(getattr(record, "attempt_outcome", "")).split(" ", 1)[0]
            kind = "lost" if word in _LOST else word if word in _LABELS else "other"
        elif event == "unconcluded":
            kind = "lost"
        else:
            return
        with self._counts_lock:
            self.running = max(0, self.running - 1)
            self.outcomes[kind] += 1

    def text(self, final: bool = False) -> str:
        """The status line; ``final``: the summary once the worker ended (nothing runs)."""
        with self._counts_lock:
            running, outcomes = self.running, self.outcomes.copy()
        done = sum(outcomes.values())
        parts = [
            f"{outcomes[k]} {label}"
            for k, label in _LABELS.items()
            if outcomes[k] or k in ("succeeded", "failed")
        ]
        now = "" if final else f"{running} running, "
        return f"worker: {now}{done} attempt{'' if done == 1 else 's'} done: {', '.join(parts)}"


def _columns(stream: TextIO) -> int:
    """The terminal's width now (it may have been resized); 80 when it is no terminal or
    does not say (a new pseudo-terminal is 0 columns wide)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80


class StatusLine:
    """One line at the bottom of ``stream``, redrawn in place from ``text``."""

    def __init__(
        self,
        stream: TextIO,
        text: Callable[[], str],
        *,
        interval: float = _INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._text = text
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._shown = ""  # the text on the line now ("" when blank)
        self._used = 0  # columns written on the line since it was last blanked
        self._drawn_at: float | None = None
        self._closed = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def start(self) -> None:
        """Redraw from a thread of its own, so the counts move when no log line is written
        (at ``--log-level warning``, or while long attempts run)."""
        self._ticker = threading.Thread(target=self._tick, name="lakeshore-status", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        # twice per interval: a change waits for at most one and a half intervals
        while not self._stop.wait(self._interval / 2):
            self.refresh()

    def refresh(self) -> None:
        """Draw the text if it changed and the last change drawn is ``interval`` old."""
        with self._lock:
            if self._closed:
                return
            now = self._clock()
            if self._drawn_at is not None and now - self._drawn_at < self._interval:
                return
            text = self._fit(self._text())
            if text != self._shown:
                self._draw(text)
                self._drawn_at = now

    @contextlib.contextmanager
    def cleared(self) -> Iterator[None]:
        """Blank the line while the block writes (a log line), then draw it again as it
        was: new counts wait for ``refresh``, so a burst of log lines does not make the
        line change faster than once per interval."""
        with self._lock:
            if self._closed:
                yield
                return
            shown = self._shown
            self._blank()
            try:
                yield
            finally:
                if shown:
                    self._draw(shown)

    def close(self, final: str | None = None) -> None:
        """Stop redrawing and blank the line; write ``final`` in its place, as a line."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(5)
        with self._lock:
            if self._closed:
                return
            self._blank()
            if final is not None:
                self._write(final + "\n")
            self._closed = True

    def _fit(self, text: str) -> str:
        # shorter than the terminal: a line that wraps cannot be taken back with a \r
        return text[: max(0, _columns(self._stream) - 1)]

    def _draw(self, text: str) -> None:
        self._write("\r" + text + " " * (self._used - len(text)))  # covers a longer one
        self._shown, self._used = text, max(self._used, len(text))

    def _blank(self) -> None:
        if self._used:
            self._write("\r" + " " * self._used + "\r")
        self._shown, self._used = "", 0

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # the terminal went away: the log reports the rest
            self._closed = True


class _ClearingHandler(logging.StreamHandler[TextIO]):
    """Writes log records on the stream, with the status line (if any) out of the way."""

    def __init__(self, stream: TextIO, status: StatusLine | None) -> None:
        super().__init__(stream)
        self.status = status

    def emit(self, record: logging.LogRecord) -> None:
        if self.status is None:
            super().emit(record)
            return
        with self.status.cleared():
            super().emit(record)


def show_progress(flag: bool | None, stream: TextIO | None) -> bool:
    """``--progress`` / ``--no-progress``, else whether ``stream`` is a terminal: a log
    file or a pipe gets the log lines only."""
    if flag is not None:
        return flag
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):  # closed
        return False


@contextlib.contextmanager
def worker_log(
    level: int, formatter: logging.Formatter, progress: bool, stream: TextIO | None = None
) -> Iterator[None]:
    """Log records of ``level`` and up on ``stream`` (stderr) with ``formatter``, as the
    root handler; with ``progress``, keep the status line of the worker's attempts below
    them while the block runs, and leave its summary when the block ends without error."""
    out = stream if stream is not None else sys.stderr
    tally = Tally() if progress else None
    status = StatusLine(out, tally.text) if tally is not None else None
    handler = _ClearingHandler(out, status)
    handler.setFormatter(formatter)
    # the handler filters, not only the root: with a status line the worker's logger is
    # opened to DEBUG records, which must still not be printed below ``level``
    handler.setLevel(level)
    logging.basicConfig(level=level, handlers=[handler])
    if tally is None or status is None:
        yield
        return
    worker = logging.getLogger("lakeshore.worker")
    before = worker.level
    worker.setLevel(logging.DEBUG)
    worker.addHandler(tally)
    status.start()
    try:
        yield
    except BaseException:
        status.close()  # the error the command prints next gets a clean line
        raise
    else:
        status.close(tally.text(final=True))
    finally:
        worker.removeHandler(tally)
        worker.setLevel(before)
