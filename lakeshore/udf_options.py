"""``f.options(...)``: a submit's options spelled as typed keywords, beside the function's
own arguments, which stay checked against the body's signature.

Why a view and not keywords of ``submit``: ``Udf.submit`` takes exactly the body's
parameters (``*args: P.args, **kwargs: P.kwargs``), so a type checker refuses
``f.submit(x=1, y="a")`` for a body ``f(x: int, y: int)``. PEP 612 allows no keyword-only
parameter beside a ``ParamSpec``, so the options cannot be typed keywords of that same call.
``f.options(priority=9, delay_s=5)`` returns a small frozen :class:`WithOptions` whose
``submit``/``remote``/``map`` (and ``asubmit``/``amap``) take the body's arguments and send
them with those options. The underscore spelling (``f.submit(x, _priority=9)``) still works
at run time; a type checker accepts it only where the body takes ``**kwargs``.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast, overload

from lakeshore.errors import InvalidArgument

__all__ = ["Sendable", "WithOptions", "given_options"]

P = ParamSpec("P")
R = TypeVar("R", covariant=True)  # a view of a generator's Udf is a view of an iterator's
R_co = TypeVar("R_co", covariant=True)
T = TypeVar("T")


class Sendable(Protocol[P, R_co]):
    """What a view sends through: :class:`lakeshore.udf.Udf` (named by its verbs, so this
    module need not import it)."""

    @property
    def ref(self) -> str: ...

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> str: ...

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    async def asubmit(self, *args: P.args, **kwargs: P.kwargs) -> str: ...

    def map(
        self,
        *iterables: Iterable[Any],
        kwargs: dict[str, Any] | None = None,
        concurrency: int | None = None,
        progress: bool = False,
        **options: Any,
    ) -> list[str]: ...

    async def amap(
        self,
        *iterables: Iterable[Any],
        kwargs: dict[str, Any] | None = None,
        concurrency: int | None = None,
        **options: Any,
    ) -> list[str]: ...


def given_options(**options: Any) -> dict[str, Any]:
    """The options that were given (not None), spelled with the underscore ``submit`` reads."""
    return {f"_{k}": v for k, v in options.items() if v is not None}


@dataclasses.dataclass(frozen=True)
class WithOptions(Generic[P, R]):
    """A function with submit options bound: ``f.options(priority=9).submit(x=1)``. Made by
    :meth:`lakeshore.udf.Udf.options`; immutable, so one view may be kept and shared."""

    udf: Sendable[P, R]
    given: dict[str, Any]  # underscore-spelled options, as Udf.submit takes them

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
        """These options over the ones already bound (see :meth:`Udf.options`)."""
        more = given_options(
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
        )
        return WithOptions(self.udf, {**self.given, **more})

    def _submit_options(self, verb: str) -> dict[str, Any]:
        # result_timeout is remote's alone: a submit would refuse it as an unknown option
        return {k: v for k, v in self.given.items() if k != "_result_timeout" or verb == "remote"}

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """:meth:`Udf.submit` with the bound options.

        Raises:
            as :meth:`Udf.submit`.
        """
        return cast(str, self._call(self.udf.submit, "submit", args, kwargs))

    @overload
    def remote(
        self: WithOptions[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    @overload
    def remote(self: WithOptions[P, Iterator[T]], *args: P.args, **kwargs: P.kwargs) -> list[T]: ...

    @overload
    def remote(
        self: WithOptions[P, AsyncIterator[T]], *args: P.args, **kwargs: P.kwargs
    ) -> list[T]: ...

    @overload
    def remote(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`Udf.remote` with the bound options (``result_timeout`` included).

        Raises:
            as :meth:`Udf.remote`.
        """
        return self._call(self.udf.remote, "remote", args, kwargs)

    async def asubmit(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """:meth:`Udf.asubmit` with the bound options.

        Raises:
            as :meth:`Udf.submit`.
        """
        opts = self._submit_options("submit")
        return await self.udf.asubmit(*args, **{**_own(kwargs, "asubmit"), **opts})

    def map(
        self,
        *iterables: Iterable[Any],
        kwargs: dict[str, Any] | None = None,
        keys: Iterable[str | None] | Callable[..., str | None] | None = None,
        concurrency: int | None = None,
        progress: bool = False,
    ) -> list[str]:
        """:meth:`Udf.map` with the bound options (``keys``: one key per call, as ``_keys``).

        Raises:
            as :meth:`Udf.map`.
        """
        opts = self._map_options(keys)
        return self.udf.map(
            *iterables, kwargs=kwargs, concurrency=concurrency, progress=progress, **opts
        )

    async def amap(
        self,
        *iterables: Iterable[Any],
        kwargs: dict[str, Any] | None = None,
        keys: Iterable[str | None] | Callable[..., str | None] | None = None,
        concurrency: int | None = None,
    ) -> list[str]:
        """:meth:`Udf.amap` with the bound options.

        Raises:
            as :meth:`Udf.map`.
        """
        opts = self._map_options(keys)
        return await self.udf.amap(*iterables, kwargs=kwargs, concurrency=concurrency, **opts)

    def _map_options(self, keys: Any) -> dict[str, Any]:
        """The bound options for a batch, in the underscore spelling.

        Raises:
            InvalidArgument: a key is bound (it would be every call's).
        """
        opts = self._submit_options("map")
        if "_key" in opts:
            raise InvalidArgument(
                "options(...).map",
                "options(key=...) would give every call of the batch the same key, so all of "
                "them would be one invocation",
                "pass one key per call: .map(..., keys=[...]) or keys=lambda *args: ... "
                "(nothing was submitted)",
            )
        if keys is not None:
            opts["_keys"] = keys
        return opts

    def _call(self, verb: Callable[..., Any], name: str, args: Any, kwargs: Any) -> Any:
        return verb(*args, **{**_own(kwargs, name), **self._submit_options(name)})

    def __repr__(self) -> str:
        shown = ", ".join(f"{k[1:]}={v!r}" for k, v in self.given.items())
        return f"<udf {self.udf.ref} with options({shown})>"


def _own(kwargs: dict[str, Any], verb: str) -> dict[str, Any]:
    """The function's own keywords; an underscore option beside bound ones is refused, so
    one call never mixes the two spellings (which would win?).

    Raises:
        InvalidArgument: a keyword starting with ``_``.
    """
    mixed = sorted(k for k in kwargs if k.startswith("_"))
    if mixed:
        raise InvalidArgument(
            f"options(...).{verb}",
            f"underscore option(s) {', '.join(mixed)} beside options(...)",
            "pass every option to options(...) (without the underscore)",
        )
    return kwargs
