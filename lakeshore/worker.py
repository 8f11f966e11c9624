"""``run_worker``: claim invocations, run their bodies, write their outcomes.

One loop per slot (``concurrency`` slots in threads). Each attempt gets a heartbeat thread
that pushes the record's lease out every ``lease_s / 3`` seconds; when that write meets a
changed record it re-reads it and stops the body if the invocation was cancelled or the lease
was lost. A worker that cannot heartbeat for a whole lease stops the body itself (it must
assume another worker has taken over). Idle polling backs off up to ``max_poll_s``, and idle
workers reap expired leases of crashed workers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakeshore import codec, lifecycle
from lakeshore.admission import sweep_rate
from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    LakeshoreError,
    NotFound,
    StoreError,
    StoreUnavailable,
)
from lakeshore.journal import END, ERROR, JournalWriter
from lakeshore.protocol import Claimed, QueueOps
from lakeshore.record import Record, RecordError
from lakeshore.runner import (
    Outcome,
    RunSpec,
    error_of,
    run_in_process,
    run_in_thread,
    unpickle,
)
from lakeshore.udf import Udf, UnknownFunction, body_kind, resolve

if TYPE_CHECKING:
    from lakeshore.dispatch import Dispatch

__all__ = ["run_worker"]

log = logging.getLogger("lakeshore.worker")
_ISOLATIONS = ("auto", "thread", "process")


@dataclass
class _State:
    """What the slots of one worker share."""

    plane: Dispatch
    worker_id: str
    isolation: str
    max_jobs: int | None
    stop: threading.Event
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: int = 0
    done: int = 0
    last_reap: float = 0.0

    def take_slot(self) -> bool:
        with self.lock:
            if self.max_jobs is not None and self.started >= self.max_jobs:
                return False
            self.started += 1
            return True

    def give_back(self) -> None:
        with self.lock:
            self.started -= 1


def run_worker(
    plane: Dispatch,
    *,
    once: bool = False,
    queues: list[str] | None = None,
    concurrency: int = 1,
    isolation: str = "auto",
    max_jobs: int | None = None,
    idle_exit: float | None = None,
    max_poll_s: float = 1.0,
    worker_id: str | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve invocations from ``queues`` of ``plane``; return how many attempts it ran.

    Args:
        once: run at most one attempt: take one invocation that is claimable now, run it,
            return (0 if none was claimable; pass ``idle_exit`` to wait for one).
        queues: queue names; default: every queue the plane knows in this process.
        concurrency: attempts run at the same time (threads).
        isolation: ``"thread"``, ``"process"`` (a child per attempt: stoppable, crash-proof)
            or ``"auto"`` (a child when the invocation has a ``timeout_s``, else a thread).
        max_jobs: return after this many attempts.
        idle_exit: return after this many seconds without work.
        max_poll_s: longest pause between polls of an idle queue.
        worker_id: name in leases and logs; default ``host:pid``.
        stop: set it to stop claiming; running attempts finish first.

    Raises:
        InvalidArgument: a bad option.
    """
    if isolation not in _ISOLATIONS or concurrency < 1 or (max_jobs is not None and max_jobs < 1):
        raise InvalidArgument(
            "run_worker",
            f"bad options: isolation={isolation!r}, concurrency={concurrency}, max_jobs={max_jobs}",
            f"isolation is one of {_ISOLATIONS}; concurrency and max_jobs are >= 1",
        )
    if once and idle_exit is None:
        idle_exit = 0.0  # one pass over the queues
    state = _State(
        plane=plane,
        worker_id=worker_id or f"{socket.gethostname()}:{os.getpid()}",
        isolation=isolation,
        max_jobs=1 if once else max_jobs,
        stop=stop or threading.Event(),
    )
    names = queues or plane.queues()
    ops = [plane.ops(q) for q in names]
    if concurrency == 1 or once:
        _slot(state, ops, idle_exit, max_poll_s)
    else:
        slots = [
            threading.Thread(
                target=_slot, args=(state, ops, idle_exit, max_poll_s), name=f"lakeshore-slot-{i}"
            )
            for i in range(concurrency)
        ]
        for t in slots:
            t.start()
        for t in slots:
            t.join()
    return state.done


