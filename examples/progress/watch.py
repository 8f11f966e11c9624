"""Follow an invocation's progress by its id alone, and resume where it stopped when run again.

This process never saw the submit: the id, the store and the namespace are all it needs.

    python examples/progress/watch.py <id>            # stop it any time, run it again: it resumes
    python examples/progress/watch.py <id> --since 0  # replay the current attempt from the start

The cursor (the attempt being read and the next seq) goes to a small state file after every
frame, so a restarted watcher asks the stream for exactly the frames it has not shown yet.
Ctrl-C and SIGTERM stop it between two frames. After a SIGKILL, the one frame shown but not
yet saved may be shown again. Exit codes: 0 the invocation succeeded, 1 it failed, was cancelled or
timed out, 2 bad id or state file, 130 / 143 stopped by SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import lakeshore as dls

# Each stream call returns after this long, so a stop request never waits for a new frame.
POLL_S = 1.0


@dataclass(frozen=True)
class Cursor:
    """Where to resume: ``since`` in ``attempt`` (None: whichever attempt is current)."""

    since: int = 0
    attempt: int | None = None


def load_cursor(path: Path, inv: str) -> Cursor:
    """The cursor saved for ``inv``; from the start when nothing was saved yet.

    Raises:
        ValueError: the file belongs to another id, or is not a state file.
    """
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return Cursor()
    if not isinstance(state, dict) or state.get("id") != inv:
        raise ValueError(f"it belongs to another id than {inv}")
    return Cursor(int(state["since"]), state["attempt"])


def save_cursor(path: Path, inv: str, cursor: Cursor) -> None:
    # Write beside, then rename: a watcher killed mid-write leaves the old state, never half.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"id": inv, "since": cursor.since, "attempt": cursor.attempt}))
    os.replace(tmp, path)


def describe(value: Any, width: int = 30) -> str:
    """A progress bar for ``{"step": i, "of": n}``; anything else as it is."""
    if not (isinstance(value, dict) and {"step", "of"} <= value.keys()):
        return repr(value)
    step, of = int(value["step"]), max(int(value["of"]), 1)
    filled = min(width, width * step // of)
    return f"[{'#' * filled}{'.' * (width - filled)}] {step}/{of}"


class Stop:
    """Remembers a SIGINT or SIGTERM; the loop stops at its next chance."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum


def watch(q: dls.Dispatch, inv: str, cursor: Cursor, state: Path, stop: Stop) -> int:
    """Show frames from ``cursor`` until the stream ends or ``stop`` is set; the exit code."""
    tty = sys.stdout.isatty()
    told_queued = False
    while stop.signum is None:
        try:
            for frame in q.stream(inv, since=cursor.since, attempt=cursor.attempt, timeout=POLL_S):
                if cursor.attempt is not None and frame.attempt != cursor.attempt:
                    _note(f"attempt {cursor.attempt} was retried: attempt {frame.attempt} restarts")
                _show(f"{describe(frame.value)}  (seq {frame.seq}, attempt {frame.attempt})", tty)
                cursor = Cursor(frame.seq + 1, frame.attempt)
                save_cursor(state, inv, cursor)
                if stop.signum is not None:
                    break
            else:
                _end_line(tty)
                print(f"done: {inv} succeeded", flush=True)
                return 0
        except dls.NotFinished as e:
            if e.state == "queued" and not told_queued:
                _note(f"{inv} is queued: waiting for a worker")
                told_queued = True
        except dls.JobError as e:
            _end_line(tty)
            _note(f"{inv} ended {e.state}: {e.remote_type}: {e.remote_message}")
            return 1
    _end_line(tty)
    where = f"seq {cursor.since} of attempt {cursor.attempt}" if cursor.attempt else "the start"
    _note(f"stopped at {where}; run again to resume")
    return 128 + stop.signum


def _show(line: str, tty: bool) -> None:
    # On a terminal one line redraws itself; in a pipe or a log, one line per frame.
    if tty:
        print(f"\r{line}\x1b[K", end="", flush=True)
    else:
        print(line, flush=True)


def _end_line(tty: bool) -> None:
    if tty:
        print(flush=True)


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("id", help="the invocation id that submit.py printed")
    parser.add_argument(
        "--since", type=int, help="start at this seq of the current attempt (default: resume)"
    )
    parser.add_argument(
        "--state", type=Path, help="cursor file (default: one per id in the temporary directory)"
    )
    parser.add_argument("--url", help="store URL (default: $LAKESHORE_URL, else ~/.lakeshore)")
    parser.add_argument("--ns", default="progress-example", help="namespace of the invocation")
    args = parser.parse_args(argv)
    state = args.state or Path(tempfile.gettempdir()) / f"lakeshore-watch-{args.id}.json"
    try:
        cursor = Cursor(args.since) if args.since is not None else load_cursor(state, args.id)
    except (ValueError, KeyError) as e:
        _note(f"watch: {state}: unreadable state ({e}) — pass another --state, or --since")
        return 2
    if cursor.since:
        which = "the current attempt" if cursor.attempt is None else f"attempt {cursor.attempt}"
        _note(f"resuming {args.id} at seq {cursor.since} of {which}")
    stop = Stop()
    try:
        return watch(dls.Dispatch(args.url, ns=args.ns), args.id, cursor, state, stop)
    except (dls.NotFound, dls.InvalidArgument) as e:
        _note(f"watch: {e}")  # a bad id, or another store or namespace
        return 2


if __name__ == "__main__":
    sys.exit(main())
