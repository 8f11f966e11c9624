"""One attempt on a worker: heartbeat, run the body, write the outcome.

The attempt holds its record with the etag of its last write, and every write is one
conditional PUT on it: a worker that lost its lease (reaped, cancelled) learns at its next
write and drops its outcome instead of overwriting someone else's. The slot's heartbeat
thread pushes the lease out every ``lease_s / 3``; when that write meets a changed record it
re-reads and stops the body if it was cancelled or the lease lost, and a worker that cannot
renew stops the body itself before the lease runs out. A worker shutting down releases its
attempts: queued again at once, not counted.

A thread-isolated body that does not stop within :data:`ABANDON_AFTER_S` is abandoned: the
watchdog (:meth:`Attempt.abandon_if_stuck`) concludes the attempt on a new slot thread, and
the old thread, once its body returns, drops the result and leaves (:class:`Abandoned`).
Exactly one of the two threads concludes each attempt, decided under the attempt's hand-off
lock. See docs/protocol.md#heartbeat and docs/protocol.md#complete.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, assert_never

from lakeshore import codec, tracing
from lakeshore.errors import (
    Abandoned,
    Conflict,
    IllegalTransition,
    InvalidArgument,
    LakeshoreError,
    NotFound,
    RecordError,
    StoreError,
    StoreUnavailable,
    UnknownFunction,
)
from lakeshore.model import lifecycle
from lakeshore.model.record import Record, State, clip_error
from lakeshore.model.retry import retries
from lakeshore.protocol.steps import Claimed, QueueOps
from lakeshore.running.bodies import Allow, Declared, body_kind, load_body
from lakeshore.running.call import Outcome, RunSpec, Verdict, error_of, run_inline, unpickle
from lakeshore.running.child import BodyCall, ChildProcess, Hooks, child_can_import
from lakeshore.running.logs import log_writer, text_sink
from lakeshore.running.parents import handed
from lakeshore.streams.journal import END, ERROR, JournalWriter
from lakeshore.text import inert

if TYPE_CHECKING:
    from lakeshore.plane import Plane

__all__ = [
    "ABANDON_AFTER_S",
    "Attempt",
    "Halt",
    "Heartbeats",
    "Isolation",
    "Running",
    "Slot",
    "conclude",
    "fatal",
    "run_attempt",
]

log = logging.getLogger("lakeshore.worker")
_IDLE_TICK_S = 0.5  # a heartbeat thread looks at its slot at least this often
# How long a stopped body run in its slot's thread may take to return before the watchdog
# gives up on it: a cooperative body (async, generator) unwinds well within it.
ABANDON_AFTER_S = 1.0


# where a body run in its slot's thread is (Attempt._inline)
_NOT_INLINE, _IN_BODY, _RETURNED, _ABANDONED = range(4)


class Heartbeats:
    """A slot's heartbeat thread, beating for the one attempt the slot runs (a thread per
    attempt would cost more than a short body). Started on first use."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._att: Attempt | None = None
        self._due: float | None = None
        self._beating = False
        self._closed = False
        self._wake_at = 0.0  # when the thread wakes up on its own next
        self._thread: threading.Thread | None = None

    def attach(self, att: Attempt) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="lakeshore-heartbeat", daemon=True
                )
                self._thread.start()
            # due when a third of the lease is used up (at once if more already is)
            left = att.lease_left() - att.held.record.lease_s * 2 / 3
            self._att, self._due = att, time.monotonic() + max(0.0, left)
            if self._due < self._wake_at:
                self._cond.notify_all()

    def detach(self) -> None:
        """Stop beating; returns once no heartbeat is in flight (the outcome comes next)."""
        with self._cond:
            self._att = None
            while self._beating:
                self._cond.wait()

    def close(self) -> None:
        with self._cond:
            self._closed, self._att = True, None
            self._cond.notify_all()

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                att, due, now = self._att, self._due, time.monotonic()
                if att is None or due is None or due > now:
                    # wake up now and then on our own, so attach need not wake us each attempt
                    wait = _IDLE_TICK_S if att is None or due is None else due - now
                    self._wake_at = now + min(wait, _IDLE_TICK_S)
                    self._cond.wait(min(wait, _IDLE_TICK_S))
                    continue
                self._beating = True
                self._cond.release()
                try:
                    nxt = att.beat()
                finally:
                    self._cond.acquire()
                    self._beating = False
                    self._cond.notify_all()
                if self._att is att:
                    self._due = nxt
                    if nxt is None:
                        self._att = None