def _slot(state: _State, ops: list[QueueOps], idle_exit: float | None, max_poll_s: float) -> None:
    delay = 0.005
    idle_since = time.monotonic()
    turn = 0
    while not state.stop.is_set():
        if not state.take_slot():
            return
        held = None
        for i in range(len(ops)):
            q = ops[(turn + i) % len(ops)]
            try:
                held = q.claim(state.worker_id, state.plane.store.now())
            except StoreError as e:
                log.warning("claim on %s failed: %s", q.keys.queue, e)
            if held is not None:
                turn = (turn + i + 1) % len(ops)
                try:
                    _attempt(state, q, held)
                except LakeshoreError as e:
                    # The outcome could not be written (store down?): the lease will expire
                    # and the reaper retries the invocation. Keep serving.
                    log.error("attempt of %s could not be concluded: %s", held.record.id, e)
                with state.lock:
                    state.done += 1
                break
        if held is not None:
            delay, idle_since = 0.005, time.monotonic()
            _maybe_reap(state, ops)  # busy workers reap too, at the same modest rate
            continue
        state.give_back()
        _maybe_reap(state, ops)
        if idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
            return
        state.stop.wait(delay)
        delay = min(delay * 2, max_poll_s)


def _maybe_reap(state: _State, ops: list[QueueOps]) -> None:
    now = time.monotonic()
    with state.lock:
        if now - state.last_reap < min(5.0, state.plane.lease_s / 2):
            return
        state.last_reap = now
    for q in ops:
        try:
            moved = q.reap(q.store.now())
            if moved:
                log.info("reaped %d expired lease(s) on %s", moved, q.keys.queue)
            sweep_rate(q, q.store.now())  # rate tokens of long-past windows
        except StoreError as e:
            log.warning("reap on %s failed: %s", q.keys.queue, e)


class _Attempt:
    """One running attempt: the held record (guarded), its stop flag and why it stopped."""

    def __init__(self, ops: QueueOps, held: Claimed) -> None:
        self.ops = ops
        self.held = held
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.why = ""  # "killed" | "lost" | "timeout"
        self.finished = threading.Event()

    def halt(self, why: str) -> None:
        if not self.stop.is_set():
            self.why = why
            self.stop.set()

    def heartbeat_loop(self) -> None:
        rec = self.held.record
        every = rec.lease_s / 3
        last_ok = time.monotonic()
        while not self.finished.wait(every):
            with self.lock:
                try:
                    self.held = self.ops.heartbeat(self.held, self.ops.store.now())
                    last_ok = time.monotonic()
                    continue
                except Conflict:
                    self._recheck()
                except (StoreError, lifecycle.IllegalTransition) as e:
                    log.warning("heartbeat of %s failed: %s", rec.id, e)
            if time.monotonic() - last_ok > rec.lease_s:
                self.halt("lost")  # self-fence: someone may have reaped us by now
            if self.stop.is_set():
                return

    def _recheck(self) -> None:
        try:
            rec, etag = self.ops.read(self.held.record.id)
        except (NotFound, RecordError, StoreError):
            self.halt("lost")
            return
        if rec.state == "killed":
            self.halt("killed")
        elif not lifecycle.holds(rec, self.held.token):
            self.halt("lost")
        else:  # our own write landed although the answer was lost: carry on from it
            self.held = Claimed(rec, etag, self.held.token)


def _attempt(state: _State, ops: QueueOps, held: Claimed) -> None:
    rec = held.record
    t0 = time.monotonic()
    att = _Attempt(ops, held)
    beat = threading.Thread(
        target=att.heartbeat_loop, name=f"lakeshore-heartbeat-{rec.id}", daemon=True
    )
    beat.start()
    timer = None
    if rec.timeout_s is not None:
        timer = threading.Timer(rec.timeout_s, att.halt, args=("timeout",))
        timer.daemon = True
        timer.start()
    journal = JournalWriter(
        ops.store, lambda seq: ops.keys.journal(rec.id, rec.attempt, seq), rec.attempt
    )
    try:
        outcome = _execute(state, rec, att.stop, ops, journal)
    finally:
        att.finished.set()
        if timer:
            timer.cancel()
        beat.join()
    final_state = _conclude(state, att, outcome, journal)
    log.info(
        "%s %s attempt %d -> %s in %.3fs",
        rec.fn,
        rec.id,
        rec.attempt,
        final_state,
        time.monotonic() - t0,
    )


def _fatal(e: LakeshoreError) -> Outcome:
    """An error that would repeat on every attempt: not retried."""
    return Outcome(
        "error", error={"type": type(e).__name__, "message": str(e), "traceback": "", "fatal": "1"}
    )


