"""A work queue: producers submit payloads; consumers claim them, then ack or nack.

No function is involved. A payload invocation is an invocation like any other (ticket,
record, lease, admission, key, retries, journal), whose record names ``fn="payload"`` and
whose arguments are the one payload, so ``lakeshore ls``, ``show``, ``result``, ``cancel``,
``retry`` and ``gc`` work on it unchanged. Function workers pass payloads over and consumers
pass function invocations over, so one queue name may serve both (one kind each is simpler).

A consumer's claim is a worker's claim: a conditional write of the record with a fresh lease
token. Its ack, nack and release are a worker's outcome write (``running.attempt.conclude``),
conditional on the etag the consumer holds. Once the lease is lost (it ran out, the
invocation was cancelled, or it was taken over) they raise :class:`Fenced` and change
nothing. A consumer that needs longer than its lease heartbeats, or works inside
``with job:``, which heartbeats for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import threading
import time
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator
from types import TracebackType
from typing import Any

from lakeshore import codec, results
from lakeshore.batch import submit_many
from lakeshore.dispatch import default_plane
from lakeshore.errors import (
    DecodeError,
    Fenced,
    InvalidArgument,
    LakeshoreError,
    StoreError,
    StoreUnavailable,
)
from lakeshore.keys import QueueKeys, check_name
from lakeshore.model.record import LIVE, PAYLOAD_FN, STATES, Record
from lakeshore.offload import aiterate, offload
from lakeshore.plane import HasPlane, Plane, plane_of
from lakeshore.protocol import census, polling
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.steps import Claimed, QueueOps
from lakeshore.running.attempt import Attempt, Halt, Heartbeats, conclude, fatal
from lakeshore.running.bodies import Declared
from lakeshore.running.call import Outcome, Verdict, body_error, error_of
from lakeshore.streams.journal import Frame, JournalWriter
from lakeshore.submit import submit_call
from lakeshore.text import inert

__all__ = ["AsyncWorkQueue", "Job", "WorkQueue"]

log = logging.getLogger("lakeshore.worker")

_LAST_ID = "~"  # sorts after every id (and before nothing a queue folder holds but ids)


def _payload(payload: Any, /) -> None:
    """What a payload submit binds its value to (``input_hash``): one positional value."""


class _PayloadBody(Declared):
    """The stand-in body of a payload submit: the options a submit takes, under the name
    ``payload`` that no function can have."""

    def __init__(self, queue: str) -> None:
        super().__init__(_payload, False, queue=queue)
        self.ref = PAYLOAD_FN


class Job:
    """One payload claimed by a consumer: ``id``, ``payload``, ``attempt`` (1 on the first
    claim), ``queue``. End it once with :meth:`ack`, :meth:`nack` or :meth:`release`.

    ``with job:`` heartbeats while the block runs, acks with ``None`` when it ends normally
    (unless the block ended the job itself), nacks (retry) on an exception, and releases
    the job on ``KeyboardInterrupt``, ``SystemExit`` or an asyncio cancel.
    """

    def __init__(self, plane: Plane, ops: QueueOps, held: Claimed, payload: Any) -> None:
        rec = held.record
        self.id = rec.id
        self.queue = rec.queue
        self.attempt = rec.attempt
        self.payload = payload
        self._plane = plane
        self._ops = ops
        self._att = Attempt(ops, held, strict=True)
        self._journal: JournalWriter | None = None
        self._lock = threading.Lock()
        self._ended = ""  # the state the job was left in
        self._beats: Heartbeats | None = None

    @property
    def ended(self) -> str:
        """The state the job was left in (``succeeded``, ``queued``, ``failed``,
        ``released``, ``fenced``, ``killed``, or ``unknown`` after a store failure while
        ending it); empty while it is held."""
        return self._ended

    @property
    def record(self) -> Record:
        """The record as this consumer last wrote it (a snapshot)."""
        return self._att.held.record

    @property
    def lease_left(self) -> float:
        """Seconds of the lease still ahead, in the store's clock (negative once past)."""
        return self._att.lease_left()

    @property
    def lost(self) -> bool:
        """True once the lease is known to be lost (cancelled, or taken over): stop working,
        an ack would be refused."""
        return self._att.stop.is_set()

    def heartbeat(self) -> float:
        """Push the lease out by its length; returns the seconds it now has ahead.

        Raises:
            Fenced: the lease was lost (ran out, cancelled or taken over); nothing written.
            InvalidArgument: the job was already acked, nacked or released.
            StoreError: the store failed; the lease may still hold, try again.
        """
        op = f"heartbeat {self.id}"
        with self._lock:
            self._check_open(op)
            if self._att.lease_left() <= 0:
                self._att.halt(Halt.LOST)
            if not self._att.fence():
                raise self._fenced(op, "lost its lease")
            return self._att.lease_left()

    def post(self, value: Any) -> int:
        """Add ``value`` to the job's stream: ``q.stream(job.id)`` readers get it as a frame
        (written in batches within ~50 ms). Returns its seq (0 for the first). The stream
        ends when the job is acked.

        Raises:
            InvalidArgument: the value cannot be sent, is over the frame limit, or the job
                was already ended.
            Fenced: the lease was lost.
            StoreError: an earlier batch of frames could not be written.
        """
        op = f"post to {self.id}"
        data = codec.encode(value, "posted value")
        with self._lock:
            self._check_open(op)
            if self._att.stop.is_set():
                raise self._fenced(op, "lost its lease")
            writer = self._writer()
            seq = writer.frames
            writer.add(data)
            return seq

    def ack(self, result: Any = None) -> None:
        """The job succeeded with ``result`` (what ``result(id)`` returns; a job that posted
        frames and acks without a result returns the posted values, as a generator does).

        Raises:
            Fenced: the lease was lost; the ack was not applied (another consumer may have
                the job, or it is queued for a retry).
            InvalidArgument: ``result`` cannot be sent or is over ``max_payload_bytes``
                (the job is still held: ack again, or nack), or the job was already ended.
            StoreError: the store failed while ending the job; whether the ack landed is
                unknown (see ``q.status(job.id)``). The job cannot be ended again by this
                object; if the ack did not land, its lease runs out and it is retried.
        """
        op = f"ack {self.id}"
        data = codec.encode(result, f"result of {self.id}")
        cap = self._plane.max_payload_bytes
        if len(data) > cap:
            raise InvalidArgument(
                op,
                f"the result is {len(data)} bytes, over max_payload_bytes={cap}",
                "write large outputs with dls.run.write and ack with their keys",
            )
        posted_only = result is None and self._journal is not None
        self._end(op, Outcome(Verdict.OK, value=None if posted_only else data), ("succeeded",))

    def nack(self, error: BaseException | str = "nacked", retry: bool = True) -> str:
        """The job failed with ``error`` (an exception, traceback included, or a message).
        With ``retry`` it is queued again after the backoff while attempts remain; else, or
        with no attempts left, or for a :class:`~lakeshore.errors.Permanent` exception, it
        fails for good. Returns the state it is left in:
        ``"queued"`` or ``"failed"``.

        Raises:
            Fenced: the lease was lost; the nack was not applied.
            InvalidArgument: the job was already ended.
            StoreError: the store failed while ending the job, as for :meth:`ack`.
        """
        if isinstance(error, BaseException):  # lakeshore.Permanent fails at once
            outcome = body_error(error)
            outcome.final = outcome.final or not retry
        else:
            err = {"type": "Nacked", "message": str(error), "traceback": ""}
            outcome = Outcome(Verdict.ERROR, error=err, final=not retry)
        self._end(f"nack {self.id}", outcome, ("queued", "failed"))
        return self._ended

    def release(self) -> None:
        """Hand the job back at once, not counted as an attempt (a consumer shutting down).

        Raises:
            Fenced: the lease was lost.
            InvalidArgument: the job was already ended.
            StoreError: the store failed while ending the job, as for :meth:`ack`.
        """
        self._end(f"release {self.id}", Outcome(Verdict.STOPPED), ("queued",), release=True)

    def _end(
        self, op: str, outcome: Outcome, applied: tuple[str, ...], release: bool = False
    ) -> None:
        with self._lock:
            self._check_open(op)
            self._stop_beating()
            if self._att.lease_left() <= 0 and not self._att.stop.is_set():
                self._att.halt(Halt.LOST)  # past its lease: someone may be claiming it now
            if release:
                self._att.halt(Halt.RELEASED)  # (no-op once lost or cancelled)
            lost = self._att.stop.is_set() and self._att.why is not Halt.RELEASED
            try:
                state, _ = conclude(self._plane, self._att, outcome, self._writer())
            except BaseException:
                self._ended = "unknown"  # its journal may be closed: never end it twice
                raise
            state = state.split(" ", 1)[0]  # "released (…)" -> "released"
            self._ended = state
        if lost or state not in (*applied, "released"):
            if state in ("queued", "failed", "succeeded") and not lost:
                raise StoreError(
                    op,
                    f"the posted frames could not be written, so the job was left {state}",
                    "it is retried while attempts remain"
                    if state == "queued"
                    else "submit the payload again if it should run",
                    id=self.id,
                    state=state,
                )
            raise self._fenced(op, "lost its lease" if state != "killed" else "was cancelled")

    def _writer(self) -> JournalWriter:
        if self._journal is None:
            keys, inv, attempt = self._ops.keys, self.id, self.attempt
            self._journal = JournalWriter(
                self._ops.store, lambda seq: keys.journal(inv, attempt, seq), attempt
            )
        return self._journal

    def _check_open(self, op: str) -> None:
        if self._ended in ("fenced", "killed"):
            raise self._fenced(op, "lost its lease" if self._ended == "fenced" else "was cancelled")
        if self._ended:
            raise InvalidArgument(
                op, f"the job was already ended ({self._ended})", "end a job once", id=self.id
            )

    def _fenced(self, op: str, what: str) -> Fenced:
        return Fenced(
            op,
            f"the job {what} (its lease ran out, it was cancelled, or another consumer took "
            f"it over), so this was not applied",
            "stop working on it; see q.status(id) for what became of it (heartbeat more often "
            "than its lease, or work inside `with job:`)",
            id=self.id,
        )

    def _stop_beating(self) -> None:
        if self._beats is not None:
            self._beats.detach()
            self._beats.close()
            self._beats = None

    def __enter__(self) -> Job:
        with self._lock:
            self._check_open(f"work on {self.id}")
            self._beats = Heartbeats()
            self._beats.attach(self._att)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ended:
            with self._lock:
                self._stop_beating()
            return
        if exc is None:
            self.ack()
            return
        try:
            if isinstance(exc, Exception):
                self.nack(exc)
            else:  # interrupted, exiting or cancelled: not the job's fault
                self.release()
        except LakeshoreError as e:  # the block's own exception is what the caller needs
            log.warning("could not end %s after %s: %s", self.id, type(exc).__name__, e)

    def __repr__(self) -> str:
        state = self._ended or "held"
        return f"<Job {self.id} attempt {self.attempt} on {self.queue!r} ({state})>"


