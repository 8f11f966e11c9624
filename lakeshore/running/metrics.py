"""A worker's own counters in a Prometheus text file, and the atomic write of such a file.

node_exporter's textfile collector reads every ``*.prom`` file of its folder at each
scrape: a file it reads half-written would be a failed scrape, so :func:`write_textfile`
writes a temporary file in the same folder and renames it over the old one (a rename in
one file system is atomic). The worker rewrites its file at the cadence of its sign of
life, at its start and at its stop (``run_worker(metrics_textfile=...)``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections import Counter
from pathlib import Path

from lakeshore.errors import InvalidArgument
from lakeshore.model.metrics import Family, exposition

__all__ = ["WorkerCounters", "check_textfile", "write_textfile"]


def check_textfile(path: str | os.PathLike[str], op: str) -> Path:
    """``path`` as a textfile's place: its folder must exist (a typo there would only be
    found at the first write, by a warning in a worker's log).

    Raises:
        InvalidArgument: the folder does not exist.
    """
    target = Path(path)
    if not target.parent.is_dir():
        raise InvalidArgument(
            op,
            f"no folder {str(target.parent)!r} for the file {target.name!r}",
            "create it, or give another path",
        )
    return target


def write_textfile(path: str | os.PathLike[str], text: str) -> None:
    """Replace the file at ``path`` with ``text`` at once: a reader sees the old file or
    the new one, never a part.

    Raises:
        InvalidArgument: the folder does not exist.
        OSError: the file cannot be written.
    """
    target = check_textfile(path, "metrics")
    folder = target.parent
    # a leading dot: node_exporter reads only *.prom, so it never sees the temporary file
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600: the collector may run as another user
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class WorkerCounters:
    """What one worker has run, per queue: attempts ended, by the state each left its
    invocation in (``succeeded``, ``failed``, ``queued`` for a retry to come, ...;
    ``unconcluded`` when the outcome could not be written). Thread-safe."""

    def __init__(self, worker: str, ns: str) -> None:
        self.worker, self.ns = worker, ns
        self._lock = threading.Lock()
        self._ended: Counter[tuple[str, str]] = Counter()

    def ended(self, queue: str, outcome: str) -> None:
        """Count one attempt of ``queue`` that ended as ``outcome``."""
        with self._lock:
            self._ended[(queue, outcome or "released")] += 1

    def families(self, running: dict[str, int], queues: list[str], at: float) -> list[Family]:
        """The counters and what runs now (``running``: queue -> attempts), as metrics;
        ``at`` is the time of the write (seconds since the epoch)."""
        who = {"namespace": self.ns, "worker": self.worker}
        with self._lock:
            ended = dict(self._ended)
        total = Family(
            "lakeshore_worker_attempts_total",
            "Attempts this worker process ran to their end, by queue and by the state each "
            "left its invocation in (queued: a retry to come).",
            "counter",
        )
        for (queue, outcome), n in sorted(ended.items()):
            total.add(n, **who, queue=queue, outcome=outcome)
        now = Family("lakeshore_worker_running", "Attempts this worker is running now, by queue.")
        for queue in sorted({*queues, *running}):
            now.add(running.get(queue, 0), **who, queue=queue)
        stamp = Family(
            "lakeshore_worker_last_write_timestamp_seconds",
            "When the worker made this text: its file's last write, or this scrape of its "
            "--metrics-port (seconds since the epoch).",
        )
        stamp.add(at, **who)
        return [total, now, stamp]

    def text(self, running: dict[str, int], queues: list[str], at: float) -> str:
        """:meth:`families` as Prometheus text."""
        return exposition(self.families(running, queues, at))