class Isolation(StrEnum):
    """Where a worker slot runs bodies."""

    # a body process for an invocation with a timeout_s (only a process can be stopped),
    # the slot's own thread for the others
    AUTO = "auto"
    THREAD = "thread"  # the slot's own thread: light bodies; a sync body cannot be stopped
    PROCESS = "process"  # the slot's child process: killable, and cannot crash the worker


@dataclass
class Slot:
    """What one worker slot keeps between attempts: its child process (process isolation)
    and its heartbeat thread. It outlives the thread that serves it: after an abandoned
    body, a new thread carries on with the same slot."""

    plane: Plane
    isolation: Isolation
    hooks: Hooks
    allow: Allow = field(default_factory=Allow)  # the operator's allow-list (run_worker)
    signalled: Callable[[], bool] = field(default=lambda: False)  # the worker got SIGTERM/INT
    child: ChildProcess | None = None
    heartbeats: Heartbeats = field(default_factory=Heartbeats)

    def close(self) -> None:
        self.heartbeats.close()
        if self.child is not None:
            self.child.close()
            self.child = None


class Halt(StrEnum):
    """Why the worker stopped an attempt's body (``Attempt.why``); ``NONE`` while it has not."""

    NONE = ""
    KILLED = "killed"  # the invocation was cancelled
    LOST = "lost"  # the lease could not be confirmed in time
    TIMEOUT = "timeout"  # the body ran past its timeout_s
    RELEASED = "released"  # the worker is stopping: hand the invocation back