def _plane_given(
    plane: Plane | HasPlane | None, dispatch: Plane | HasPlane | None, op: str
) -> Plane | HasPlane | None:
    """``plane``, or ``dispatch`` (its deprecated name) with a warning."""
    if dispatch is None:
        return plane
    if plane is not None:
        raise InvalidArgument(
            op, "both plane= and dispatch= given", "pass plane= only (dispatch= is its old name)"
        )
    warnings.warn(
        f"{op}(dispatch=...) is deprecated: pass plane=... (or the Dispatch as the second "
        "argument)",
        DeprecationWarning,
        stacklevel=3,
    )
    return dispatch


class WorkQueue:
    """Producers' and consumers' view of queue ``name`` on ``plane``: a ``Dispatch`` (or its
    ``Plane``); default: the default plane, as ``@dls.udf`` uses. Each object is one
    consumer: its claims are leased in its own name, and two objects compete for jobs as two
    processes would. ``dispatch=`` is the deprecated name of ``plane=``.

    Raises:
        InvalidArgument: a bad queue name, or both ``plane`` and ``dispatch``.
    """

    def __init__(
        self,
        name: str = "default",
        plane: Plane | HasPlane | None = None,
        *,
        dispatch: Plane | HasPlane | None = None,
    ) -> None:
        plane = _plane_given(plane, dispatch, "WorkQueue")
        self.name = check_name(name, "queue")
        self._given = plane if plane is not None else default_plane()
        self._plane = plane_of(self._given)
        self.consumer = f"{socket.gethostname()[:64]}:{os.getpid()}:{secrets.token_hex(4)}"
        self._ops = self._plane.ops(self.name)
        self._body = _PayloadBody(self.name)
        self._claimer = Claimer(self._ops, self.consumer, payloads=True)
        self._held: dict[str, Job] = {}
        self._lock = threading.Lock()

    @property
    def plane(self) -> Plane | HasPlane:
        """The plane this queue is on, as it was given (a ``Dispatch``, or the default
        plane)."""
        return self._given

    @property
    def dispatch(self) -> Plane | HasPlane:
        """Deprecated: :attr:`plane`."""
        warnings.warn(
            "WorkQueue.dispatch is deprecated: use WorkQueue.plane",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._given

    # -- producers ---------------------------------------------------------------------------

    def submit(
        self,
        payload: Any = None,
        *,
        key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        deadline_s: float | None = None,
        strict_key: bool = False,
        submit_timeout: float = 60.0,
    ) -> str:
        """Enqueue ``payload`` (any value lakeshore can send); returns its id.

        ``key`` makes the submit idempotent (the same key returns the first id), with
        ``strict_key`` raising if it named another payload; ``priority`` 0-9, higher first;
        ``max_attempts`` how many claims may fail; ``deadline_s`` seconds after which a
        still-queued payload is never handed out (it ends as ``timeout``).

        Raises:
            InvalidArgument: an unsendable payload or a bad option.
            KeyReused: ``strict_key`` and ``key`` named another payload.
            QueueFull: the queue's admission refused the submit.
            StoreError: the store failed.
        """
        return submit_call(
            self._plane,
            self._body,
            (payload,),
            {},
            key=key,
            priority=priority,
            max_attempts=max_attempts,
            deadline_s=deadline_s,
            strict_key=strict_key,
            submit_timeout=submit_timeout,
        )

    def submit_many(
        self,
        /,
        payloads: Iterable[Any],
        *,
        keys: Iterable[str | None] | None = None,
        concurrency: int | None = None,
        progress: bool = False,
        **options: Any,
    ) -> list[str]:
        """Submit every payload, written concurrently; returns the ids in input order.
        ``keys`` gives one key per payload (None for none); the other options are
        :meth:`submit`'s, for every payload. Nothing is written if any payload is bad.

        Raises:
            InvalidArgument, KeyReused: a bad payload, key or option (nothing was written).
            MapFailed: some payloads were not submitted; ``.ids`` has the others' ids.
        """
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((p,), {}) for p in payloads]
        return submit_many(
            self._plane,
            self._body,
            calls,
            keys=keys,
            concurrency=concurrency,
            progress=progress,
            **options,
        )

    def call(self, /, payload: Any = None, *, timeout: float | None = None, **options: Any) -> Any:
        """Submit ``payload`` and wait for a consumer's ack: its result (RPC).

        Raises:
            Failed, Killed, TimedOut: the job ended that way.
            NotFinished: no ack within ``timeout`` seconds (the job stays queued).
            InvalidArgument, QueueFull, StoreError: as :meth:`submit`.
        """
        return self.result(self.submit(payload, **options), timeout=timeout)

    def result(self, inv: str, timeout: float | None = None) -> Any:
        """Wait for job ``inv`` to end; its result. See :meth:`Dispatch.result`.

        Raises:
            Failed, Killed, TimedOut, NotFinished, NotFound: as ``Dispatch.result``.
        """
        return results.result(self._plane, inv, timeout)

    def stream(self, inv: str, since: int = 0, timeout: float | None = None) -> Iterator[Frame]:
        """Follow the values a consumer posts to job ``inv``. See :meth:`Dispatch.stream`.

        Raises:
            Failed, Killed, TimedOut, NotFinished, NotFound, InvalidArgument: as
                ``Dispatch.stream``.
        """
        return results.stream(self._plane, inv, since, timeout)

    def status(self, inv: str) -> str:
        """The job's state. Raises: NotFound, InvalidArgument (as ``Dispatch.status``)."""
        return str(self._plane.locate(inv)[1].state)

    def cancel(self, inv: str) -> bool:
        """Cancel job ``inv``; False if it had ended. A consumer holding it finds its next
        heartbeat or ack refused. Raises: NotFound."""
        ops, rec, etag = self._plane.locate(inv)
        return ops.cancel(rec, etag, "cancelled")

    def count(self, state: str = "queued") -> int:
        """How many invocations of this queue are in ``state`` (payloads, and function calls
        if the queue name serves both). ``queued`` and ``running`` read
        the records of the live jobs only; a finished state reads every record the queue
        keeps (run ``lakeshore gc`` to bound that).

        Raises:
            InvalidArgument: not a state. StoreError: the store failed.
        """
        if state not in STATES:
            raise InvalidArgument(
                f"count {self.name}", f"unknown state {state!r}", f"use one of {', '.join(STATES)}"
            )
        return self._census(live_only=state in LIVE).get(state, 0)

    def counts(self) -> dict[str, int]:
        """Invocations of this queue by state, every state present (reads every record).

        Raises:
            StoreError: the store failed.
        """
        found = self._census(live_only=False)
        return {str(s): found.get(s, 0) for s in STATES}

    def __len__(self) -> int:
        return self.count("queued")

    def __bool__(self) -> bool:  # a queue object is never "false" because it is empty
        return True

    def _census(self, live_only: bool) -> dict[str, int]:
        ops = self._ops
        ids = {QueueKeys.id_of(i.key) for i in ops.store.list(ops.keys.tickets_prefix)}
        if not live_only:
            ids.update(census.ids_between(ops.store, ops.keys, None, _LAST_ID))
        found: dict[str, int] = {}
        for rec in census.records(ops, sorted(ids)):
            found[rec.state] = found.get(rec.state, 0) + 1
        return found

    # -- consumers ---------------------------------------------------------------------------

    def claim(self, lease_s: float | None = None, wait: float = 0.0) -> Job | None:
        """Take the next payload, leased for ``lease_s`` seconds (default: the job's lease,
        from the queue's ``lease_s`` setting; a length given here is kept by the job for its
        later attempts, as a worker's ``--lease`` is); None if there is none within
        ``wait`` seconds.
        Two consumers never hold the same job while its lease lasts.

        A payload that cannot be read (corrupt, or not a lakeshore value) is failed for good
        on the way, and the next one is taken.

        Raises:
            InvalidArgument: a bad ``lease_s`` or ``wait``. StoreError: the store failed.
        """
        op = f"claim from {self.name}"
        if lease_s is not None and (
            isinstance(lease_s, bool)
            or not isinstance(lease_s, (int, float))
            or not 0.1 <= lease_s < 1e9
        ):
            raise InvalidArgument(
                op, f"lease_s={lease_s!r} is not a lease length", "pass seconds >= 0.1, or None"
            )
        if not isinstance(wait, (int, float)) or not 0 <= wait < 1e9:
            raise InvalidArgument(op, f"wait={wait!r} is not a wait", "pass seconds >= 0")
        deadline = time.monotonic() + wait
        delay = 0.01
        while True:
            job = self._take(lease_s)
            left = deadline - time.monotonic()
            if job is not None or left <= 0:
                return job
            polling.pause(self._ops.store, min(delay, left))
            delay = min(delay * 2, 1.0)

    def claim_many(self, n: int, lease_s: float | None = None) -> list[Job]:
        """Up to ``n`` payloads, each as :meth:`claim` takes one (none waits).

        Raises:
            InvalidArgument: ``n`` < 1 or a bad ``lease_s``. StoreError: the store failed.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgument(f"claim from {self.name}", f"n={n!r}", "pass an int >= 1")
        jobs: list[Job] = []
        while len(jobs) < n:
            job = self.claim(lease_s)
            if job is None:
                break
            jobs.append(job)
        return jobs

    @contextlib.contextmanager
    def working(self, lease_s: float | None = None, wait: float = 0.0) -> Iterator[Job | None]:
        """``with q.working() as job:`` claims one payload (None if there is none within
        ``wait`` seconds) and ends it as ``with job:`` does: ack on success, nack on an
        exception, heartbeats meanwhile.

        Raises:
            as :meth:`claim`, and :meth:`Job.ack` when the block ended normally.
        """
        job = self.claim(lease_s, wait)
        if job is None:
            yield None
            return
        with job:
            yield job

    def ack(self, job: Job | str, result: Any = None) -> None:
        """:meth:`Job.ack` for a job this object claimed (given as the job or its id)."""
        self.held(job, "ack").ack(result)

    def nack(
        self, job: Job | str, error: BaseException | str = "nacked", retry: bool = True
    ) -> str:
        """:meth:`Job.nack` for a job this object claimed (given as the job or its id)."""
        return self.held(job, "nack").nack(error, retry)

    def heartbeat(self, job: Job | str) -> float:
        """:meth:`Job.heartbeat` for a job this object claimed."""
        return self.held(job, "heartbeat").heartbeat()

    def post(self, job: Job | str, value: Any) -> int:
        """:meth:`Job.post` for a job this object claimed."""
        return self.held(job, "post to").post(value)

    def release(self, job: Job | str) -> None:
        """:meth:`Job.release` for a job this object claimed."""
        self.held(job, "release").release()

    def _take(self, lease_s: float | None) -> Job | None:
        ops = self._ops
        while True:
            held = self._claimer.claim(ops.store.now(), lease_s)
            if held is None:
                return None
            rec = held.record
            try:
                payload = self._payload_of(rec)
            except StoreUnavailable as e:  # may work next time: an ordinary failed attempt
                self._give_up(held, Outcome(Verdict.ERROR, error=error_of(e)))
                continue
            except LakeshoreError as e:  # would fail every time: fail it for good
                log.warning("claim from %s: failing %s: %s", self.name, rec.id, inert(str(e)))
                self._give_up(held, fatal(e))
                continue
            job = Job(self._plane, ops, held, payload)
            with self._lock:
                self._held = {k: j for k, j in self._held.items() if not j.ended}
                self._held[job.id] = job
            return job

    def _payload_of(self, rec: Record) -> Any:
        what = f"payload of {rec.id}"
        data = self._ops.get_blob(rec.args, what, self._plane.max_payload_bytes)
        args, kwargs = codec.decode_call(data, what)
        if len(args) != 1 or kwargs:
            raise DecodeError(
                f"claim {rec.id}",
                "its arguments are not one payload",
                "submit payloads with WorkQueue.submit",
            )
        return args[0]

    def _give_up(self, held: Claimed, outcome: Outcome) -> None:
        att = Attempt(self._ops, held)
        keys, inv, attempt = self._ops.keys, held.record.id, held.record.attempt
        journal = JournalWriter(
            self._ops.store, lambda seq: keys.journal(inv, attempt, seq), attempt
        )
        conclude(self._plane, att, outcome, journal)

    def held(self, job: Job | str, verb: str = "find") -> Job:
        """The job this object claimed, given as itself or its id (ended ones included
        until the next claim).

        Raises:
            InvalidArgument: this object never claimed it.
        """
        if isinstance(job, Job):
            return job
        with self._lock:
            found = self._held.get(job) if isinstance(job, str) else None
        if found is None:
            raise InvalidArgument(
                f"{verb} {job!r}",
                "this work queue object holds no such job",
                "pass the Job that claim returned, on the object that claimed it",
            )
        return found

    def __repr__(self) -> str:
        return f"<WorkQueue {self.name!r} on {self._plane.store.url} ns={self._plane.ns!r}>"


class AsyncWorkQueue:
    """:class:`WorkQueue` for asyncio code: the same verbs, awaited; each runs the blocking
    one in a thread (``sync``), so a long wait never stalls the event loop.

    Raises:
        InvalidArgument: a bad queue name, or both ``plane`` and ``dispatch``.
    """

    def __init__(
        self,
        name: str = "default",
        plane: Plane | HasPlane | None = None,
        *,
        dispatch: Plane | HasPlane | None = None,
    ) -> None:
        self._sync = WorkQueue(name, _plane_given(plane, dispatch, "AsyncWorkQueue"))
        self.name = self._sync.name

    @property
    def sync(self) -> WorkQueue:
        """The blocking work queue these verbs run (same consumer, same jobs)."""
        return self._sync

    submit = offload(WorkQueue.submit)
    submit_many = offload(WorkQueue.submit_many)
    call = offload(WorkQueue.call)
    result = offload(WorkQueue.result)
    status = offload(WorkQueue.status)
    cancel = offload(WorkQueue.cancel)
    count = offload(WorkQueue.count)
    counts = offload(WorkQueue.counts)
    claim_many = offload(WorkQueue.claim_many)
    ack = offload(WorkQueue.ack)
    nack = offload(WorkQueue.nack)
    heartbeat = offload(WorkQueue.heartbeat)
    post = offload(WorkQueue.post)
    release = offload(WorkQueue.release)

    async def stream(
        self, inv: str, since: int = 0, timeout: float | None = None
    ) -> AsyncIterator[Frame]:
        """:meth:`WorkQueue.stream`, each poll in a thread."""
        frames = await asyncio.to_thread(self._sync.stream, inv, since, timeout)
        async for frame in aiterate(frames):
            yield frame

    async def claim(self, lease_s: float | None = None, wait: float = 0.0) -> Job | None:
        """:meth:`WorkQueue.claim`, awaited. A task cancelled while it waits releases the
        job its thread claimed meanwhile, so no job is left held by nobody."""
        claiming = asyncio.ensure_future(asyncio.to_thread(self._sync.claim, lease_s, wait))
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            job = await claiming
            if job is not None:
                await asyncio.to_thread(job.release)
            raise

    @contextlib.asynccontextmanager
    async def working(
        self, lease_s: float | None = None, wait: float = 0.0
    ) -> AsyncIterator[Job | None]:
        """``async with q.working() as job:`` — :meth:`WorkQueue.working`, awaited (a
        cancelled task releases its job)."""
        job = await self.claim(lease_s, wait)
        if job is None:
            yield None
            return
        job.__enter__()  # starts its heartbeat thread: no request, nothing to await
        try:
            yield job
        except BaseException as e:
            await asyncio.shield(asyncio.to_thread(job.__exit__, type(e), e, e.__traceback__))
            raise
        await asyncio.shield(asyncio.to_thread(job.__exit__, None, None, None))

    def __repr__(self) -> str:
        return f"<AsyncWorkQueue {self.name!r} on {plane_of(self._sync.plane).store.url}>"
