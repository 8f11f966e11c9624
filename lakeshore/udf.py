"""``@udf``: one decorator for four body kinds, and how functions travel by reference.

The body kind — ``sync``, ``generator``, ``async``, ``asyncgen`` — is detected once, at
decoration, with :mod:`inspect`. A decorated function still runs locally when called; its
``.submit(...)`` enqueues it and returns the invocation id.

Functions travel as ``"module:qualname"``. A worker resolves that reference in its plane's
registry first (every function decorated with ``@q.udf`` is registered on ``q``), then by
importing the module. Pickled callables are used only when both sides opt in
(``Dispatch(allow_pickle=True)`` on the submitter and on the worker).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from lakeshore.errors import InvalidArgument, LakeshoreError
from lakeshore.run import call_local

if TYPE_CHECKING:
    from lakeshore.dispatch import Dispatch

__all__ = ["BodyKind", "Udf", "UnknownFunction", "body_kind", "function_ref", "resolve", "udf"]

P = ParamSpec("P")
R = TypeVar("R")
BodyKind = str  # "sync" | "generator" | "async" | "asyncgen"


class UnknownFunction(LakeshoreError):
    """A worker cannot find the function an invocation names."""


def body_kind(fn: Callable[..., Any]) -> BodyKind:
    """Which of the four body kinds ``fn`` is."""
    if inspect.isasyncgenfunction(fn):
        return "asyncgen"
    if inspect.iscoroutinefunction(fn):
        return "async"
    if inspect.isgeneratorfunction(fn):
        return "generator"
    return "sync"


def function_ref(fn: Callable[..., Any]) -> str:
    """``"module:qualname"`` of a function.

    Raises:
        InvalidArgument: the function has no stable name a worker could import (a lambda or a
            function defined inside another function).
    """
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if module == "__main__":
        # `python -m pkg.mod` knows its real name: use it, so other processes can import it.
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name if spec is not None and spec.name else module
    if not module or not qualname or "<" in qualname:
        raise InvalidArgument(
            "udf",
            f"{fn!r} has no importable name (lambdas and nested functions have none)",
            "define the function at module level so workers can import it by name",
        )
    return f"{module}:{qualname}"


class Udf(Generic[P, R]):
    """A function made submittable. Call it to run locally; ``.submit`` to enqueue it."""

    def __init__(
        self,
        fn: Callable[P, R],
        plane: Dispatch | None,
        *,
        queue: str = "default",
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        priority: int | None = None,
    ) -> None:
        from lakeshore.keys import check_name

        self.fn = fn
        self.kind = body_kind(fn)
        self._pickle: bytes | None = None
        try:
            self.ref = function_ref(fn)
            self._by_pickle = False
        except InvalidArgument:
            if plane is None or not plane.allow_pickle:
                raise
            # Opted in: the callable travels pickled; the ref only names it in logs.
            self.ref = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"
            self._by_pickle = True
        self.queue = check_name(queue, "queue")
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.priority = priority
        self._plane = plane
        functools.update_wrapper(self, fn)

    @functools.cached_property
    def signature(self) -> inspect.Signature | None:
        """The function's signature (None for callables without one, e.g. some builtins);
        read once, since every submit binds its call to it."""
        try:
            return inspect.signature(self.fn)
        except ValueError:
            return None

    def pickled(self) -> bytes | None:
        """The pickled callable when this function travels by pickle, else None.

        Raises:
            InvalidArgument: cloudpickle is not installed.
        """
        if not self._by_pickle:
            return None
        if self._pickle is None:
            try:
                import cloudpickle
            except ImportError:
                raise InvalidArgument(
                    f"submit {self.ref}",
                    "pickling a callable needs cloudpickle",
                    "pip install 'lakeshore-queue[pickle]'",
                ) from None
            self._pickle = cloudpickle.dumps(self.fn)
        return self._pickle

    @property
    def plane(self) -> Dispatch:
        if self._plane is None:
            from lakeshore.dispatch import default_plane

            self._plane = default_plane()
            self._plane.registry.setdefault(self.ref, self)
        return self._plane

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the body here, now, with the same files contract as on a worker (keys it
        writes upload to the plane's data root once returned or yielded)."""
        root = lambda: self.plane.data_root  # noqa: E731 - resolved only if files are used
        return call_local(self.fn, self.kind, args, kwargs, root)  # type: ignore[no-any-return]

    def submit(self, *args: Any, **kwargs: Any) -> str:
        """Enqueue a call; return its invocation id (a ULID string).

        Options ride as underscore keywords so they never clash with the function's own:
        ``_key`` (idempotency key, unique per namespace + queue), ``_priority`` (0-9, higher
        first), ``_max_attempts``, ``_timeout_s``, ``_deadline_s`` (seconds from now after
        which a still-queued invocation never starts), ``_strict_key`` (raise if ``_key`` was
        used before with different arguments), ``_submit_timeout`` (how long a submit to a
        full queue with ``on_full="block"`` waits for room; default 60 s).

        Raises:
            InvalidArgument: an argument cannot be sent, or an option is malformed.
            KeyReused: ``_strict_key=True`` and ``_key`` names different arguments.
            QueueFull: the queue's admission refused the submit.
            StoreError: the store failed.
        """
        opts = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("_")}
        return self.plane.submit_call(self, args, kwargs, **{k[1:]: v for k, v in opts.items()})

    def __repr__(self) -> str:
        return f"<udf {self.ref} ({self.kind}) on queue {self.queue!r}>"


def resolve(ref: str, registry: dict[str, Udf[Any, Any]]) -> Udf[Any, Any] | Callable[..., Any]:
    """Find the function ``ref`` names: the plane's registry, then an import.

    Raises:
        UnknownFunction: the module cannot be imported or has no such attribute.
    """
    if ref in registry:
        return registry[ref]
    module_name, _, qualname = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception as e:
        where = (
            "it lives in a script's __main__: decorate it on this plane, or move it to a module"
            if module_name in ("__main__", "__mp_main__")
            else "install the module where the worker runs, or check the name"
        )
        raise UnknownFunction(
            f"resolve {ref}", f"cannot load the function ({type(e).__name__}: {e})", where, ref=ref
        ) from None
    if not callable(obj):
        raise UnknownFunction(f"resolve {ref}", "the name is not callable", "check the name")
    return obj  # type: ignore[no-any-return]


def udf(
    fn: Callable[..., Any] | None = None,
    *,
    queue: str = "default",
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    priority: int | None = None,
) -> Any:
    """``@dls.udf``: like ``@q.udf`` but bound to the default plane (``Dispatch()``), which
    is created on the first submit.

    Raises:
        InvalidArgument: bad queue name, or a function workers could not import.
    """

    def wrap(f: Callable[..., Any]) -> Udf[Any, Any]:
        return Udf(
            f, None, queue=queue, max_attempts=max_attempts, timeout_s=timeout_s, priority=priority
        )

    return wrap(fn) if fn is not None else wrap
