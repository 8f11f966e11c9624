"""Upstream's ``SyncQueue``, ``Queue`` and ``Topic``, over lakeshore's work queue and topics.

The verbs keep upstream's signatures and answers: ``priority`` is a float (higher first,
0.0 by default), ``since`` is the last seq you saw (``-1``: from the start), a lost claim
or a job that ended badly raises ``DispatchError``, a wait that runs out raises
``TimeoutError``. Where lakeshore is stricter it stays so: a nack is retried after the
plane's backoff (none on upstream's ``Dispatch`` spelling) and a job's lease runs out if
its consumer stalls.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ulid import ULID

import lakeshore
from dreamlake.lakeshore.dispatch import DispatchError, default_dispatch, translated
from dreamlake.lakeshore.functions import Thunk, remote_attempts
from dreamlake.lakeshore.transport import TransportError
from lakeshore.errors import Fenced, InvalidArgument, JobError, NotFinished, NotFound
from lakeshore.model.record import MAX_COUNT
from lakeshore.offload import aiterate, offload
from lakeshore.work_queue import Job, WorkQueue

__all__ = ["Job", "Queue", "SyncQueue", "Topic", "priority_of"]

_KINDS = ("fifo", "priority")
# upstream's states, as lakeshore names them; any other name counts 0 there
_STATES = {s: s for s in ("queued", "running", "succeeded", "failed")} | {"cancelled": "killed"}


def priority_of(priority: float) -> int:
    """Upstream's float priority (0.0 by default, higher first) as lakeshore's 0-9 (5 by
    default, higher first): ``5 + priority``, rounded and kept within 0-9."""
    return max(0, min(9, 5 + round(priority)))


class SyncQueue:
    """One named queue on a plane (default: ``dls.Dispatch`` from ``$LAKESHORE_URL``).
    Each object is one consumer: only the object that claimed a job can ack it.

    Raises:
        DispatchError: a claim order lakeshore does not have (``kind`` other than
            ``"fifo"``/``"priority"``).
    """

    def __init__(
        self,
        name: str,
        *,
        dispatch: lakeshore.Dispatch | None = None,
        kind: str = "fifo",
        temperature: float = 1.0,
    ) -> None:
        if kind not in _KINDS:
            raise DispatchError(
                f"unknown queue kind {kind!r}: lakeshore claims highest priority first, then "
                "oldest (fifo); filo and boltzmann orders are not available"
            )
        self.name = name
        self.kind = kind
        self.temperature = temperature
        self._dp = dispatch if dispatch is not None else default_dispatch()
        self._wq = WorkQueue(name, self._dp)
        self._posted: dict[str, int] = {}

    @property
    def dispatch(self) -> lakeshore.Dispatch:
        """The plane this queue is on."""
        return self._dp

    # -- producer ----------------------------------------------------------------------------

    def submit(
        self,
        payload: Any = None,
        *,
        envelope: bytes | None = None,
        key: str | None = None,
        priority: float = 0.0,
    ) -> str:
        """Enqueue a payload, or a :class:`Thunk` (a call of a function, pickled only where
        the plane allows pickles); returns its id. ``key`` makes it idempotent."""
        if envelope is not None:
            raise DispatchError(
                "submit: envelope= is upstream's wire format, which lakeshore does not read; "
                "submit the payload itself"
            )
        if isinstance(payload, Thunk):
            declared = self._dp.udf(payload.fn, queue=self.name)
            if declared.local_only and not self._dp.plane.in_process:
                raise TransportError(
                    f"{payload!r} has no importable name and this plane takes no pickles: "
                    "define it at module level, or make both sides' planes with "
                    "allow_pickle=True"
                )
            return declared.submit(
                *payload.args,
                _key=key,
                _priority=priority_of(priority),
                _max_attempts=remote_attempts,
                **payload.kwargs,
            )
        try:
            return self._wq.submit(
                payload, key=key, priority=priority_of(priority), max_attempts=MAX_COUNT
            )
        except InvalidArgument as e:
            if e.op.startswith("encode "):  # upstream: the wire has no codec for it
                raise TypeError(str(e)) from None
            raise

    def result(self, inv_id: str, *, timeout: float = 30.0) -> Any:
        """Wait until the job ends; its result.

        Raises:
            DispatchError: it failed or was cancelled, or the id is unknown.
            TimeoutError: still live after ``timeout`` seconds.
        """
        try:
            return self._dp.result(inv_id, timeout=timeout)
        except (JobError, NotFinished, NotFound, InvalidArgument) as e:
            raise translated("result", inv_id, e, timeout) from None

    def call(self, payload: Any, *, timeout: float = 30.0, **kw: Any) -> Any:
        """Submit and wait (RPC)."""
        return self.result(self.submit(payload, **kw), timeout=timeout)

    def stream(self, inv_id: str, *, since: int = -1, timeout: float = 30.0) -> Iterator[Any]:
        """The values posted to (or yielded by) the job after seq ``since``, as they come,
        until it ends.

        Raises:
            DispatchError: the job failed or was cancelled (after its values).
            TimeoutError: ``timeout`` seconds passed without a new value.
        """
        cursor, attempt = since + 1, None
        while True:
            moved = False
            try:
                for frame in self._dp.stream(
                    inv_id, since=cursor, timeout=timeout, attempt=attempt
                ):
                    yield frame.value
                    cursor, attempt, moved = frame.seq + 1, frame.attempt, True
                return
            except NotFinished as e:
                if not moved:  # ``timeout`` seconds without a frame, as upstream's
                    raise translated("stream", inv_id, e, timeout) from None
            except (JobError, NotFound, InvalidArgument) as e:
                raise translated("stream", inv_id, e, timeout) from None

    def cancel(self, inv_id: str) -> bool:
        """Cancel a queued job; False if it is running or over (as upstream)."""
        try:
            if self._dp.status(inv_id) != "queued":
                return False
            return self._dp.cancel(inv_id)
        except (NotFound, InvalidArgument):
            return False

    def count(self, state: str = "queued") -> int:
        """Jobs of this queue in ``state`` (upstream's names; an unknown one counts 0)."""
        ours = _STATES.get(state)
        return 0 if ours is None else self._wq.count(ours)

    def __len__(self) -> int:
        """``count("queued")``."""
        return self.count()

    # -- worker ------------------------------------------------------------------------------

    def claim(self) -> Job | None:
        """Claim one job (None when there is none)."""
        return self._wq.claim()

    def ack(self, job: Job | str, result: Any = None) -> None:
        """The job succeeded with ``result``.

        Raises:
            DispatchError: this object does not hold it (never claimed here, already
                ended, or its lease was lost).
        """
        held = self._held(job, "ack")
        try:
            held.ack(result)
        except Fenced:
            raise self._lost("ack", held.id) from None

    def nack(self, job: Job | str, *, error: str, retry: bool = True) -> None:
        """The job failed with ``error``; queued again if ``retry`` (and attempts remain)."""
        held = self._held(job, "nack")
        try:
            held.nack(error, retry)
        except Fenced:
            raise self._lost("nack", held.id) from None

    @contextlib.contextmanager
    def working(self) -> Iterator[Job | None]:
        """``with q.working() as job:`` — ack on success, nack on an exception."""
        with self._wq.working() as job:
            yield job

    def post(self, inv_id: str, value: Any, *, final: bool = False) -> int:
        """Add ``value`` to a held job's stream; its seq. ``final=True`` only returns the
        next seq: here the stream ends when the job is acked."""
        held = self._held(inv_id, "post")
        if final:
            return self._posted.get(held.id, 0)
        seq = held.post(value)
        self._posted[held.id] = seq + 1
        return seq

    def topic(self, name: str | None = None) -> Topic:
        """The plane's topic ``name`` (a fresh name when None)."""
        return Topic(name or f"topic-{str(ULID()).lower()}", self._dp)

    def _held(self, job: Job | str, verb: str) -> Job:
        """The claim this object holds now for ``job``: given as an id, the latest claim of
        that id; given as a ``Job``, that very claim and no other.

        Raises:
            DispatchError: this object holds no such claim (never claimed here, already
                ended, or an older attempt whose lease ran out and whose id was claimed
                again: ending it would end the newer attempt).
        """
        inv = job.id if isinstance(job, Job) else job
        try:
            held = self._wq.held(inv)
        except InvalidArgument:
            raise self._lost(verb, inv) from None
        if held.ended or (isinstance(job, Job) and held is not job):
            raise self._lost(verb, inv)
        return held

    def _lost(self, verb: str, inv: str) -> DispatchError:
        drop = "drop this attempt's result" if verb == "ack" else "drop this attempt"
        return DispatchError(
            f"{verb}: invocation {inv!r} is not running under worker {self._wq.consumer!r} "
            f"— the claim was lost (re-dispatched or cancelled); {drop}"
        )

    def __repr__(self) -> str:
        return f"<SyncQueue {self.name!r} kind={self.kind}>"


class Topic:
    """A plane's named stream: ``post``, ``listen`` (one value) and ``stream``."""

    def __init__(self, name: str, dispatch: lakeshore.Dispatch) -> None:
        self.name = name
        self._topic = dispatch.topic(name)

    def post(self, value: Any, *, final: bool = False) -> int:
        """Append ``value`` (or, with ``final``, the end: the value is dropped); its seq."""
        return self._topic.close() if final else self._topic.post(value)

    def listen(self, *, since: int = -1, timeout: float = 5.0) -> Any | None:
        """The first value after seq ``since``; None at the end or after ``timeout`` s."""
        for frame in self._topic.listen(since=since + 1, timeout=timeout):
            return frame.value
        return None

    def stream(self, *, since: int = -1, timeout: float = 5.0) -> Iterator[Any]:
        """The values after seq ``since`` until the end.

        Raises:
            TimeoutError: ``timeout`` seconds passed without a value.
        """
        quiet = time.monotonic()
        for frame in self._topic.listen(since=since + 1, timeout=timeout):
            yield frame.value
            quiet = time.monotonic()
        if time.monotonic() - quiet >= timeout:
            raise TimeoutError(f"journal for {self.name}: no frames for {timeout}s")

    def __repr__(self) -> str:
        return f"<Topic {self.name!r}>"


class Queue:
    """The async spelling of :class:`SyncQueue`: the same verbs, awaited (each runs the
    blocking one in a thread); ``sync`` is the blocking queue."""

    def __init__(self, name: str, **kw: Any) -> None:
        self._q = SyncQueue(name, **kw)
        self.name = name

    @property
    def sync(self) -> SyncQueue:
        """The blocking queue these verbs run (the same consumer)."""
        return self._q

    submit = offload(SyncQueue.submit)
    result = offload(SyncQueue.result)
    call = offload(SyncQueue.call)
    cancel = offload(SyncQueue.cancel)
    count = offload(SyncQueue.count)
    claim = offload(SyncQueue.claim)
    ack = offload(SyncQueue.ack)
    nack = offload(SyncQueue.nack)

    async def stream(
        self, inv_id: str, *, since: int = -1, timeout: float = 30.0
    ) -> AsyncIterator[Any]:
        """:meth:`SyncQueue.stream`, each wait in a thread."""
        async for value in aiterate(self._q.stream(inv_id, since=since, timeout=timeout)):
            yield value

    def topic(self, name: str | None = None) -> Topic:
        """:meth:`SyncQueue.topic` (a blocking topic, as upstream's)."""
        return self._q.topic(name)

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} kind={self._q.kind}>"