class Attempt:
    """One running attempt: the held record (guarded), its stop flag and why it stopped.

    A lease that ran out but that nobody moved is renewed by the next heartbeat: the
    conditional write proves the record is unchanged, so no one else runs it, and a worker
    delayed by slow requests goes on instead of retrying. ``strict`` attempts (a work
    queue's consumer, which promises that a stall past the lease loses the job) never
    renew a lease that ran out.
    """

    def __init__(self, ops: QueueOps, held: Claimed, strict: bool = False) -> None:
        self.ops = ops
        self.held = held
        self.strict = strict
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.why = Halt.NONE
        self.final = ""
        self.interrupted = False  # ended by a signal meant for the whole worker
        # The hand-off of a body run in the slot's thread: which of that thread and the
        # watchdog concludes the attempt. Its own lock: self.lock is held across requests.
        self._hand = threading.Lock()
        self._inline = _NOT_INLINE
        self._stop_seen: float | None = None  # when the watchdog first saw the stop
        # what follows the body (run_attempt sets it): heartbeats off, outcome written
        self.ending: Callable[[Outcome], Attempt] | None = None

    def halt(self, why: Halt) -> None:
        if not self.stop.is_set():
            self.why = Halt(why)
            self.stop.set()

    def body_starts(self) -> None:
        """The body is about to run in this (the slot's) thread."""
        with self._hand:
            self._inline = _IN_BODY

    def body_returned(self) -> bool:
        """The body run in the slot's thread returned: True if this thread still concludes
        the attempt, False if the watchdog had abandoned it (drop what the body returned)."""
        with self._hand:
            if self._inline == _ABANDONED:
                return False
            self._inline = _RETURNED
            return True

    @property
    def abandoned(self) -> bool:
        """The watchdog gave up on this attempt's body (see :meth:`abandon_if_stuck`)."""
        return self._inline == _ABANDONED

    def abandon_if_stuck(self, now: float, after_s: float = ABANDON_AFTER_S) -> bool:
        """The watchdog's look (``now``: ``time.monotonic``): True — and the attempt is
        abandoned, to be concluded by :meth:`conclude_abandoned` on another thread — when
        its body runs in the slot's thread and has not returned ``after_s`` seconds after
        the watchdog first saw it stopped."""
        with self._hand:
            if self._inline != _IN_BODY or not self.stop.is_set():
                return False
            if self._stop_seen is None:
                self._stop_seen = now
            if now - self._stop_seen < after_s:
                return False
            self._inline = _ABANDONED
            return True

    def conclude_abandoned(self) -> Attempt:
        """Conclude an attempt :meth:`abandon_if_stuck` gave up on, as stopped (on the
        thread that takes over its slot).

        Raises:
            LakeshoreError: the outcome could not be written (the lease will expire).
        """
        assert self.ending is not None and self._inline == _ABANDONED
        return self.ending(Outcome(Verdict.STOPPED))

    def beat(self) -> float | None:
        """One heartbeat; returns when the next one is due (``time.monotonic``), or None
        once the attempt has stopped."""
        rec = self.held.record
        with self.lock:
            sent = time.monotonic()
            if self.strict and self.lease_left() <= 0:
                # woken after a pause past the lease (a stopped process, a sleeping laptop)
                self.halt(Halt.LOST)
                return None
            try:
                self.held = self.ops.heartbeat(self.held, self.ops.store.now())
                return sent + rec.lease_s / 3  # the new lease counts from the send
            except Conflict:
                self._recheck()
            except (StoreError, IllegalTransition) as e:
                log.warning("heartbeat of %s failed: %s", rec.id, e)
            if not self.stop.is_set() and self.lease_left() < fence_margin(rec.lease_s):
                # self-fence while the lease still holds: once it runs out, another worker
                # may take the invocation over, and this body must have stopped by then
                self.halt(Halt.LOST)
        if self.stop.is_set():
            return None
        return time.monotonic() + rec.lease_s / 6  # failed: try again sooner

    def overdue(self) -> bool:
        """True when the body must stop now: less than the fence margin of its lease is
        left and it was not renewed (a heartbeat may be stuck in a slow request)."""
        return not self.stop.is_set() and self.lease_left() < fence_margin(self.held.record.lease_s)

    def lease_left(self) -> float:
        """Seconds of the held lease still ahead, in the store's clock."""
        lease = self.held.record.lease
        return lease.expires_at - self.ops.store.now() if lease is not None else 0.0

    def _recheck(self) -> None:
        try:
            rec, etag = self.ops.read(self.held.record.id)
        except (NotFound, RecordError, StoreError):
            self.halt(Halt.LOST)
            return
        if rec.state == State.KILLED:
            self.halt(Halt.KILLED)
        elif not lifecycle.holds(rec, self.held.token):
            self.halt(Halt.LOST)
        else:  # our own write landed although the answer was lost: carry on from it
            self.held = dataclasses.replace(self.held, record=rec, etag=etag)

    def fence(self) -> bool:
        """Prove, right before the body's files are published, that this attempt still holds
        its lease: one heartbeat (a conditional write of the record), which also gives the
        upload a whole lease ahead of it. False — the attempt is then stopped as killed or
        lost — when it had stopped already or the record changed (cancelled, or taken over
        after the lease ran out): nothing may be published.

        Raises:
            StoreError, PermissionDenied: the store failed or refused, so whether the lease
                holds is unknown.
        """
        with self.lock:
            for _ in range(2):  # a second try only after our own lost-answer write
                if self.strict and self.lease_left() <= 0:
                    self.halt(Halt.LOST)  # ran out: the job is the next claimer's
                if self.stop.is_set():
                    return False
                try:
                    self.held = self.ops.heartbeat(self.held, self.ops.store.now())
                except Conflict:
                    self._recheck()
                    continue
                except IllegalTransition:
                    break
                return True
            self.halt(Halt.LOST)
            return False


class Running(Protocol):
    """Where a worker keeps its running attempts (to release them when it stops)."""

    def add(self, att: Attempt) -> None: ...

    def discard(self, att: Attempt) -> None: ...


def fence_margin(lease_s: float) -> float:
    """How long before its lease runs out a holder that cannot renew stops its body."""
    return lease_s / 6