def _execute(
    state: _State, rec: Record, stop: threading.Event, ops: QueueOps, journal: JournalWriter
) -> Outcome:
    try:
        payload = ops.get_blob(rec.args, f"arguments of {rec.id}")
        args, kwargs = codec.decode(payload, f"arguments of {rec.id}")
        target = _load(rec, state.plane)
    except StoreUnavailable as e:  # may work next time
        return Outcome("error", error=error_of(e))
    except LakeshoreError as e:  # missing, tampered or undecodable input; unknown function
        return _fatal(e)
    fn = target.fn if isinstance(target, Udf) else target
    kind = target.kind if isinstance(target, Udf) else body_kind(fn)
    isolation = state.isolation
    if isolation == "auto":
        isolation = "process" if rec.timeout_s is not None else "thread"
    spec = RunSpec(state.plane.data_root, rec.prefix, tag=f"{rec.id}-{rec.attempt}")
    if isolation == "process":
        return run_in_process(rec.fn, rec.fn_pickle, kind, payload, stop, journal.add, spec)

    def emit(item: Any) -> None:
        journal.add(codec.encode(item, "yielded value"))

    return run_in_thread(fn, kind, tuple(args), kwargs, stop, emit, spec)


def _load(rec: Record, plane: Dispatch) -> Any:
    """The callable an invocation names; pickled ones only where the worker opted in."""
    if rec.fn_pickle is None:
        return resolve(rec.fn, plane.registry)
    if not plane.allow_pickle:
        raise UnknownFunction(
            f"load {rec.fn}",
            "the invocation carries a pickled callable and this worker does not accept them",
            "start the worker with Dispatch(allow_pickle=True) if you trust every submitter",
            ref=rec.fn,
        )
    return unpickle(rec.fn_pickle)


def _conclude(state: _State, att: _Attempt, outcome: Outcome, journal: JournalWriter) -> str:
    """Write the attempt's outcome; returns the state it left the invocation in.

    The journal's last segment (with END, or ERROR when the failure is final) is written
    before the record's terminal CAS, so a reader that sees the terminal record finds the
    whole journal. A retried attempt gets no END/ERROR: readers move on to the next attempt.
    """
    ops = att.ops
    with att.lock:
        held = att.held
        rec, token = held.record, held.token
        now = ops.store.now()
        streamed = journal.frames > 0 or (outcome.kind == "ok" and outcome.value is None)
        if outcome.kind == "stopped" or att.why in ("killed", "lost"):
            _quietly(journal.close)
            if att.why == "killed":
                ops.store.delete(ops.keys.lease(rec.id))  # the record is terminal: hint is stale
                return "killed"
            if att.why != "timeout":
                return "fenced (lease lost; result dropped)"
        if att.why == "timeout":
            _quietly(journal.close)
            final = _with_journal(lifecycle.time_out(rec, now, token), journal, ended=False)
        elif outcome.kind == "ok":
            final = _succeeded(state, ops, rec, token, now, outcome, journal, streamed)
        else:
            err = dict(outcome.error or {})
            fatal = err.pop("fatal", None) is not None
            final = lifecycle.fail(rec, token, err, now, retry=not fatal)
            ended = False
            if final.state == "failed" and journal.frames:
                # Only a stream gets an ERROR frame, and only when no retry follows.
                ended = _quietly(journal.close, ERROR, codec.encode(err, "error"))
            else:
                _quietly(journal.close)
            final = _with_journal(final, journal, ended)
        try:
            ops.finish(held, final)
        except Conflict:
            return "fenced (record changed; result dropped)"
        return final.state


def _succeeded(
    state: _State,
    ops: QueueOps,
    rec: Record,
    token: str,
    now: float,
    outcome: Outcome,
    journal: JournalWriter,
    streamed: bool,
) -> Record:
    if streamed:
        try:
            journal.close(END)
        except Exception as e:  # frames were lost: the stream is incomplete, try again
            return lifecycle.fail(rec, token, error_of(e), now)
        meta = {"attempt": rec.attempt, "frames": journal.frames, "ended": True}
        return lifecycle.succeed(rec, token, None, now, journal=meta)
    journal.close()
    blob = ops.put_blob(
        ops.keys.result(rec.id, rec.attempt), outcome.value or b"\xc0", state.plane.spill_bytes
    )
    return lifecycle.succeed(rec, token, blob, now)


def _with_journal(rec: Record, journal: JournalWriter, ended: bool) -> Record:
    """The attempt's journal summary on its outcome record (None when nothing streamed)."""
    if not journal.frames:
        return rec
    meta = {"attempt": journal.attempt, "frames": journal.frames, "ended": ended}
    return dataclasses.replace(rec, journal=meta)


def _quietly(fn: Any, *args: Any) -> bool:
    """Best-effort journal close on a path that is failing anyway; True if it worked."""
    try:
        fn(*args)
        return True
    except Exception as e:
        log.warning("journal flush failed: %s", e)
        return False
