"""Upstream's ``udf``, ``UDF``, ``thunk`` and ``Thunk``, over lakeshore's declared functions.

A bare ``@dls.udf`` runs where it is called (lakeshore's files contract included). With a
queue, ``@dls.udf(queue="gpu")`` is upstream's remote-by-default function: a plain call
submits and waits for a worker's result (30 s, as upstream). Submits go to the plane of
``_dispatch=`` or the default one, where the function is declared on first use.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import weakref
from typing import Any

import lakeshore
from dreamlake.lakeshore.config import RunConfig
from dreamlake.lakeshore.dispatch import default_dispatch, translated
from dreamlake.lakeshore.transport import TransportError
from lakeshore.errors import InvalidArgument, JobError, NotFinished, NotFound
from lakeshore.running.bodies import function_ref

__all__ = ["UDF", "Thunk", "remote_attempts", "thunk", "udf"]

_TRANSPORTS = ("auto", "ref", "pickle")
_RESULT_TIMEOUT_S = 30.0  # upstream's remote() and plain-call wait
# upstream retries a failed function once (run_worker(retries=1)): two attempts
remote_attempts = 2


class Thunk:
    """A call kept for later: ``fn(*args, **kwargs)``, submitted with ``q.submit(thunk)``."""

    def __init__(self, fn: Any, /, *args: Any, **kwargs: Any) -> None:
        self.fn = fn.fn if isinstance(fn, UDF) else fn
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"<thunk {getattr(self.fn, '__qualname__', repr(self.fn))!r}>"


def thunk(fn: Any, /, *args: Any, **kwargs: Any) -> Thunk:
    """``fn(*args, **kwargs)`` as a value a queue can take. A function without an importable
    name travels pickled, only on planes made with ``allow_pickle=True`` (both sides)."""
    return Thunk(fn, *args, **kwargs)


class UDF:
    """A decorated function: local when bare, remote by default with a ``queue``."""

    def __init__(
        self,
        fn: Any,
        *,
        queue: str | None = None,
        transport: str = "auto",
        config: Any | None = None,
    ) -> None:
        if transport not in _TRANSPORTS:
            raise TransportError(f"unknown transport {transport!r}; use auto|ref|pickle")
        self.fn = fn
        self.queue = queue
        self.transport = transport
        # a run declaration, kept: placement is upstream's control plane's
        self.config = RunConfig(**config) if isinstance(config, dict) else config
        self.is_async = inspect.iscoroutinefunction(fn)
        self.is_gen = inspect.isgeneratorfunction(fn)
        self.is_asyncgen = inspect.isasyncgenfunction(fn)
        self._local = lakeshore.Udf(fn, None, default=default_dispatch)
        self._declared: weakref.WeakKeyDictionary[lakeshore.Dispatch, lakeshore.Udf[Any, Any]]
        self._declared = weakref.WeakKeyDictionary()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Bare: run here. With a queue: :meth:`remote`."""
        if self.queue is not None:
            return self.remote(*args, **kwargs)
        return self._local(*args, **kwargs)

    def local(self, *args: Any, **kwargs: Any) -> Any:
        """Run here, even with a queue."""
        return self._local(*args, **kwargs)

    def submit(
        self,
        *args: Any,
        _dispatch: lakeshore.Dispatch | None = None,
        _key: str | None = None,
        _priority: float = 0.0,
        _config: Any | None = None,
        **kwargs: Any,
    ) -> str:
        """Enqueue a call on this function's queue; its id.

        Raises:
            TypeError: the function has no queue.
        """
        from dreamlake.lakeshore.queues import priority_of

        if self.queue is None:
            raise TypeError(
                f"{self.__name__} has no queue binding; decorate with @udf(queue=...) "
                "or pass one at submit time"
            )
        declared = self._on(_dispatch if _dispatch is not None else default_dispatch())
        return declared.submit(
            *args,
            _key=_key,
            _priority=priority_of(_priority),
            _max_attempts=remote_attempts,
            **kwargs,
        )

    def remote(self, *args: Any, _dispatch: lakeshore.Dispatch | None = None, **kwargs: Any) -> Any:
        """Submit and wait for the result (30 s). Async bodies give an awaitable.

        Raises:
            DispatchError: the call failed or was cancelled. TimeoutError: no result in time.
        """
        plane = _dispatch if _dispatch is not None else default_dispatch()
        kwargs.pop("_config", None)
        if self.is_async or self.is_asyncgen:
            return asyncio.to_thread(self._wait, plane, args, kwargs)
        return self._wait(plane, args, kwargs)

    def _wait(self, plane: lakeshore.Dispatch, args: Any, kwargs: dict[str, Any]) -> Any:
        inv = self.submit(*args, _dispatch=plane, **kwargs)
        try:
            return plane.result(inv, timeout=_RESULT_TIMEOUT_S)
        except (JobError, NotFinished, NotFound, InvalidArgument) as e:
            raise translated("result", inv, e, _RESULT_TIMEOUT_S) from None

    def _on(self, plane: lakeshore.Dispatch) -> lakeshore.Udf[Any, Any]:
        found = self._declared.get(plane)
        if found is None:
            if self.transport == "ref":
                try:
                    function_ref(self.fn)
                except InvalidArgument as e:
                    raise TransportError(f"transport='ref': {e.what}") from None
            elif self.transport == "pickle" and not plane.plane.allow_pickle:
                raise TransportError(
                    "transport='pickle' needs a plane made with allow_pickle=True, on the "
                    "submitting and the working side"
                )
            assert self.queue is not None
            found = self._declared[plane] = plane.udf(self.fn, queue=self.queue)
        return found

    def __repr__(self) -> str:
        kind = (
            "async-gen"
            if self.is_asyncgen
            else "gen"
            if self.is_gen
            else "async"
            if self.is_async
            else "sync"
        )
        where = f"queue={self.queue!r}" if self.queue else "local"
        return f"<udf {self.__qualname__} [{kind}, {where}]>"


def udf(
    fn: Any | None = None,
    *,
    queue: str | None = None,
    transport: str = "auto",
    config: Any | None = None,
) -> Any:
    """``@udf`` (local) or ``@udf(queue=..., transport=..., config=...)`` (remote by
    default). ``config`` is accepted and has no effect here (placement is upstream's)."""

    def decorate(f: Any) -> UDF:
        return UDF(f, queue=queue, transport=transport, config=config)

    return decorate(fn) if fn is not None else decorate