def run_attempt(slot: Slot, ops: QueueOps, held: Claimed, running: Running) -> Attempt:
    """Run one claimed attempt to its end and write the outcome. ``running`` holds the
    attempt while it runs, so a stopping worker can release it, and its watchdog can
    abandon a body that does not stop (:meth:`Attempt.abandon_if_stuck`).

    Raises:
        Abandoned: this thread's body returned after the watchdog had taken the attempt
            over: the thread must leave the slot, writing nothing.
        HookFailed: the child's ``on_start`` hook raised (the attempt was released first).
        LakeshoreError: the outcome could not be written (the lease will expire).
    """
    rec = held.record
    t0 = time.monotonic()
    att = Attempt(ops, held)
    if att.lease_left() < rec.lease_s * 2 / 3:
        # The claim's write took over a third of the lease to come back: renew before the
        # body starts, and do not start it unless the renewal shows the lease is still ours.
        att.beat()
        if not att.stop.is_set() and att.lease_left() < rec.lease_s * 2 / 3:
            att.halt(Halt.RELEASED)  # not renewed: hand it back rather than start it short
    slot.heartbeats.attach(att)
    timer = None
    if rec.timeout_s is not None:
        timer = threading.Timer(rec.timeout_s, att.halt, args=(Halt.TIMEOUT,))
        timer.daemon = True
    journal = JournalWriter(
        ops.store, lambda seq: ops.keys.journal(rec.id, rec.attempt, seq), rec.attempt
    )
    logs = log_writer(ops.store, ops.keys, rec.id, rec.attempt)
    att.ending = ending = functools.partial(_end, slot, att, running, journal, logs, timer, t0)
    running.add(att)
    try:
        if att.stop.is_set():  # the renewal above found the lease gone (or a cancel)
            outcome = Outcome(Verdict.STOPPED)
        else:  # the body's time starts when the body does (not while a child loads its model)
            to_log = text_sink(logs)

            def sink(text: str) -> None:
                if not att.abandoned:  # its log was closed with its attempt: nothing more
                    to_log(text)

            with tracing.running(rec) as traced:  # in this thread: a child's body too
                outcome = _execute(slot, rec, att, ops, journal, sink, timer)
                traced.ended(outcome.error if outcome.verdict is Verdict.ERROR else None, att.why)
    except Abandoned:
        raise  # concluded by the thread that took the slot over
    except BaseException:
        att.halt(Halt.RELEASED)
        ending(Outcome(Verdict.STOPPED))
        raise
    return ending(outcome)


def _end(
    slot: Slot,
    att: Attempt,
    running: Running,
    journal: JournalWriter,
    logs: JournalWriter,
    timer: threading.Timer | None,
    t0: float,
    outcome: Outcome,
) -> Attempt:
    """Everything after the body: stop the heartbeats and the timer, write the outcome, log
    the attempt's line. Run once per attempt, by the slot thread that ran the body or, when
    that thread was abandoned, by the one that took its slot over.

    Raises:
        LakeshoreError: the outcome could not be written (the lease will expire).
    """
    rec = att.held.record
    try:
        running.discard(att)
        if timer:
            timer.cancel()
        slot.heartbeats.detach()
        _quietly(logs.close)
    finally:
        with tracing.finishing(rec) as traced:
            final_state, why = conclude(slot.plane, att, outcome, journal)
            traced.ended(halt=final_state)
    log.info(
        "%s %s attempt %d -> %s in %.3fs%s",
        inert(rec.fn),  # a record's text, on its way to a terminal
        rec.id,
        rec.attempt,
        final_state,
        time.monotonic() - t0,
        why,
        extra={"attempt_event": "ended", "attempt_outcome": final_state},  # for log readers
    )
    att.final = final_state
    return att


def fatal(e: LakeshoreError) -> Outcome:
    """An error that would repeat on every attempt: not retried."""
    error = {"type": type(e).__name__, "message": str(e), "traceback": ""}
    return Outcome(Verdict.ERROR, error=error, final=True)


