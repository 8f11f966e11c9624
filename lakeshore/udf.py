"""``Udf``: a function declared on a plane. Called, it runs here under the files contract
of a worker; ``.submit(...)`` enqueues one call and returns its id, ``.map`` and
``.starmap`` enqueue many. What a worker agrees to run is :mod:`lakeshore.running.bodies`'s.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import Any, Generic, ParamSpec, TypeVar, overload

from lakeshore import results
from lakeshore.asubmit import amap_calls, asubmit_call
from lakeshore.batch import map_calls, starmap_calls, submit_many
from lakeshore.errors import InvalidArgument
from lakeshore.files.context import flush
from lakeshore.plane import HasPlane, Plane, plane_of
from lakeshore.running.bodies import Declared
from lakeshore.running.call import call_local
from lakeshore.running.failure import RetryOptions
from lakeshore.submit import OPTIONS, check_options, prepare_call, publish_prepared, submit_call
from lakeshore.udf_options import WithOptions, given_options

__all__ = ["Udf"]

P = ParamSpec("P")
R = TypeVar("R", covariant=True)  # a Udf of a generator is a Udf of an iterator
T = TypeVar("T")


class Udf(Declared, Generic[P, R]):
    """A function made submittable. Call it to run locally; ``.submit`` to enqueue it."""

    def __init__(
        self,
        fn: Callable[P, R],
        plane: Plane | HasPlane | None,
        *,
        queue: str = "default",
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        priority: int | None = None,
        default: Callable[[], Plane | HasPlane] | None = None,
        retry: RetryOptions | None = None,
    ) -> None:
        super().__init__(
            fn,
            plane is not None and plane_of(plane).allow_pickle,
            queue=queue,
            max_attempts=max_attempts,
            timeout_s=timeout_s,
            priority=priority,
            retry=retry,
        )
        self._plane = plane
        self._default = default  # the plane to bind to on first use, when ``plane`` is None
        functools.update_wrapper(self, fn)

    @property
    def plane(self) -> Plane | HasPlane:
        """The plane this function is submitted to, as it was given: the ``Dispatch`` of
        ``@q.udf``, or the default plane (``dls.default_plane()``) of ``@dls.udf``.

        Raises:
            InvalidArgument: it was declared without a plane and no default is set.
        """
        if self._plane is None:
            if self._default is None:
                raise InvalidArgument(
                    f"udf {self.ref}", "declared without a plane", "decorate it with @q.udf"
                )
            self._plane = self._default()
            plane_of(self._plane).registry.setdefault(self.ref, self)
        return self._plane

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the body here, now, with the same files contract as on a worker (keys it
        writes upload to the plane's data root once returned or yielded)."""
        root = lambda: plane_of(self.plane).data_root  # noqa: E731 - resolved only if files are used
        return call_local(self.fn, self.kind, args, kwargs, root)  # type: ignore[no-any-return]

    def local(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the body here, now: the same as calling the function."""
        return self(*args, **kwargs)

    def options(
        self,
        *,
        key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
        strict_key: bool | None = None,
        submit_timeout: float | None = None,
        delay_s: float | None = None,
        not_before: datetime.datetime | None = None,
        after: Iterable[str] | None = None,
        after_failure: str | None = None,
        retry_for: Any = None,
        no_retry_for: Any = None,
        retry_backoff_s: float | None = None,
        retry_backoff_cap_s: float | None = None,
        retry_jitter: float | None = None,
        result_timeout: float | None = None,
    ) -> WithOptions[P, R]:
        """This function with submit options bound, as typed keywords:
        ``f.options(priority=9, delay_s=5).submit(x=1)`` is ``f.submit(x=1, _priority=9,
        _delay_s=5)``, with the arguments checked against the body's signature by a type
        checker. The options are :meth:`submit`'s without the underscore (None: not given),
        and ``result_timeout`` for :meth:`remote`. Values are checked when the call is sent.
        """
        return WithOptions(
            self,
            given_options(
                key=key,
                priority=priority,
                max_attempts=max_attempts,
                timeout_s=timeout_s,
                deadline_s=deadline_s,
                strict_key=strict_key,
                submit_timeout=submit_timeout,
                delay_s=delay_s,
                not_before=not_before,
                after=after,
                after_failure=after_failure,
                retry_for=retry_for,
                no_retry_for=no_retry_for,
                retry_backoff_s=retry_backoff_s,
                retry_backoff_cap_s=retry_backoff_cap_s,
                retry_jitter=retry_jitter,
                result_timeout=result_timeout,
            ),
        )

    # remote gives what the worker made of the body: an async body's value, a streaming
    # body's list of yields; the body's own result type otherwise
    @overload
    def remote(self: Udf[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T: ...

    @overload
    def remote(self: Udf[P, Iterator[T]], *args: P.args, **kwargs: P.kwargs) -> list[T]: ...

    @overload
    def remote(self: Udf[P, AsyncIterator[T]], *args: P.args, **kwargs: P.kwargs) -> list[T]: ...

    @overload
    def remote(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Submit a call and wait for its result: ``f.remote(x)`` is
        ``q.result(f.submit(x))`` (an async body's value; a streaming body's yields, as a
        list). Takes :meth:`submit`'s options, plus ``_result_timeout`` (seconds to wait;
        default: for good); typed: ``f.options(result_timeout=30).remote(x)``. A worker must
        be running.

        Raises:
            as :meth:`submit`; and Failed, Killed, TimedOut: the invocation ended that way;
            NotFinished: no result within ``_result_timeout`` (the invocation stays queued).
        """
        timeout = kwargs.pop("_result_timeout", None)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
        ):
            raise InvalidArgument(
                f"remote {self.ref}", f"_result_timeout={timeout!r}", "pass seconds >= 0, or None"
            )
        inv = self.submit(*args, **kwargs)
        return results.result(plane_of(self.plane), inv, timeout)

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Enqueue a call; return its invocation id (a ULID string). A type checker checks
        the arguments against the body's signature; the options below are then spelled
        ``f.options(priority=9).submit(...)`` (:meth:`options`), as the underscore keywords
        are not parameters of the body.

        Options ride as underscore keywords so they never clash with the function's own:
        ``_key`` (idempotency key, unique per namespace + queue), ``_priority`` (0-9, higher
        first), ``_max_attempts``, ``_timeout_s``, ``_deadline_s`` (seconds from now after
        which a still-queued invocation never starts), ``_strict_key`` (raise if ``_key`` was
        used before with different arguments), ``_submit_timeout`` (how long a submit to a
        full queue with ``on_full="block"`` waits for room; default 60 s); the retry rule
        of this call, over the function's (docs/retries.md): ``_retry_for`` and
        ``_no_retry_for`` (exception classes or names), ``_retry_backoff_s``,
        ``_retry_backoff_cap_s``, ``_retry_jitter``; ``_after`` (ids of parents: the call
        runs only once each succeeded) and ``_after_failure`` (``"kill"``, the default: a
        parent that ends otherwise kills it; ``"run"``: it runs once every parent ended,
        however; see docs/dependencies.md); ``_delay_s`` (seconds) or ``_not_before`` (an
        aware datetime): no worker starts it before then, by the store's clock.

        Raises:
            InvalidArgument: an argument cannot be sent, or an option is malformed.
            KeyReused: ``_strict_key=True`` and ``_key`` names different arguments.
            QueueFull: the queue's admission refused the submit.
            StoreError: the store failed.
        """
        opts = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("_")}
        return submit_call(
            plane_of(self.plane), self, args, kwargs, **{k[1:]: v for k, v in opts.items()}
        )

    async def asubmit(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """:meth:`submit`, awaited, for producers in an event loop: the same options,
        writes and errors. On S3 through obstore its writes use obstore's async client (no
        thread per call); elsewhere, and for a keyed submit or a limited queue, they run in
        a thread. See docs/queue.md#async-producers.

        Raises:
            as :meth:`submit`.
        """
        opts = {k[1:]: kwargs.pop(k) for k in list(kwargs) if k.startswith("_")}
        return await asubmit_call(plane_of(self.plane), self, args, kwargs, **opts)

    async def amap(
        self,
        *iterables: Iterable[Any],
        kwargs: dict[str, Any] | None = None,
        concurrency: int | None = None,
        **options: Any,
    ) -> list[str]:
        """:meth:`map`, awaited: every call is checked before anything is written, then up
        to ``concurrency`` (default as :meth:`map`'s) are written at once in this event loop.
        The same options (``_keys`` too), result and errors as :meth:`map`.

        Raises:
            InvalidArgument, KeyReused, MapFailed: as :meth:`map`.
        """
        calls = map_calls(iterables, kwargs, f"map {self.ref}")
        opts = self._map_options(options)
        keys = opts.pop("keys", None)
        return await amap_calls(
            plane_of(self.plane), self, calls, keys=keys, concurrency=concurrency, **opts
        )

    def fan_in(self, parents: Iterable[str], *args: Any, **kwargs: Any) -> str:
        """Submit a call that runs once every parent succeeded, and gets them first: the
        list of the parents' ids, or with ``_results=True`` the list of their results (in
        the order of ``parents``, read by the worker when the call starts). So
        ``reduce.fan_in(square.map(xs))`` runs ``reduce([<id>, ...])`` after every square.
        Takes :meth:`submit`'s options (``_after_failure="run"`` runs it however the
        parents ended; a parent that did not succeed is then handed as None); the parents
        are ``parents``, so ``_after`` is not one. See docs/dependencies.md.

        Raises:
            as :meth:`submit`; InvalidArgument also for a bad ``parents`` or ``_results``.
        """
        opts = {k[1:]: kwargs.pop(k) for k in list(kwargs) if k.startswith("_")}
        op = f"fan_in {self.ref}"
        if parents is None:
            raise InvalidArgument(op, "no parents were given", "pass the parents' ids first")
        results = opts.pop("results", False)
        if not isinstance(results, bool):
            raise InvalidArgument(op, f"_results={results!r:.40}", "pass True or False")
        check_options(opts, op, OPTIONS - {"after"}, " and _results (the parents come first)")
        plane = plane_of(self.plane)
        prep = prepare_call(
            plane,
            self,
            args,
            kwargs,
            after=parents,
            after_pass="results" if results else "ids",
            **opts,
        )
        flush()  # the producer's files first, as a submit does
        return publish_prepared(prep)

    def map(
        self,
        *iterables: Iterable[Any],
        kwargs: dict[str, Any] | None = None,
        concurrency: int | None = None,
        progress: bool = False,
        **options: Any,
    ) -> list[str]:
        """Submit one call per item, like the built-in ``map``: the i-th call takes the i-th
        item of each iterable as its positional arguments (``f.map(xs, ys)`` submits
        ``f(xs[0], ys[0])``, ``f(xs[1], ys[1])``, …), plus the keywords in ``kwargs``.
        Returns the ids in input order.

        Submit options are those of :meth:`submit`, applied to every call (``_priority``,
        ``_max_attempts``, ``_timeout_s``, ``_deadline_s``, ``_strict_key``,
        ``_submit_timeout``), except that keys come one per call: ``_keys`` is an iterable
        of keys (None for no key) or a function of a call's arguments that returns its key.
        ``concurrency`` is how many threads write (default: 32 on S3, 4 on a local
        directory, 1 in memory); ``progress=True`` keeps a line on stderr up to date.

        Every call is checked before anything is written, so a bad call raises and nothing
        is submitted. Every call is then attempted, also after another one failed.

        Raises:
            InvalidArgument: an iterable, call, key or option is bad (nothing was written).
            KeyReused: ``_strict_key=True`` and two calls share a key but not their
                arguments (nothing was written).
            MapFailed: some calls were not submitted; ``.ids`` has the others' ids in input
                order (None where not submitted), ``.errors`` each failure by index.
        """
        calls = map_calls(iterables, kwargs, f"map {self.ref}")
        return self._submit_many(calls, concurrency, progress, options)

    def starmap(
        self,
        items: Iterable[tuple[Any, ...] | list[Any]],
        *,
        kwargs: dict[str, Any] | None = None,
        concurrency: int | None = None,
        progress: bool = False,
        **options: Any,
    ) -> list[str]:
        """:meth:`map` for calls given as tuples, like ``itertools.starmap``:
        ``f.starmap([(1, 2), (3, 4)])`` submits ``f(1, 2)`` and ``f(3, 4)``. Same options,
        result and errors as :meth:`map`.

        Raises:
            InvalidArgument, KeyReused, MapFailed: as :meth:`map`.
        """
        calls = starmap_calls(items, kwargs, f"starmap {self.ref}")
        return self._submit_many(calls, concurrency, progress, options)

    def _submit_many(
        self,
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
        concurrency: int | None,
        progress: bool,
        options: dict[str, Any],
    ) -> list[str]:
        opts = self._map_options(options)
        keys = opts.pop("keys", None)
        return submit_many(
            plane_of(self.plane),
            self,
            calls,
            keys=keys,
            concurrency=concurrency,
            progress=progress,
            **opts,
        )

    def _map_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """A batch's options without their underscore.

        Raises:
            InvalidArgument: a keyword that is not an option.
        """
        plain = sorted(k for k in options if not k.startswith("_"))
        if plain:
            raise InvalidArgument(
                f"map {self.ref}",
                f"unexpected keyword(s) {', '.join(plain)}",
                "arguments come from the iterables, keywords every call shares go in "
                "kwargs={...}, submit options start with '_' (nothing was submitted)",
            )
        return {k[1:]: v for k, v in options.items()}

    def __repr__(self) -> str:
        return f"<udf {self.ref} ({self.kind}) on queue {self.queue!r}>"
