"""Bodies: the four body kinds, how functions travel by reference, and which of them a
worker agrees to run.

The body kind — ``sync``, ``generator``, ``async``, ``asyncgen`` — is detected once, at
decoration, with :mod:`inspect`. A :class:`Declared` function is one decorated on a plane
(``lakeshore.udf.Udf`` is the public one, with ``submit`` and ``map``).

Functions travel as ``"module:qualname"``. A record is written by whoever may write to the
bucket, so a worker treats that name as untrusted (:func:`load_body`): it runs only bodies
it *declared* — decorated on its plane (``@q.udf`` registers on ``q``), decorated
(``@q.udf`` / ``@dls.udf``) in a module it has already imported, or admitted by its
operator's allow-list (:class:`Allow`, the only way it imports a module a record names).
It never imports, looks up through properties, or calls anything else a record names.
Pickled callables are used only when both sides opt in (``Dispatch(allow_pickle=True)`` on
the submitter and on the worker): a worker that accepts them trusts every submitter.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import secrets
import sys
import types
from collections.abc import Callable, Iterable
from enum import StrEnum
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from lakeshore.errors import InvalidArgument, UnknownFunction
from lakeshore.keys import check_name
from lakeshore.running.failure import RetryOptions

__all__ = [
    "Allow",
    "BodyKind",
    "Declared",
    "body_kind",
    "function_ref",
    "import_failure",
    "import_ref",
    "load_body",
]


class BodyKind(StrEnum):
    """Which of the four kinds of Python function a body is: how it is called, and whether
    it streams (a generator's values are its journal)."""

    SYNC = "sync"
    GENERATOR = "generator"
    ASYNC = "async"
    ASYNCGEN = "asyncgen"

    @property
    def streams(self) -> bool:
        return self in (BodyKind.GENERATOR, BodyKind.ASYNCGEN)


def body_kind(fn: Callable[..., Any]) -> BodyKind:
    """Which of the four body kinds ``fn`` is."""
    if inspect.isasyncgenfunction(fn):
        return BodyKind.ASYNCGEN
    if inspect.iscoroutinefunction(fn):
        return BodyKind.ASYNC
    if inspect.isgeneratorfunction(fn):
        return BodyKind.GENERATOR
    return BodyKind.SYNC


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


class Declared:
    """A function declared as a body: its kind, the name it travels by, and the defaults
    its submits take (queue, attempts, timeout, priority, the retry rule).

    A function without an importable name (a lambda, a function defined inside another)
    travels pickled when ``allow_pickle``; otherwise it is ``local_only``: its name is made
    unique to this declaration, and only a worker of the same plane in the same process
    finds it, in the plane's registry. Submitting it to a plane whose workers could be other
    processes is refused (:meth:`check_reachable`).

    Raises:
        InvalidArgument: bad queue name.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        allow_pickle: bool,
        *,
        queue: str = "default",
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        priority: int | None = None,
        retry: RetryOptions | None = None,
    ) -> None:
        self.fn = fn
        self.kind = body_kind(fn)
        self._pickle: bytes | None = None
        self.local_only = False
        try:
            self.ref = function_ref(fn)
            self._by_pickle = False
        except InvalidArgument:
            named = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"
            # Opted in: the callable travels pickled; the ref only names it in logs.
            self._by_pickle = allow_pickle
            # Else the name is this declaration's own: two closures of one qualname (a loop,
            # a test run twice) must never be taken for each other in a registry.
            self.local_only = not allow_pickle
            # (random, not id(): ids of freed objects come back)
            self.ref = named if allow_pickle else f"{named}#{secrets.token_hex(8)}"
        self.queue = check_name(queue, "queue")
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.priority = priority
        self.retry = retry or RetryOptions()

    @functools.cached_property
    def signature(self) -> inspect.Signature | None:
        """The function's signature (None for callables without one, e.g. some builtins);
        read once, since every submit binds its call to it."""
        try:
            return inspect.signature(self.fn)
        except ValueError:
            return None

    def check_reachable(self, in_process: bool) -> None:
        """Refuse to submit a local-only function where a worker could be another process:
        it would find no function by that name, and fail.

        Raises:
            InvalidArgument: local-only, and the plane's store is reachable from elsewhere.
        """
        if self.local_only and not in_process:
            raise InvalidArgument(
                f"submit {self.ref.partition('#')[0]}",
                f"{self.fn!r} has no importable name (a lambda, or a function defined inside "
                "another), and this plane's workers may be other processes, which could not "
                "find it",
                "define it at module level; or, if every submitter and worker is trusted, "
                "declare it with @q.udf on a Dispatch(..., allow_pickle=True), on both sides, "
                "with pip install 'lakeshore-queue[pickle]'",
            )

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


# -- which functions a worker may run ----------------------------------------------------------

_MAX_REF = 512  # longer than any real module:qualname; a hostile record's name is cut short
_DEFINED_HERE = "the function must be defined in the module its name gives"


def _shown(ref: str) -> str:
    return repr(ref) if len(ref) <= 120 else repr(ref[:120]) + "…"


def _todo(ref: str) -> str:
    module = ref.partition(":")[0]
    return (
        "decorate it with @q.udf or @dls.udf at module level and import that module on the "
        f"worker (lakeshore worker --import {module}), or have the worker's operator allow it "
        f"(lakeshore worker --allow '{ref}', or run_worker(allow=['{ref}']))"
    )


def _malformed(ref: str) -> str | None:
    """Why ``ref`` is not a ``module:qualname`` a worker would look up, or None."""
    if len(ref) > _MAX_REF:
        return f"longer than {_MAX_REF} characters"
    module, colon, qualname = ref.partition(":")
    if not colon or not module or not qualname or ":" in qualname:
        return "not module:qualname"
    for part in module.split("."):
        if not part.isidentifier():
            return f"{part!r} is not an identifier"
        # a script's own module is the one dunder a name may start with
        if part.startswith("__") and module not in ("__main__", "__mp_main__"):
            return f"{part!r} is a dunder name"
    for part in qualname.split("."):
        if not part.isidentifier():
            return f"{part!r} is not an identifier"
        if part.startswith("__"):  # __globals__, __builtins__, __call__, name-mangled privates
            return f"{part!r} is a dunder name"
    return None


class Allow:
    """The worker operator's allow-list: ``fnmatch`` patterns over ``"module:qualname"``
    (``"mypkg.jobs:*"``, ``"mypkg.tasks:train"``). The module part and the qualname part
    are matched each on its own, so ``*`` in a qualname never reaches another module.

    Raises:
        InvalidArgument: a pattern is not ``module:qualname`` (each side non-empty, one
            colon, no dunder parts).
    """

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        if isinstance(patterns, str):
            patterns = [patterns]  # one pattern, not one per character
        checked = []
        for pat in patterns:
            module, colon, qualname = pat.partition(":") if isinstance(pat, str) else ("", "", "")
            if (
                not colon
                or not module
                or not qualname
                or ":" in qualname
                or any(p.startswith("__") for p in f"{module}.{qualname}".split("."))
            ):
                raise InvalidArgument(
                    "worker --allow",
                    f"{pat!r} is not a pattern over module:qualname",
                    "give e.g. 'mypkg.jobs:*' or 'mypkg.tasks:train' (fnmatch-style)",
                )
            checked.append((module, qualname))
        self.patterns = tuple(checked)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __repr__(self) -> str:
        return f"Allow({[f'{m}:{q}' for m, q in self.patterns]!r})"

    def admits(self, ref: str) -> bool:
        module, _, qualname = ref.partition(":")
        return any(fnmatchcase(module, m) and fnmatchcase(qualname, q) for m, q in self.patterns)


def _lookup(owner: Any, name: str) -> Any:
    """``owner.name`` read from the instance and class dictionaries only: no property,
    no ``__getattr__`` (a lazy module's imports a record could trigger), nothing called.

    Raises:
        AttributeError: there is no such attribute.
    """
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                found = vars(klass)[name]
                if isinstance(found, (staticmethod, classmethod)):
                    return found.__get__(None, owner)
                return found
        raise AttributeError(name)
    namespace = vars(owner)
    if name not in namespace:
        raise AttributeError(name)
    return namespace[name]


def _walk(module: types.ModuleType, qualname: str) -> Any:
    """The object at ``qualname`` in ``module``, through classes only.

    Raises:
        AttributeError: there is no such attribute.
        TypeError: the path goes through something other than a class (another module, an
            instance): a body is named where it is defined.
    """
    obj: Any = module
    for i, part in enumerate(qualname.split(".")):
        if i and not isinstance(obj, type):
            what = "a module" if isinstance(obj, types.ModuleType) else "not a class"
            raise TypeError(f"{qualname.split('.')[i - 1]!r} in it is {what}, not a class")
        obj = _lookup(obj, part)
    return obj


def _loaded(module_name: str) -> types.ModuleType | None:
    """The module if this process has imported it (a script run as ``python -m pkg.mod``
    is imported as ``__main__``)."""
    module = sys.modules.get(module_name)
    if module is None:
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if main is not None and spec is not None and spec.name == module_name:
            module = main
    return module


def load_body(
    ref: str, registry: dict[str, Declared], allow: Allow | None = None
) -> Declared | Callable[..., Any]:
    """The body a record names, if this worker declared it; never imports or calls
    anything the record names otherwise.

    Declared are: (a) a function decorated on the worker's plane (in ``registry``); (b) a
    :class:`Declared` function (``@q.udf`` / ``@dls.udf``) at ``qualname`` in a module
    this process has already imported; (c) what ``allow`` admits — the only way a module
    not yet imported is imported, and a plain function runs (it must be defined there).

    Raises:
        UnknownFunction: the name is malformed or not declared (nothing was imported or
            called), or an allowed module cannot be imported.
    """
    if ref in registry:
        return registry[ref]

    def refuse(why: str, todo: str | None = None) -> UnknownFunction:
        return UnknownFunction(
            f"load {_shown(ref)}",
            f"{_shown(ref)} is not a declared body on this worker: {why}; nothing was "
            "imported or called",
            todo or _todo(ref),
            ref=ref[:_MAX_REF],
        )

    if "#" in ref and "<" in ref:  # the name of a local-only declaration (see Declared)
        raise refuse(
            "it has no importable name, and only the plane that declared it, in its own "
            "process, can run it",
            "run the worker on that plane in that process, or define the function at module level",
        )
    bad = _malformed(ref)
    if bad is not None:
        raise refuse(
            f"the name is malformed ({bad})",
            "submit a module-level function through @q.udf; a worker runs only declared bodies",
        )
    module_name, _, qualname = ref.partition(":")
    allowed = allow is not None and allow.admits(ref)
    module = _loaded(module_name)
    if module is None:
        if not allowed:
            raise refuse(
                f"its module {module_name} is not imported on this worker and no --allow "
                "pattern admits it"
            )
        module = _import(module_name, ref)
    elif module_name in sys.modules:
        # Present, but maybe half made: another slot (or a body) may be importing it right
        # now. import_module imports nothing new for a module in sys.modules; it waits for
        # an import under way to finish, so its functions are not judged missing. (Only if
        # that import fails does it try once more: a module this process chose to import.)
        module = _import(module_name, ref)
    try:
        obj = _walk(module, qualname)
    except (AttributeError, TypeError) as e:
        why = str(e) if isinstance(e, TypeError) else f"{module_name} has no {qualname!r}"
        raise refuse(
            why,
            "name a function by the module that defines it (module:function, as @udf does), "
            "and run workers on the same code as the submitters",
        ) from None
    if isinstance(obj, Declared):
        return obj
    if not allowed:
        raise refuse(
            "it is not decorated with @udf, not registered on this worker's plane and "
            "not allowed by the worker's operator"
        )
    if not callable(obj):
        raise refuse("the name is not callable", "check the name")
    defined_in = getattr(obj, "__module__", None)
    if defined_in != module.__name__:
        raise refuse(
            f"it is defined in {defined_in}, not in {module_name}",
            f"{_DEFINED_HERE}: submit it under the module that defines it",
        )
    return obj  # type: ignore[no-any-return]


def _import(module_name: str, ref: str) -> types.ModuleType:
    try:
        return importlib.import_module(module_name)
    except Exception as e:
        if module_name in ("__main__", "__mp_main__"):
            happened = f"{type(e).__name__}: {e}"
            todo = (
                "it lives in a script's __main__: decorate it on this plane, or move it to a module"
            )
        else:
            happened, todo = import_failure(
                module_name, e, "install the module where the worker runs, or check the name"
            )
        raise UnknownFunction(
            f"load {_shown(ref)}",
            f"cannot load the function: {happened}",
            todo,
            ref=ref[:_MAX_REF],
        ) from None


def import_failure(
    module_name: str,
    e: Exception,
    missing_todo: str,
    failed_todo: str = "fix the module (or install what it imports)",
) -> tuple[str, str]:
    """What happened and what to do, when importing ``module_name`` raised ``e``.

    A module that is not there is told apart from one that is there and raised while it was
    imported (its own bug, a syntax error, a module *it* imports that is missing): no install
    or path fixes the second, and a hint that says so sends people looking in the wrong place.
    ``missing_todo`` is the hint for a module that is not there, unless ``./<module>.py`` (or a
    package folder) is in the current directory: then the fix is ``PYTHONPATH=.``, since the
    ``lakeshore`` console script does not look there.
    """
    missing = e.name if isinstance(e, ModuleNotFoundError) else None
    if not missing or (missing != module_name and not module_name.startswith(missing + ".")):
        return f"{module_name!r} failed while importing ({type(e).__name__}: {e})", failed_todo
    top = module_name.partition(".")[0]
    here = _beside(top) if missing == top else None
    if here is not None:
        return (
            f"no module {top!r} on the import path, though {here} is in the current directory",
            "run the command as PYTHONPATH=. lakeshore … (the lakeshore command does not "
            "look in the current directory), or install the module",
        )
    return f"{module_name!r} is not importable here ({type(e).__name__}: {e})", missing_todo


def _beside(top: str) -> str | None:
    """``./top.py`` or ``./top/``, if the current directory holds that module, else None."""
    if not top.isidentifier():
        return None  # a relative or odd name: no file to look for
    if Path(f"{top}.py").is_file():
        return f"./{top}.py"
    if Path(top, "__init__.py").is_file():
        return f"./{top}/"
    return None


def import_ref(ref: str) -> Declared | Callable[..., Any]:
    """Import the function ``ref`` names, on the caller's own authority: a hook the worker's
    operator names, a function a user submits from the command line, or a body the worker
    process already approved with :func:`load_body` (a child process re-imports it). Never
    for a name read from a record.

    Raises:
        UnknownFunction: the name is malformed, the module cannot be imported, or it has no
            such callable.
    """
    bad = _malformed(ref)
    if bad is not None:
        raise UnknownFunction(
            f"load {_shown(ref)}",
            f"cannot load the function: the name is malformed ({bad})",
            "name a module-level function as module:function, e.g. mypkg.jobs:resize",
            ref=ref[:_MAX_REF],
        )
    module_name, _, qualname = ref.partition(":")
    module = _import(module_name, ref)
    try:
        obj = _walk(module, qualname)
    except (AttributeError, TypeError) as e:
        raise UnknownFunction(
            f"load {_shown(ref)}",
            f"cannot load the function ({type(e).__name__}: {e})",
            "install the module where the worker runs, or check the name",
            ref=ref,
        ) from None
    if not callable(obj):
        raise UnknownFunction(f"load {ref}", "the name is not callable", "check the name", ref=ref)
    return obj  # type: ignore[no-any-return]