def _execute(
    slot: Slot,
    rec: Record,
    att: Attempt,
    ops: QueueOps,
    journal: JournalWriter,
    log_sink: Any,
    timer: threading.Timer | None = None,
) -> Outcome:
    """Run the body where its isolation says, and return how it ended.

    Raises:
        Abandoned: the body ran in this thread and returned after the watchdog gave up on it.
        HookFailed: a child's ``on_start`` hook raised.
    """
    stop, fence = att.stop, att.fence
    try:
        payload = ops.get_blob(rec.args, f"arguments of {rec.id}", slot.plane.max_payload_bytes)
        args, kwargs = codec.decode_call(payload, f"arguments of {rec.id}")
        if rec.after_pass:  # a fan-in: its parents' ids or results come first
            args = (handed(slot.plane, rec), *args)
            payload = codec.encode((args, kwargs), f"arguments of {rec.id}")
        target = _load(rec, slot.plane, slot.allow)
    except StoreUnavailable as e:  # may work next time
        return Outcome(Verdict.ERROR, error=error_of(e))
    except LakeshoreError as e:  # missing, tampered or undecodable input; unknown function
        return fatal(e)
    fn = target.fn if isinstance(target, Declared) else target
    kind = target.kind if isinstance(target, Declared) else body_kind(fn)
    match slot.isolation:
        case Isolation.AUTO:
            isolation = Isolation.PROCESS if rec.timeout_s is not None else Isolation.THREAD
        case Isolation.THREAD | Isolation.PROCESS:
            isolation = slot.isolation
        case unknown:
            assert_never(unknown)
    local = isinstance(target, Declared) and target.local_only
    if isolation is Isolation.PROCESS and (local or not child_can_import(rec.fn, rec.fn_pickle)):
        # a child could not find it (our registry, or a __main__ with no file to import):
        # run it here, where it is; a timeout then ends the attempt but cannot stop the body
        if slot.isolation is Isolation.PROCESS and slot.hooks.on_start is not None:
            # this worker runs on_start only in its body processes: the body would miss it
            return fatal(
                InvalidArgument(
                    f"run {rec.fn[:120]}",
                    "the function cannot be loaded by a body process (no importable name, or "
                    "a script with no file), and this worker's on_start hook runs only there",
                    "define the function at module level in a file, or run the worker with "
                    'isolation="auto" or "thread"',
                )
            )
        isolation = Isolation.THREAD
        if rec.timeout_s is not None and slot.isolation is not Isolation.THREAD:
            log.warning(
                "%s %s runs in a thread of the worker (a body process could not load it): "
                "its timeout ends the attempt but cannot stop the body",
                inert(rec.fn),
                rec.id,
            )
    spec = RunSpec(slot.plane.data_root, rec.prefix, staging_name=f"{rec.id}-{rec.attempt}")
    if isolation is Isolation.PROCESS:
        if slot.child is None:
            slot.child = ChildProcess(slot.hooks, slot.signalled)
        call = BodyCall(
            rec.fn, rec.fn_pickle, kind, payload, spec, rec, approved=True, trace=tracing.current()
        )  # approved by _load; the trace: the run span, current in this thread
        started = timer.start if timer else None
        return slot.child.run(call, stop, journal.add, log_sink, started, fence)

    if timer is not None:
        timer.start()
    before = slot.hooks.before_job
    prelude = (lambda: before(rec)) if before is not None else None
    prelude = tracing.carried(prelude)  # the run span, current in the body's fresh context
    att.body_starts()
    outcome = run_inline(
        fn, kind, tuple(args), kwargs, stop, journal.add, spec, log_sink, prelude, fence
    )
    if not att.body_returned():
        raise Abandoned  # what it returned is dropped: the attempt was concluded as stopped
    return outcome


def _load(rec: Record, plane: Plane, allow: Allow) -> Any:
    """The callable an invocation names, if this worker declared it as a body (see
    :func:`lakeshore.running.bodies.load_body`); pickled ones only where the worker opted
    in. This is the one place a worker decides what it runs: a child process runs only what
    passed here.
    """
    if rec.fn_pickle is None:
        return load_body(rec.fn, plane.registry, allow)
    if not plane.allow_pickle:
        raise UnknownFunction(
            f"load {rec.fn}",
            "the invocation carries a pickled callable and this worker does not accept them",
            "start the worker with Dispatch(allow_pickle=True) if you trust every submitter",
            ref=rec.fn,
        )
    return unpickle(rec.fn_pickle)


