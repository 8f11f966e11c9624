"""``Dispatch``: the user's facade of a plane — declare functions, look up, follow and cancel
invocations by id, from any process. It holds its :class:`~lakeshore.plane.Plane`
(``q.plane``) and shows the user's verbs only.

There is no Future: ``submit`` returns a ULID string and everything else takes that string.
A process that never saw the submit reads the result just as well as the one that made it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar, overload

from lakeshore import firing, results
from lakeshore.errors import InvalidArgument
from lakeshore.files.context import scope as run_scope
from lakeshore.files.root import DataRoot
from lakeshore.keys import DEFAULT_QUEUE, check_name
from lakeshore.model.queue_config import QueueConfig
from lakeshore.model.record import Record
from lakeshore.model.schedule import Schedule
from lakeshore.offload import aiterate, offload
from lakeshore.plane import DEFAULT_URL, Plane
from lakeshore.protocol.bulk_retry import Selection, epoch_s, retry_selected
from lakeshore.running.bodies import Declared, function_ref
from lakeshore.running.failure import RetryOptions
from lakeshore.running.logs import follow_logs, read_logs
from lakeshore.store import Store
from lakeshore.streams.journal import Frame
from lakeshore.streams.topic import Topic
from lakeshore.udf import Udf

__all__ = ["DEFAULT_URL", "Dispatch", "default_plane", "scope", "udf"]

P = ParamSpec("P")
R = TypeVar("R")


class Dispatch:
    """A lakeshore plane on one store.

    Args:
        url: ``":memory:"``, ``"file:///dir"`` or ``"s3://bucket/prefix"``; default
            ``$LAKESHORE_URL``, else the embedded default ``file://~/.lakeshore`` that every
            process of this user on this machine shares. An empty string is refused: it is
            a URL that went missing, not a request for the default (an empty
            ``$LAKESHORE_URL`` counts as unset).
        ns: namespace; queues and idempotency keys are per namespace.
        store: an already opened store (overrides ``url``).
        spill_bytes: arguments and results larger than this go to their own object.
        max_attempts: default attempts per invocation submitted through this plane.
        lease_s: default lease length of those invocations; workers heartbeat every third
            of it.
        retry_backoff_s: default base of their exponential retry backoff.
        allow_pickle: accept pickled callables (both submitter and worker must opt in).
        data: the data root for ``dls.run.read/write``: any fsspec URL (``s3://bucket/data``,
            ``file:///scratch/data``, ``memory://x``); default ``$LAKESHORE_DATA``, else the
            folder ``data/<ns>`` beside the store (an S3 store's bucket and prefix, a local
            store's directory, a private ``memory://`` folder for ``":memory:"``).
        data_options: fsspec storage options for ``data``; an ``s3://`` root on an S3 plane
            reuses the plane's endpoint and credentials when none are given.
        cache_dir: where read files are cached and written ones staged (default
            ``$LAKESHORE_CACHE``, else a per-user folder in the temporary directory).
        max_payload_bytes: the largest encoded arguments or result this plane sends or
            accepts (default 256 MiB); bigger data belongs in files (``dls.run.write``).

    Raises:
        InvalidArgument: bad URL, namespace or setting.
    """

    def __init__(
        self,
        url: str | None = None,
        ns: str = "default",
        *,
        store: Store | None = None,
        spill_bytes: int = 64 * 1024,
        max_attempts: int = 3,
        lease_s: float = 30.0,
        retry_backoff_s: float = 1.0,
        allow_pickle: bool = False,
        data: str | None = None,
        data_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        max_payload_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self._plane = Plane(
            url,
            ns,
            store=store,
            spill_bytes=spill_bytes,
            max_attempts=max_attempts,
            lease_s=lease_s,
            retry_backoff_s=retry_backoff_s,
            allow_pickle=allow_pickle,
            data=data,
            data_options=data_options,
            cache_dir=cache_dir,
            max_payload_bytes=max_payload_bytes,
        )
        self._topics: dict[str, Topic] = {}  # one handle per name: it knows the tail
        self._lock = threading.Lock()

    @property
    def plane(self) -> Plane:
        """The plane under this facade, for lakeshore's own layers and for tests."""
        return self._plane

    @property
    def url(self) -> str:
        """The store URL this plane was opened with."""
        return self._plane.url

    @property
    def ns(self) -> str:
        """The namespace: queues and idempotency keys are per namespace."""
        return self._plane.ns

    @property
    def store(self) -> Store:
        """The store under this plane."""
        return self._plane.store

    @property
    def data_root(self) -> DataRoot:
        """Where this plane's bodies read and write files (see ``data`` above).

        Raises:
            InvalidArgument: the data root URL is unusable or its fsspec driver is missing.
        """
        return self._plane.data_root

    def __repr__(self) -> str:
        return f"Dispatch({self.url!r}, ns={self.ns!r})"

    def scope(self, prefix: str = "") -> AbstractContextManager[str]:
        """``dls.scope`` bound to this plane's data root: inside the block, ``dls.run.read``
        and ``dls.run.write`` use this plane's files, written files upload before each
        submit and when the block ends, and submits record the scope.

        Raises:
            InvalidArgument: a bad prefix, or an unusable data root.
        """
        return run_scope(prefix, root=self.data_root)

    # -- functions ------------------------------------------------------------------------------

    # the body's parameters and result ride on the Udf, so a type checker checks submits
    @overload
    def udf(self, fn: Callable[P, R]) -> Udf[P, R]: ...

    @overload
    def udf(
        self,
        fn: None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        priority: int | None = None,
        retry_for: Any = None,
        no_retry_for: Any = None,
        retry_backoff_s: float | None = None,
        retry_backoff_cap_s: float | None = None,
        retry_jitter: float | None = None,
    ) -> Callable[[Callable[P, R]], Udf[P, R]]: ...

    def udf(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        priority: int | None = None,
        retry_for: Any = None,
        no_retry_for: Any = None,
        retry_backoff_s: float | None = None,
        retry_backoff_cap_s: float | None = None,
        retry_jitter: float | None = None,
    ) -> Udf[Any, Any] | Callable[[Callable[..., Any]], Udf[Any, Any]]:
        """Decorate a function so it can be submitted to ``queue`` on this plane. A lambda or
        a nested function (no importable name) is submitted only where its workers are in
        this process (``:memory:``), unless the plane allows pickling.

        The retry rule of its invocations (a submit's ``_retry_for=`` and the like override
        it; docs/retries.md): ``retry_for`` (retry only these exception types: classes or
        ``"module.QualName"`` names), ``no_retry_for`` (fail at once on these),
        ``retry_backoff_s`` (base of the exponential backoff; default the queue's, else
        the plane's), ``retry_backoff_cap_s`` (its longest wait, default 300 s, at most
        3600 s), ``retry_jitter`` (the fraction of each wait drawn off at random, 0 to 1).

        Raises:
            InvalidArgument: bad queue name or retry option.
        """
        retry = RetryOptions.given(
            "udf", retry_for, no_retry_for, retry_backoff_s, retry_backoff_cap_s, retry_jitter
        )

        def wrap(f: Callable[..., Any]) -> Udf[Any, Any]:
            u: Udf[Any, Any] = Udf(
                f,
                self,
                queue=queue,
                max_attempts=max_attempts,
                timeout_s=timeout_s,
                priority=priority,
                retry=retry,
            )
            self._plane.registry[u.ref] = u
            return u

        return wrap(fn) if fn is not None else wrap

    # -- lookups --------------------------------------------------------------------------------

    def get(self, inv: str) -> Record:
        """The invocation's record (a snapshot).

        Raises:
            InvalidArgument: ``inv`` is not an id. NotFound: no such invocation.
        """
        return self._plane.locate(inv)[1]

    def status(self, inv: str) -> str:
        """The invocation's state: queued, running, succeeded, failed, killed or timeout.

        Raises:
            InvalidArgument: ``inv`` is not an id. NotFound: no such invocation.
        """
        return str(self.get(inv).state)  # the plain text, as documented

    def result(self, inv: str, timeout: float | None = None) -> Any:
        """Wait for the invocation to finish and return its value.

        Generator bodies return the list of the values they yielded.

        Raises:
            Failed, Killed, TimedOut: the terminal state, with the remote error as text.
            NotFinished: still queued or running after ``timeout`` seconds.
            NotFound: no such invocation.
        """
        return results.result(self._plane, inv, timeout)

    def stream(
        self, inv: str, since: int = 0, timeout: float | None = None, attempt: int | None = None
    ) -> Iterator[Frame]:
        """Follow the frames a generator body yields, from ``since`` (0-based) on.

        Works while the body runs and long after it ended, from any process. Each frame has
        ``seq``, ``value`` and ``attempt``; resume after a disconnect with ``since=seq + 1``
        and ``attempt=frame.attempt`` (if a retry replaced that attempt meanwhile, reading
        restarts at the new attempt's seq 0). If an attempt fails and is retried while you
        read, the stream continues with the new attempt's frames from seq 0. Non-generator
        invocations stream no frames.

        Raises:
            Failed, Killed, TimedOut: the invocation ended that way (after its frames).
            NotFinished: ``timeout`` seconds passed while it was still queued or running.
            NotFound: no such invocation. InvalidArgument: a bad id or cursor.
        """
        return results.stream(self._plane, inv, since, timeout, attempt)

    async def astream(
        self, inv: str, since: int = 0, timeout: float | None = None, attempt: int | None = None
    ) -> AsyncIterator[Frame]:
        """:meth:`stream` for asyncio code (each poll runs in a thread)."""
        frames = await asyncio.to_thread(self.stream, inv, since, timeout, attempt)
        async for frame in aiterate(frames):
            yield frame

    def cancel(self, inv: str, reason: str = "cancelled") -> bool:
        """Cancel a queued or running invocation (→ killed). A running body is stopped by its
        worker within one heartbeat. Returns False if it had already finished.

        Raises:
            NotFound: no such invocation.
        """
        ops, rec, etag = self._plane.locate(inv)
        return ops.cancel(rec, etag, reason)

    def retry(self, inv: str) -> int:
        """Run a finished invocation (any terminal state) again, as a new attempt with the
        same id, arguments and key; returns that attempt's number. Its previous result and
        error are cleared; admission limits are not applied again.

        Raises:
            NotFound: no such invocation.
            Conflict: it is still queued or running.
        """
        ops, rec, etag = self._plane.locate(inv)
        return ops.rerun(rec, etag)

    def retry_many(
        self,
        queue: str = DEFAULT_QUEUE,
        *,
        state: str = "failed",
        fn: str | Callable[..., Any] | None = None,
        since: float | datetime | None = None,
        until: float | datetime | None = None,
        dry_run: bool = False,
    ) -> list[str]:
        """Run again every finished invocation of ``queue`` in ``state`` (default
        ``failed``), of function ``fn`` (the function, or its ``"module:qualname"``)
        if given, submitted at or after ``since`` (the id's time), that finished at or
        before ``until`` (default: now, in the store's clock). Each is rerun as
        :meth:`retry` does; returns the ids queued again (with ``dry_run``: the ids that
        would be, nothing written). Two runs at once rerun each invocation once; a second
        run with the same ``until`` does nothing (docs/retries.md#bulk-retry).

        Raises:
            InvalidArgument: a bad queue name, state or time (a datetime must be aware).
            StoreError: the store failed while listing (reruns already made stay).
        """
        check_name(queue, "queue")
        ops = self._plane.ops(queue)
        if fn is None or isinstance(fn, str):
            ref = fn
        elif isinstance(fn, Udf):
            ref = fn.ref
        elif callable(fn):
            ref = function_ref(fn)
        else:
            raise InvalidArgument(
                "retry", f"fn={fn!r} is not a function", "pass one, or its 'module:qualname'"
            )
        end = epoch_s(until, "until")
        sel = Selection(
            state, ref, epoch_s(since, "since"), self.store.now() if end is None else end
        )
        return retry_selected(ops, sel, dry_run).retried

    def logs(self, inv: str, attempt: int | None = None) -> str:
        """What the invocation's body printed and logged so far: every attempt in order (or
        only ``attempt``). Output lands in storage within about a second.

        Raises:
            NotFound: no such invocation. InvalidArgument: a bad id.
        """
        ops, rec, _ = self._plane.locate(inv)
        return "".join(text for _k, _a, text in read_logs(self.store, ops.keys, rec.id, attempt))

    def follow_logs(
        self, inv: str, attempt: int | None = None, timeout: float | None = None
    ) -> Iterator[str]:
        """Yield the invocation's output as it is written, until it finished (or ``timeout``
        seconds passed).

        Raises:
            NotFound: no such invocation. InvalidArgument: a bad id.
        """
        ops, rec, _ = self._plane.locate(inv)

        def finished() -> bool:
            return ops.read(rec.id)[0].terminal

        for _att, text in follow_logs(self.store, ops.keys, rec.id, finished, attempt, timeout):
            yield text

    def configure(self, queue: str = DEFAULT_QUEUE, **settings: Any) -> QueueConfig:
        """Change settings of ``queue`` (admission: ``max_depth``, ``on_full``, ``rate_limit``,
        ``deadline_cutoff_s``; defaults: ``timeout_s``, ``max_attempts``, ``lease_s``,
        ``retry_backoff_s``; ``provider``, ``result_retention_s``). Fields not named keep
        their value, also when others change the queue at the same time. Producers pick the
        change up within a few seconds. ``provider`` takes a kind name or a map
        (``provider={"kind": "slurm", "max_workers": 4}``), and one field of it changes with
        ``**{"provider.max_workers": 8}``; see docs/providers.md.

        Raises:
            InvalidArgument: a bad queue name, setting or value (nothing is written).
        """
        check_name(queue, "queue")
        return self._plane.settings.configure(queue, **settings)

    def queue_config(self, queue: str = DEFAULT_QUEUE) -> QueueConfig:
        """The settings of ``queue`` as stored now (defaults if it has no record yet).

        Raises:
            InvalidArgument: a bad queue name. RecordError: a corrupt queue record.
        """
        check_name(queue, "queue")
        return self._plane.settings.read(queue)[0]

    # -- schedules (docs/schedules.md) -----------------------------------------------------------

    def schedule(
        self,
        name: str,
        fn: Callable[..., Any] | str,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        overlap: str = "allow",
        start: datetime | float | None = None,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        queue: str | None = None,
        **options: Any,
    ) -> Schedule:
        """Fire ``fn(*args, **kwargs)`` at every slot of ``cron`` (in zone ``tz``) or every
        ``every`` seconds from ``start``; each slot is one keyed submit, fired by the workers
        serving the queue or by ``lakeshore schedule tick``. Setting a name again replaces
        its definition (docs/schedules.md#changing-a-schedule).

        Args:
            name: the schedule's name, unique per queue.
            fn: a ``@q.udf`` function (its queue and defaults come along) or
                ``"module:qualname"``, which workers must declare to run it.
            cron: five-field cron expression or ``@daily``-style shorthand.
            every: interval in whole seconds (at least 10), instead of ``cron``.
            tz: IANA zone the cron expression is read in.
            overlap: ``"allow"``, or ``"skip"`` a slot while the previous invocation is live.
            start: no slot before it; an interval's slots are ``start + k * every``
                (default: when the schedule was first set).
            args: the call's positional arguments (encoded now; with ``kwargs``, at most
                64 KiB).
            kwargs: the call's keyword arguments.
            queue: the queue, for a ``"module:qualname"`` (default ``"default"``).
            **options: submit options for each slot: ``priority``, ``max_attempts``,
                ``timeout_s``, ``deadline_s``, and the retry rule ``retry_for``,
                ``no_retry_for`` (exception classes or names), ``retry_backoff_s``,
                ``retry_backoff_cap_s``, ``retry_jitter`` (docs/retries.md); each over the
                function's own.

        Raises:
            InvalidArgument: a bad definition (nothing is written).
            NewerRecord: a newer lakeshore's schedule has that name (left alone).
            Conflict: the schedule kept changing under this write.
            StoreError: the store failed.
        """
        target: Declared | str
        if isinstance(fn, str | Declared):
            target = fn
        else:  # a plain function: its name and signature, declared nowhere
            target = Declared(fn, False, queue=queue or DEFAULT_QUEUE)
        sched = firing.define(
            self._plane,
            name,
            target,
            args,
            kwargs,
            cron=cron,
            every=every,
            tz=tz,
            overlap=overlap,
            start=start,
            queue=queue,
            **options,
        )
        return firing.set_schedule(self._plane, sched)

    def schedules(self, queue: str | None = None) -> list[Schedule]:
        """The schedules of ``queue`` (default: every queue of the namespace), with their
        next slot and what they fired last. One that cannot be read is left out (and
        logged); ``lakeshore schedule ls`` shows it.

        Raises:
            InvalidArgument: a bad queue name. StoreError: the store failed.
        """
        found = firing.read_schedules(self._plane, [check_name(queue, "queue")] if queue else None)
        return [s for s in found if isinstance(s, Schedule)]

    def unschedule(self, name: str, queue: str = DEFAULT_QUEUE) -> bool:
        """Remove the schedule ``name`` of ``queue``; False if there was none. Invocations it
        fired are not touched.

        Raises:
            InvalidArgument: a bad name. StoreError: the store failed.
        """
        return firing.remove(self._plane, check_name(queue, "queue"), name)

    def tick_schedules(self, queues: list[str] | None = None) -> list[firing.Fired]:
        """Fire every due slot of the schedules of ``queues`` (default: every queue of the
        namespace) once, as ``lakeshore schedule tick`` does; returns what was done with
        each schedule.

        Raises:
            StoreError: a listing failed.
        """
        return firing.tick(self._plane, queues)

    def topic(self, name: str) -> Topic:
        """The topic ``name`` of this plane's namespace (created by its first post). The
        plane keeps one handle per name, so ``q.topic(name).post(...)`` in a loop finds the
        tail once, not on every call; handles are safe to share between threads.

        Raises:
            InvalidArgument: a bad topic name.
        """
        with self._lock:
            handle = self._topics.get(name)
            if handle is None:
                handle = self._topics[name] = Topic(self.store, self.ns, name)
            return handle

    # -- asyncio mirrors ------------------------------------------------------------------------

    # the asyncio spellings: each runs the blocking verb in a thread
    aresult = offload(result, here=True)
    aget = offload(get, here=True)
    astatus = offload(status, here=True)
    acancel = offload(cancel, here=True)


_default: Dispatch | None = None
_default_lock = threading.Lock()


def default_plane() -> Dispatch:
    """The plane ``@dls.udf`` binds to: ``Dispatch()`` ($LAKESHORE_URL or the embedded
    default store), created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Dispatch()
        return _default


def scope(prefix: str = "") -> AbstractContextManager[str]:
    """``dls.scope``: resolve data keys under ``prefix`` inside the block, on the data root
    of the enclosing block, else of the default plane (see :func:`lakeshore.run.scope`).

    Raises:
        InvalidArgument: ``prefix`` is absolute, a URL, or climbs out of the data root.
    """
    return run_scope(prefix, default_root=lambda: default_plane().data_root)


@overload
def udf(fn: Callable[P, R]) -> Udf[P, R]: ...


@overload
def udf(
    fn: None = None,
    *,
    queue: str = "default",
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    priority: int | None = None,
    retry_for: Any = None,
    no_retry_for: Any = None,
    retry_backoff_s: float | None = None,
    retry_backoff_cap_s: float | None = None,
    retry_jitter: float | None = None,
) -> Callable[[Callable[P, R]], Udf[P, R]]: ...


def udf(
    fn: Callable[..., Any] | None = None,
    *,
    queue: str = "default",
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    priority: int | None = None,
    retry_for: Any = None,
    no_retry_for: Any = None,
    retry_backoff_s: float | None = None,
    retry_backoff_cap_s: float | None = None,
    retry_jitter: float | None = None,
) -> Any:
    """``@dls.udf``: like ``@q.udf`` (the same options, the retry rule's included) but
    bound to the default plane (``Dispatch()``), which is created on the first submit.

    Raises:
        InvalidArgument: bad queue name or retry option.
    """
    retry = RetryOptions.given(
        "udf", retry_for, no_retry_for, retry_backoff_s, retry_backoff_cap_s, retry_jitter
    )

    def wrap(f: Callable[..., Any]) -> Udf[Any, Any]:
        return Udf(
            f,
            None,
            queue=queue,
            max_attempts=max_attempts,
            timeout_s=timeout_s,
            priority=priority,
            default=default_plane,
            retry=retry,
        )

    return wrap(fn) if fn is not None else wrap
