"""``run_worker``: claim invocations, run their bodies, write their outcomes.

A worker runs ``concurrency`` slots, each a thread with its own claim loop (and, in process
isolation, its own child). Idle slots take turns polling and back off up to ``max_poll_s``; a
claim that meets an expired lease requeues it; old rate tokens are swept now and then. How
one attempt runs is :mod:`lakeshore.running.attempt`. The caller's thread is the watchdog: it
stops bodies whose lease is about to run out unrenewed, and gives up on a thread-isolated
body that has not returned a second after it was stopped (a new thread concludes that
attempt and serves the slot).

Stopping (``stop``, or SIGTERM / SIGINT with ``handle_signals``) ends claiming; attempts still
running after ``grace_s`` are released: queued again at once, the attempt not counted, as a
preempted cluster job needs. A second signal exits at once (leases then expire). Signs of
life go out at start, every ``announce_s``, within ``_ANNOUNCE_BUSY_S`` of a change in what
runs or was done (a busy worker's row in ``status`` is current, for one PUT a few seconds at
most), and at stop. Options: docs/workers.md#options;
stopping: docs/workers.md#stopping-signals-grace-and-release.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lakeshore import tracing
from lakeshore.errors import (
    Abandoned,
    Conflict,
    HookFailed,
    IllegalTransition,
    InvalidArgument,
    LakeshoreError,
    StoreError,
)
from lakeshore.firing import Watch
from lakeshore.model import lifecycle
from lakeshore.model.record import check_text
from lakeshore.plane import HasPlane, Plane, plane_of
from lakeshore.protocol.admission import repair_slots, sweep_rate
from lakeshore.protocol.census import write_sign_of_life
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.polling import pause
from lakeshore.protocol.steps import Claimed, QueueOps
from lakeshore.running.attempt import Attempt, Halt, Isolation, Slot, run_attempt
from lakeshore.running.bodies import Allow
from lakeshore.running.child import Hooks, refuse_script_rerun, warm_up
from lakeshore.running.logs import logging_is_set_up
from lakeshore.running.metrics import WorkerCounters, check_textfile, write_textfile
from lakeshore.running.metrics_server import MetricsServer
from lakeshore.text import inert

__all__ = ["run_worker"]

log = logging.getLogger("lakeshore.worker")
_ISOLATIONS = ("auto", "thread", "process")
_SWEEP_EVERY_S = 300.0  # rate tokens live for hours: a rare sweep keeps idle workers cheap
# Just before a heartbeat two thirds of a lease are left; a one-second step of a Date clock
# must still leave more than the watchdog's sixth: L * 2/3 - 1 > L / 6, so L > 2 s, plus slack.
_MIN_DATE_LEASE_S = 3.0
_ANNOUNCE_BUSY_S = 2.0  # a change in running/done is announced this soon (idle: announce_s)
_FAILED_STATES = frozenset({"failed", "queued", "timeout"})  # the body's attempt failed
_SIGNAL_WAIT_S = 2.0  # how long a slot waits to learn whether a signal reached the worker
_SCHEDULES_JOIN_S = 10.0  # one firing: a read, a submit (which waits 5 s for room at most)


@dataclass
class _State:
    """What the slots of one worker share."""

    plane: Plane
    worker_id: str
    isolation: Isolation
    max_jobs: int | None
    stop: threading.Event
    hooks: Hooks = field(default_factory=Hooks)
    allow: Allow = field(default_factory=Allow)
    lease_s: float | None = None
    wait_retries: bool = False  # an idle exit waits for retries backing off (draining)
    claimers: list[Claimer] = field(default_factory=list)  # the slots share them
    idle_exit: float | None = None
    max_poll_s: float = 1.25
    lock: threading.Lock = field(default_factory=threading.Lock)
    idle_turn: threading.Lock = field(default_factory=threading.Lock)
    idle_delay: float = 0.005  # the idle slots' shared poll backoff
    started: int = 0
    done: int = 0
    failed: int = 0  # of done: the body raised or timed out (a retry, or failed for good)
    announced: tuple[int, int] = (0, 0)  # (running, done) of the last sign of life
    # the first sweep comes after _SWEEP_EVERY_S: a short-lived worker (--once, cron) pays
    # nothing for it, and long-lived ones keep the tokens of past windows swept
    last_sweep: float = field(default_factory=time.monotonic)
    running: dict[Attempt, int] = field(default_factory=dict)  # -> the slot running it
    slots: list[Slot] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)  # each slot's serving one
    failure: BaseException | None = None
    signalled: Callable[[float], bool] = field(default=lambda wait=0.0: False)  # SIGTERM/INT
    said_idle: bool = False  # "nothing to claim" is said once a worker, not once a poll
    metrics: WorkerCounters | None = None  # its counters, for the text file or the port
    metrics_textfile: str | None = None

    def count_attempt(self) -> bool:
        """Count one more attempt against ``max_jobs``; False when none is left."""
        with self.lock:
            if self.max_jobs is not None and self.started >= self.max_jobs:
                return False
            self.started += 1
            return True

    def uncount_attempt(self) -> None:
        """Undo ``count_attempt``: the claim found nothing, or was handed back unstarted."""
        with self.lock:
            self.started -= 1


def _say(message: str) -> None:
    """What a worker is doing, for whoever started it: an INFO line where logging is set up
    (the command line, an application), else one line on stderr. A worker started from a
    plain script or a notebook must not sit there saying nothing."""
    if logging_is_set_up(log):
        log.info("%s", message)
    else:
        print(f"lakeshore: {inert(message)}", file=sys.stderr, flush=True)


def _say_idle_once(state: _State, idle_exit: float | None) -> None:
    with state.lock:
        if state.said_idle:
            return
        state.said_idle = True
    if idle_exit == 0:  # once, or a single pass: it returns now
        _say(f"worker {state.worker_id}: nothing to claim")
        return
    leaves = f"; leaves after {idle_exit:g} s without work" if idle_exit else ""
    _say(f"worker {state.worker_id}: nothing to claim now, waiting{leaves}")


def run_worker(
    plane: Plane | HasPlane,
    *,
    once: bool = False,
    queues: list[str] | None = None,
    concurrency: int = 1,
    isolation: str = "auto",
    max_jobs: int | None = None,
    idle_exit: float | None = None,
    max_poll_s: float = 1.25,
    worker_id: str | None = None,
    stop: threading.Event | None = None,
    grace_s: float = 30.0,
    lease_s: float | None = None,
    on_start: Any = None,
    before_job: Any = None,
    on_stop: Any = None,
    handle_signals: bool = False,
    announce_s: float = 30.0,
    allow: list[str] | None = None,
    fire_schedules: bool = True,
    metrics_textfile: str | None = None,
    metrics_port: int | None = None,
) -> int:
    """Serve invocations from ``queues`` of ``plane`` (a ``Dispatch``, or its ``Plane``);
    return how many attempts it ran.

    Args:
        once: run at most one attempt: take one invocation that is claimable now, run it,
            return (0 if none was claimable; pass ``idle_exit`` to wait for one).
        queues: queue names; default: every queue the plane knows in this process.
        concurrency: attempts run at the same time (slots).
        isolation: ``"thread"`` (light bodies; a sync body cannot be stopped), ``"process"``
            (each slot runs bodies in its own child process: stoppable, crash-proof) or
            ``"auto"`` (a child when the invocation has a ``timeout_s``, else a thread).
        max_jobs: return after this many attempts.
        idle_exit: return after this many seconds without work (SLURM array jobs that drain).
            A retry the worker has seen backing off is work to come: unless ``once``, a
            positive ``idle_exit`` does not end the worker before it is due and claimed.
        max_poll_s: longest pause between polls of an idle queue.
        worker_id: name in leases and logs; default ``host:pid``.
        stop: set it to stop claiming; running attempts get ``grace_s`` to finish, then are
            released (queued again at once, the attempt not counted).
        grace_s: how long running attempts may finish after a stop.
        lease_s: lease length for attempts this worker claims (default: the invocation's);
            heartbeats come every third of it.
        on_start: lifecycle hook (a callable or ``"module:function"``), called as
            ``on_start()`` once per process that runs bodies, before its first attempt (this
            process in thread isolation, each slot's child in process isolation).
        before_job: lifecycle hook called as ``before_job(record)`` before every attempt,
            where the body runs.
        on_stop: lifecycle hook called as ``on_stop()`` when a process that ran bodies
            shuts down in order (best effort).
        handle_signals: SIGTERM/SIGINT stop the worker as ``stop`` does; a second one exits
            the process at once. Only from the main thread.
        announce_s: how often the worker's sign of life is written.
        allow: ``"module:qualname"`` patterns (fnmatch-style, ``"mypkg.jobs:*"``) of
            functions this worker may run although they are not decorated, importing their
            module if need be. Without it the worker runs only declared bodies: functions
            decorated on ``plane``, and ``@udf`` functions of modules already imported in
            this process. Anything else an invocation names fails it, never called.
        fire_schedules: fire the due slots of the schedules of ``queues`` (a thread that
            lists them at start and once a minute; not with ``once``). See
            docs/schedules.md#who-fires.
        metrics_textfile: a file this worker rewrites with its counters in Prometheus
            text, at its start, with each sign of life and at its stop (for
            node_exporter's textfile collector: docs/metrics.md).
        metrics_port: serve the same counters on ``http://127.0.0.1:PORT/metrics`` while
            the worker runs (0: any free port, said in the start line).

    Raises:
        InvalidArgument: a bad option, hook or ``allow`` pattern, no folder for
            ``metrics_textfile``, or a ``metrics_port`` that cannot be served.
        HookFailed: ``on_start`` raised (no attempt was run by that process).
    """
    if (
        isolation not in _ISOLATIONS
        or concurrency < 1
        or (max_jobs is not None and max_jobs < 1)
        or grace_s < 0
        or (lease_s is not None and lease_s <= 0)
    ):
        raise InvalidArgument(
            "run_worker",
            f"bad options: isolation={isolation!r}, concurrency={concurrency}, "
            f"max_jobs={max_jobs}, grace_s={grace_s}, lease_s={lease_s}",
            f"isolation is one of {_ISOLATIONS}; concurrency and max_jobs are >= 1; "
            "grace_s >= 0; lease_s > 0",
        )
    plane = plane_of(plane)
    isolation = Isolation(isolation)
    refuse_script_rerun("run_worker")
    if worker_id is not None:
        check_text(worker_id, "lease.worker", "run_worker")  # it is in every lease
    if once and idle_exit is None:
        idle_exit = 0.0  # one pass over the queues
    hooks = Hooks.of(on_start, before_job, on_stop)
    allowed = Allow(allow or ())
    state = _State(
        plane=plane,
        worker_id=worker_id or f"{socket.gethostname()}:{os.getpid()}",
        isolation=isolation,
        max_jobs=1 if once else max_jobs,
        stop=stop or threading.Event(),
        hooks=hooks,
        allow=allowed,
        lease_s=lease_s,
        wait_retries=bool(idle_exit) and not once,
    )
    if metrics_textfile is not None:
        check_textfile(metrics_textfile, "run_worker")
        state.metrics_textfile = metrics_textfile
    _warn_if_lease_is_short(plane, lease_s)
    names = queues or plane.queues()
    if metrics_textfile is not None or metrics_port is not None:
        state.metrics = WorkerCounters(state.worker_id, plane.ns)
    served = None  # bound now, so that a taken port fails the start before anything else
    if metrics_port is not None:
        served = MetricsServer(
            lambda: _metrics_text(state, names), port=metrics_port, interval_s=0, op="run_worker"
        )
    try:
        _say(
            f"worker {state.worker_id} on {plane.store.url} namespace {plane.ns}: queues "
            f"{','.join(names)}, concurrency {1 if once else concurrency}, isolation {isolation}"
            + (f", allow {' '.join(f'{m}:{q}' for m, q in allowed.patterns)}" if allowed else "")
            + (f", metrics on {served.url}" if served is not None else "")
        )
        ops = [plane.ops(name) for name in names]
        state.claimers = [plane.claimer(name, state.worker_id) for name in names]
        for c in state.claimers:
            c.serving(names)  # a child's parent queued in one of them is work to come
        state.idle_exit, state.max_poll_s = idle_exit, max_poll_s
        if isolation is Isolation.PROCESS:
            warm_up()  # body processes: their fork server starts while the first claims go out
        if hooks.on_start is not None and isolation is not Isolation.PROCESS:
            try:
                hooks.on_start()  # bodies run in this process
            except BaseException as e:
                raise HookFailed(
                    "worker on_start", f"{type(e).__name__}: {e}", "fix the hook"
                ) from e
        restore = _install_signals(state) if handle_signals else None
        _announce(state, names, "running")
        for _ in range(1 if once else concurrency):
            state.slots.append(
                Slot(
                    plane,
                    isolation,
                    hooks,
                    allow=allowed,
                    # a body process ended by SIGTERM/SIGINT: was it the whole group's signal?
                    signalled=lambda: state.signalled(_SIGNAL_WAIT_S),
                )
            )
        watching = _watch_schedules(plane, names) if fire_schedules and not once else None
    except BaseException:
        if served is not None:
            served.close()
        raise
    if served is not None:
        served.start()
    try:
        for i in range(len(state.slots)):
            _start_slot(state, i)
        _supervise(state, names, grace_s, announce_s)
    except KeyboardInterrupt:
        state.stop.set()
        _release_all(state)
        _supervise(state, names, 0.0, announce_s, deadline=time.monotonic() + 10)
        raise
    finally:
        try:
            if watching is not None:  # a firing under way ends first (its object stays right)
                watching[0].set()
                watching[1].join(_SCHEDULES_JOIN_S)
            if restore is not None:
                restore()
            if hooks.on_stop is not None and isolation is not Isolation.PROCESS:
                try:
                    hooks.on_stop()
                except Exception as e:  # best effort
                    log.warning("on_stop hook failed: %s", e)
            for o in ops:
                if not o.flush():
                    log.warning(
                        "tickets of finished invocations on %s are still being tidied",
                        o.keys.queue,
                    )
            _announce(state, names, "stopped")
        finally:
            # also when a second Ctrl-C lands in the steps above: the port and its thread
            # would outlive this worker in its process (a notebook's next run is refused)
            if served is not None:
                served.close()
    if state.failure is not None:
        raise state.failure
    return state.done


def _watch_schedules(plane: Plane, names: list[str]) -> tuple[threading.Event, threading.Thread]:
    """Fire the queues' due schedule slots from a thread of this worker until the returned
    event is set."""
    done = threading.Event()
    thread = threading.Thread(
        target=Watch(plane, names).run, args=(done,), name="lakeshore-schedules", daemon=True
    )
    thread.start()
    return done, thread


def _supervise(
    state: _State,
    names: list[str],
    grace_s: float,
    every: float,
    deadline: float | None = None,
) -> None:
    """Wait for the slots (until ``deadline``, a ``time.monotonic``, if given) and watch
    their attempts; after a stop, release what still runs once ``grace_s`` passed."""
    stopped_at: float | None = None
    announced = time.monotonic()
    busy_every = min(every, _ANNOUNCE_BUSY_S)
    while True:
        with state.lock:
            threads = list(state.threads)
        if not any(t.is_alive() for t in threads):
            return
        if deadline is not None and time.monotonic() > deadline:
            return
        for t in threads:
            t.join(0.05)
        _watch_leases(state)
        _take_over_stuck(state)
        now = time.monotonic()
        if state.stop.is_set():
            stopped_at = stopped_at if stopped_at is not None else now
            if now - stopped_at >= grace_s:
                _release_all(state)
        with state.lock:
            changed = state.announced != (len(state.running), state.done)
        if now - announced >= every or (changed and now - announced >= busy_every):
            announced = now
            _announce(state, names, "stopping" if state.stop.is_set() else "running")


def _warn_if_lease_is_short(plane: Any, lease_s: float | None) -> None:
    """A store clock read from ``Date`` headers moves in steps of up to a second as it
    sharpens, and the watchdog stops a body with less than a sixth of its lease left: below
    ``_MIN_DATE_LEASE_S`` such a step can stop a healthy body."""
    lease = lease_s if lease_s is not None else plane.lease_s
    if lease >= _MIN_DATE_LEASE_S:
        return
    try:
        plane.store.now()
    except LakeshoreError:
        return  # the first claim reports the store's trouble
    if getattr(plane.store, "clock_source", "") == "server Date headers":
        log.warning(
            "run_worker: lease_s=%g is short for a clock read from server Date headers "
            "(one-second steps); bodies may be stopped early — use lease_s >= %g",
            lease,
            _MIN_DATE_LEASE_S,
        )


def _watch_leases(state: _State) -> None:
    """Stop the bodies whose lease is about to run out unrenewed. A slot's heartbeats run on
    one thread, and a request stuck for longer than a lease (retries, timeouts) would keep
    that thread from noticing: this check does not wait on any request."""
    with state.lock:
        running = list(state.running)
    for att in running:
        try:
            if att.overdue():
                log.warning(
                    "lease of %s not renewed in time: stopping its body", att.held.record.id
                )
                att.halt(Halt.LOST)
        except LakeshoreError as e:  # the clock could not be read: the heartbeat decides
            log.debug("lease check of %s failed: %s", att.held.record.id, e)


def _take_over_stuck(state: _State) -> None:
    """Give up on bodies that run in their slot's thread and did not return within a second
    of being stopped: a new thread concludes each such attempt and serves its slot. The old
    thread drops whatever its body returns and leaves (see :mod:`lakeshore.running.attempt`)."""
    with state.lock:
        running = list(state.running.items())
    now = time.monotonic()
    for att, i in running:
        if att.abandon_if_stuck(now):
            log.warning(
                "%s %s: its body has not stopped; the worker no longer waits for it (it runs on "
                "in its thread, and whatever it returns is dropped)",
                inert(att.held.record.fn),
                att.held.record.id,
            )
            _start_slot(state, i, resume=att)


def _start_slot(state: _State, i: int, resume: Attempt | None = None) -> None:
    """Start a thread serving slot ``i`` (after concluding ``resume``, an abandoned attempt
    of that slot): from now on that slot's thread."""
    t = threading.Thread(
        target=_slot, args=(state, i, resume), name=f"lakeshore-slot-{i}", daemon=True
    )
    with state.lock:
        if i < len(state.threads):
            state.threads[i] = t
        else:
            state.threads.append(t)
    t.start()


def _release_all(state: _State) -> None:
    with state.lock:
        running = list(state.running)
    for att in running:
        att.halt(Halt.RELEASED)


def _install_signals(state: _State) -> Any:
    """First SIGTERM/SIGINT: stop claiming (graceful). Second: exit now."""
    if threading.current_thread() is not threading.main_thread():
        raise InvalidArgument(
            "run_worker", "handle_signals needs the main thread", "call it from the main thread"
        )
    received = 0  # counted here: a slot may have set `stop` already for the same signal

    def handler(signum: int, _frame: Any) -> None:
        nonlocal received
        received += 1
        if received > 1:
            log.warning("second signal: exiting now (running leases will expire)")
            with state.lock:
                children = [s.child for s in state.slots if s.child is not None]
            for child in children:  # they ignore signals: they would run on as orphans
                child.kill_now()
            os._exit(128 + signum)
        log.warning(
            "signal %d: no new claims; running attempts may finish, then are released", signum
        )
        state.stop.set()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    # The handler runs on the main thread, some time after the signal came. The wakeup fd
    # is written by the interpreter at once, so a slot can tell that a signal has come.
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    seen = threading.Event()

    def signalled(wait: float = 0.0) -> bool:
        """Whether a SIGTERM/SIGINT came, waiting up to ``wait`` seconds for it: the
        interpreter writes the wakeup fd from the thread the kernel picked, which on a busy
        machine may run a moment after another thread saw a child die of the same signal."""
        deadline = time.monotonic() + wait
        while not seen.is_set():
            with contextlib.suppress(OSError):  # empty: no signal yet
                if set(os.read(r, 64)) & {signal.SIGTERM, signal.SIGINT}:
                    seen.set()
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            select.select([r], [], [], left)
        return seen.is_set()

    state.signalled = signalled

    def restore() -> None:
        signal.set_wakeup_fd(old_fd)
        for sig, h in old.items():
            signal.signal(sig, h)
        state.signalled = _never
        os.close(r)
        os.close(w)

    return restore


def _never(wait: float = 0.0) -> bool:
    return False


def _announce(state: _State, queues: list[str], status: str) -> None:
    """Best effort: a sign of life for ``lakeshore status`` (never stops the worker)."""
    store = state.plane.store
    with state.lock:
        running, done, failed = len(state.running), state.done, state.failed
        state.announced = (running, done)
        by_queue: dict[str, int] = {}
        for att in state.running:
            by_queue[att.ops.keys.queue] = by_queue.get(att.ops.keys.queue, 0) + 1
    info = {
        "worker": state.worker_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "queues": queues,
        "status": status,
        "running": running,
        "running_by_queue": by_queue,
        "done": done,
        "failed": failed,
    }
    with contextlib.suppress(LakeshoreError):
        info["seen_at"] = store.now()
        write_sign_of_life(store, state.plane.ns, state.worker_id, info)
    path = state.metrics_textfile
    if path is not None:
        try:
            write_textfile(path, _metrics_text(state, queues))
        except (OSError, LakeshoreError) as e:  # best effort, as the sign of life is
            log.warning("worker metrics: cannot write %s: %s", path, e)


def _metrics_text(state: _State, queues: list[str]) -> str:
    """The worker's counters and what it runs now, as Prometheus text."""
    assert state.metrics is not None
    with state.lock:
        by_queue: dict[str, int] = {}
        for att in state.running:
            by_queue[att.ops.keys.queue] = by_queue.get(att.ops.keys.queue, 0) + 1
    return state.metrics.text(by_queue, queues, time.time())


def _slot(state: _State, i: int, resume: Attempt | None = None) -> None:
    """Serve slot ``i`` until the worker stops, or until this thread is abandoned."""
    slot = state.slots[i]
    abandoned = False
    try:
        if resume is not None:
            _count_done(state, resume.held.record.id, resume.ops, resume.conclude_abandoned)
        _serve(state, slot, i, state.claimers, state.idle_exit, state.max_poll_s)
    except Abandoned:
        abandoned = True  # its body returned late: the slot is another thread's now
    except HookFailed as e:
        state.failure = e
        state.stop.set()
    finally:
        if not abandoned:
            slot.close()


def _serve(
    state: _State,
    slot: Slot,
    i: int,
    claimers: list[Claimer],
    idle_exit: float | None,
    max_poll_s: float,
) -> None:
    """Claim and run attempts on ``slot`` (the ``i``-th).

    Raises:
        Abandoned: this thread's body returned after the watchdog had given up on it.
        HookFailed: an ``on_start`` hook raised.
    """
    delay = 0.005
    idle_since = time.monotonic()
    turn = 0
    idle = False
    while not state.stop.is_set():
        drained = idle and idle_exit is not None
        if drained and _drained(state, claimers, idle_exit or 0.0, idle_since, max_poll_s):
            return
        # While idle, the slots of a worker poll one at a time (each holds the turn through
        # its pause), so an idle worker costs the same however many slots it has.
        if idle and not state.idle_turn.acquire(timeout=min(0.5, max_poll_s)):
            continue
        polling = idle
        try:
            if not state.count_attempt():
                return
            held, ops, turn = _claim(state, claimers, turn)
            if held is None:
                state.uncount_attempt()
                _say_idle_once(state, idle_exit)
                _maybe_sweep(state, claimers)
                if polling:  # the backoff is the worker's, not the slot's: one poll per pause
                    with state.lock:
                        delay, state.idle_delay = (
                            state.idle_delay,
                            min(state.idle_delay * 2, max_poll_s),
                        )
                idle = True
                pause(state.plane.store, delay, state.stop)
                continue
        finally:
            if polling:
                state.idle_turn.release()
        idle, delay = False, 0.005
        with state.lock:
            state.idle_delay = 0.005
        if state.stop.is_set():
            # the stop came while the claim was in flight: hand the invocation back unstarted
            _hand_back(ops, held)
            state.uncount_attempt()
            return
        # with the attempt's outcome line, what `lakeshore worker`'s status line counts as
        # running (lakeshore.cli.progress reads the records' attempt_event, not this state)
        rec = held.record
        started = {"attempt_event": "started"}
        fn = inert(rec.fn)  # a record's text, on its way to a terminal
        log.debug("%s %s attempt %d started", fn, rec.id, rec.attempt, extra=started)
        _count_done(
            state, rec.id, ops, functools.partial(run_attempt, slot, ops, held, _Tracked(state, i))
        )
        idle_since = time.monotonic()
        _maybe_sweep(state, claimers)


def _count_done(state: _State, inv: str, ops: QueueOps, run: Callable[[], Attempt]) -> None:
    """Run an attempt of ``inv`` to its end (``run``), or conclude an abandoned one, and
    count it.

    Raises:
        Abandoned: the body ran in this thread and the watchdog gave up on it meanwhile.
        HookFailed: an ``on_start`` hook raised.
    """
    outcome = "unconcluded"
    failed = False
    try:
        att = run()
        # the state word of its log text ("released (queued again, ...)"): a label's value
        outcome = att.final.partition(" ")[0]
        failed = att.final in _FAILED_STATES
        if att.interrupted:
            # its body process was ended by SIGTERM/SIGINT, and this worker got one too:
            # a signal for the whole process group, whose handler may not have run yet
            # (it runs on the main thread). Stop claiming now, not one claim later.
            state.stop.set()
    except HookFailed:
        raise
    except LakeshoreError as e:
        # The outcome could not be written (store down?): the lease will expire and a
        # claimer requeues the invocation. Keep serving.
        unconcluded = {"attempt_event": "unconcluded"}
        log.error("attempt of %s could not be concluded: %s", inv, e, extra=unconcluded)
    with state.lock:
        state.done += 1
        state.failed += failed
    if state.metrics is not None:
        state.metrics.ended(ops.keys.queue, outcome)


def _drained(
    state: _State, claimers: list[Claimer], idle_exit: float, idle_since: float, max_poll_s: float
) -> bool:
    """Idle for ``idle_exit`` seconds, no work listed that was left to other workers' lanes
    lately, and (when draining) no retry this worker has read is still to come: a retry is
    work, so the worker stays for a claim pass after it is due (one pause between polls
    later at most)."""
    if time.monotonic() - idle_since < idle_exit:
        return False
    grace = max_poll_s + 1.0
    if any(c.held_back(grace) for c in claimers):
        return False  # work is listed that other workers' lanes hold for now
    return not (state.wait_retries and any(c.retry_pending(grace) for c in claimers))


def _claim(
    state: _State, claimers: list[Claimer], turn: int
) -> tuple[Claimed | None, QueueOps, int]:
    """One claim attempt over the queues, round robin from ``turn``."""
    for i in range(len(claimers)):
        c = claimers[(turn + i) % len(claimers)]
        ops = c.ops
        try:
            started = tracing.clock()
            held = c.claim(state.plane.store.now(), state.lease_s, state.stop.is_set)
        except LakeshoreError as e:
            log.warning("claim on %s failed: %s", ops.keys.queue, e)
            continue
        except Exception:  # never let one claim end the slot: the next poll tries again
            log.exception("claim on %s failed unexpectedly", ops.keys.queue)
            continue
        if held is not None:
            tracing.claimed(held.record, started)
            return held, ops, (turn + i + 1) % len(claimers)
    return None, claimers[turn % len(claimers)].ops, turn


def _hand_back(ops: QueueOps, held: Claimed) -> None:
    """Release a claimed attempt that was never started (queued again at once, the
    attempt not counted)."""
    rec = held.record
    try:
        ops.finish(held, lifecycle.release(rec, held.token, ops.store.now()))
        log.info(
            "%s %s attempt %d -> released before it started", inert(rec.fn), rec.id, rec.attempt
        )
    except (Conflict, IllegalTransition):
        log.info("%s %s moved meanwhile (a cancel): nothing to hand back", inert(rec.fn), rec.id)
    except LakeshoreError as e:
        log.warning("handing back %s failed (its lease will expire): %s", rec.id, e)


class _Tracked:
    """The worker's running attempts, each with the slot that runs it, guarded by its lock."""

    def __init__(self, state: _State, slot: int) -> None:
        self.state = state
        self.slot = slot

    def add(self, att: Attempt) -> None:
        with self.state.lock:
            self.state.running[att] = self.slot

    def discard(self, att: Attempt) -> None:
        with self.state.lock:
            self.state.running.pop(att, None)


def _maybe_sweep(state: _State, claimers: list[Claimer]) -> None:
    """Now and then, delete rate tokens of long-past windows and free admission slots a
    crash leaked (producers never read slots: the repair is the workers' and gc's). Expired
    leases need no pass of their own: claims requeue them when they meet them at the head
    of the queue."""
    now = time.monotonic()
    with state.lock:
        if now - state.last_sweep < _SWEEP_EVERY_S:
            return
        state.last_sweep = now
    for ops in (c.ops for c in claimers):
        try:
            sweep_rate(ops, ops.store.now())
            repair_slots(ops, ops.store.now())
        except StoreError as e:
            log.warning("sweeping admission objects of %s failed: %s", ops.keys.queue, e)