def conclude(
    plane: Plane, att: Attempt, outcome: Outcome, journal: JournalWriter
) -> tuple[str, str]:
    """Write the attempt's outcome; returns the state it left the invocation in, and why
    when that was an error (see :func:`_why`; empty otherwise), for the attempt's log line.

    The journal's last segment (with END, or ERROR when the failure is final) is written
    before the record's terminal CAS, so a reader that sees the terminal record finds the
    whole journal. A retried attempt gets no END/ERROR: readers move on to the next attempt.
    """
    with att.lock:
        now = att.ops.store.now()
        match outcome.verdict:
            case Verdict.STOPPED | Verdict.RELEASE:
                return _stopped(plane, att, outcome.verdict, journal, now)
            case Verdict.OK | Verdict.ERROR:
                if att.why in (Halt.KILLED, Halt.LOST):  # what the body said comes too late
                    _quietly(journal.close)
                    return _halted(att, now), ""
                return _reported(plane, att, outcome, journal, now)
            case unknown:
                assert_never(unknown)


def _stopped(
    plane: Plane, att: Attempt, verdict: Verdict, journal: JournalWriter, now: float
) -> tuple[str, str]:
    """The body said nothing: the worker stopped it (``att.why`` says why), or lost sight of
    it through no fault of the body's (``RELEASE``)."""
    held = att.held
    match att.why:
        case Halt.NONE | Halt.RELEASED:
            # released at the end of a shutdown's grace, or interrupted by a signal meant
            # for the whole worker: handed back, the attempt not counted
            att.interrupted = att.why is Halt.NONE and verdict is Verdict.STOPPED
            _quietly(journal.close)
            release = lifecycle.release(held.record, held.token, now)
            try:
                att.ops.finish(held, release, retry_while=_lease_holds(att))
            except (Conflict, IllegalTransition):
                return "fenced (record changed while releasing)", ""
            return "released (queued again, attempt not counted)", ""
        case Halt.KILLED | Halt.LOST:
            _quietly(journal.close)
            return _halted(att, now), ""
        case Halt.TIMEOUT:
            return _reported(plane, att, Outcome(verdict), journal, now)
        case unknown:
            assert_never(unknown)


def _halted(att: Attempt, now: float) -> str:
    """The attempt was cancelled (its ticket is stale), or its lease could not be confirmed."""
    if att.why is Halt.KILLED:
        att.ops.drop_own_ticket(att.held)  # the record is terminal (cancelled)
        return "killed"
    return _after_lost(att.ops, att.held, now)


def _reported(
    plane: Plane, att: Attempt, outcome: Outcome, journal: JournalWriter, now: float
) -> tuple[str, str]:
    """Write what the body reported (or, past ``timeout_s``, the timeout) with ``if_match``."""
    ops, held = att.ops, att.held
    rec, token = held.record, held.token
    if att.why is Halt.TIMEOUT:
        _quietly(journal.close)
        final = _with_journal(lifecycle.time_out(rec, now, token), journal, ended=False)
    elif outcome.verdict is Verdict.OK:
        streamed = journal.frames > 0 or outcome.value is None
        final = _succeeded(plane, ops, rec, token, now, outcome, journal, streamed)
    else:
        err = dict(outcome.error or {})
        retry = not outcome.final and retries(rec.retry_for, rec.no_retry_for, outcome.kinds)
        final = lifecycle.fail(rec, token, err, now, retry=retry, draw=random.random())
        ended = False
        if final.state is State.FAILED and journal.frames:
            # Only a stream gets an ERROR frame, and only when no retry follows.
            # The error as the record holds it (clipped): the raw text may be larger
            # than any segment a reader fetches.
            frame = codec.encode(clip_error(err), "error")
            ended = _quietly(journal.close, ERROR, frame)
        else:
            _quietly(journal.close)
        final = _with_journal(final, journal, ended)
    try:
        ops.finish(held, final, tidy_later=True, retry_while=_lease_holds(att))
    except Conflict:
        return "fenced (record changed; result dropped)", ""
    return final.state, _why(final, now)


def _lease_holds(att: Attempt) -> Callable[[], bool]:
    """Whether an outcome write that failed may be sent again: while more than a sixth of
    the lease is left by store time (the margin a heartbeat keeps), no other worker can
    have taken the invocation over, and the write is still fenced by its etag if one did."""
    margin = att.held.record.lease_s / 6

    def holds() -> bool:
        try:
            return att.lease_left() > margin
        except LakeshoreError:  # no store clock either: let the lease run out
            return False

    return holds


# The log line names the error; the record keeps all of it (lakeshore show, result).
_LOG_ERROR_CHARS = 200


def _why(rec: Record, now: float) -> str:
    """The end of the log line of an attempt that left ``rec`` failed or queued for a retry
    with an error: when the retry is due, then the error's type and message, cut short and
    on one line. The message may quote a submitter's arguments: a newline in it would fake
    a log line of its own, and a control character would reach the operator's terminal."""
    if rec.state not in ("queued", "failed") or not rec.error:
        return ""
    retry = ""
    if rec.state == State.QUEUED:
        used = rec.attempt - rec.released
        due = max(0.0, rec.not_before - now)
        retry = f" (retry in {due:.1f}s; {used} of {rec.max_attempts} attempts used)"
    kind = rec.error.get("type") or "?"
    message = rec.error.get("message", "")
    text = f"{kind}: {message}" if message else kind
    if len(text) > _LOG_ERROR_CHARS:
        text = text[: _LOG_ERROR_CHARS - 1] + "…"
    return f"{retry}: {inert(text)}"


def _after_lost(ops: QueueOps, held: Claimed, now: float) -> str:
    """The body was stopped because the lease could not be confirmed in time (a heartbeat
    that failed or hung, a record that changed). Look once more: a cancel is tidied like
    one; a lease that is still ours after all (only not renewed in time) ends the attempt
    now as a failed one, retried as after an expiry, instead of waiting for it to run out."""
    fenced = "fenced (lease lost; result dropped)"
    try:
        current, etag = ops.read(held.record.id)
    except LakeshoreError:
        return fenced
    if current.state == State.KILLED:
        ops.drop_own_ticket(held)
        return "killed"
    if not lifecycle.holds(current, held.token):
        return fenced
    error = {
        "type": "LeaseNotRenewed",
        "message": "the worker could not renew its lease in time and stopped the body",
        "traceback": "",
    }
    final = lifecycle.fail(current, held.token, error, now, draw=random.random())
    try:
        ops.finish(dataclasses.replace(held, record=current, etag=etag), final, tidy_later=True)
    except (Conflict, IllegalTransition):
        return fenced
    except LakeshoreError:
        return fenced  # the store is still away: the lease runs out as after a crash
    return f"{final.state} (its lease could not be renewed in time)"


def _succeeded(
    plane: Plane,
    ops: QueueOps,
    rec: Record,
    token: str,
    now: float,
    outcome: Outcome,
    journal: JournalWriter,
    streamed: bool,
) -> Record:
    data = outcome.value
    cap = plane.max_payload_bytes
    if data is not None and len(data) > cap:  # it would be as large next time: final
        _quietly(journal.close)
        return _too_large(rec, token, now, len(data), cap)
    if streamed:
        try:
            journal.close(END)
        except Exception as e:  # frames were lost: the stream is incomplete, try again
            return lifecycle.fail(rec, token, error_of(e), now, draw=random.random())
        meta = {"attempt": rec.attempt, "frames": journal.frames, "ended": True}
        # a generator's result is its frames; a consumer that posted frames may ack a value
        blob = None if data is None else ops.put_result(rec, data, plane.spill_bytes)
        return lifecycle.succeed(rec, token, blob, now, journal=meta)
    journal.close()
    blob = ops.put_result(rec, data or b"\xc0", plane.spill_bytes)
    return lifecycle.succeed(rec, token, blob, now)


def _too_large(rec: Record, token: str, now: float, size: int, cap: int) -> Record:
    error = {
        "type": "ResultTooLarge",
        "message": f"the result is {size} bytes, over max_payload_bytes={cap}; "
        "write large outputs with dls.run.write and return their keys",
        "traceback": "",
    }
    return lifecycle.fail(rec, token, error, now, retry=False)


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
