"""Scopes: where the data keys of a body resolve. Pure key logic, no I/O.

A scope is a relative POSIX prefix under the data root. ``with dls.scope("scenes/0007"):``
pushes it; scopes nest (prefixes join), ``..`` may climb to a parent scope, and nothing may
climb out of the data root. ``submit`` records the scope in effect in the invocation's
``prefix`` field and the worker re-installs it around the body, so a key names the same
object on the producer and on the worker.

The functions here turn keys into *full keys* (relative to the data root, normalised) and
find the keys inside a returned or yielded value. The I/O lives in :mod:`lakeshore.run`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lakeshore.errors import InvalidArgument

__all__ = ["at", "current_prefix", "join", "keys_in", "mirror", "prefixed", "resolve"]

_PREFIX: contextvars.ContextVar[str] = contextvars.ContextVar("lakeshore_scope", default="")
_MAX_KEY = 900  # the data root's own prefix needs room under S3's 1024-byte key limit


def _parts(path: str, op: str) -> list[str]:
    if not isinstance(path, str):
        raise InvalidArgument(op, f"a key must be a str, got {type(path).__name__}", "pass a str")
    if path.startswith("/") or "://" in path or path.startswith("~"):
        raise InvalidArgument(
            op,
            f"{path!r} is not a relative key",
            "keys are relative POSIX paths under the data root, e.g. 'out/mask.png'",
        )
    if "\\" in path or "?" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise InvalidArgument(
            op,
            f"{path!r} holds a backslash, a '?' or a control character",
            "use '/' between parts and printable characters only ('?' would be read as a "
            "query by URL-based drivers)",
        )
    return [p for p in path.split("/") if p not in ("", ".")]


def join(prefix: str, path: str, op: str = "scope") -> str:
    """``path`` resolved under ``prefix`` (both relative): ``..`` climbs, ``.`` and empty
    parts vanish. The result may be ``""`` (the data root itself).

    Raises:
        InvalidArgument: ``path`` is absolute, a URL, malformed, or climbs out of the root.
    """
    out = _parts(prefix, op)
    for part in _parts(path, op):
        if part != "..":
            out.append(part)
        elif out:
            out.pop()
        else:
            where = f" (in scope {prefix!r})" if prefix else ""
            raise InvalidArgument(
                op,
                f"{path!r}{where} climbs out of the data root",
                "'..' may leave a scope but never the data root; use a shorter path",
            )
    full = "/".join(out)
    if len(full.encode()) > _MAX_KEY:
        raise InvalidArgument(op, f"key too long ({len(full.encode())} bytes)", "shorten it")
    return full


def resolve(key: str, op: str = "key") -> str:
    """The full key (relative to the data root) ``key`` names in the current scope.

    Raises:
        InvalidArgument: a malformed key, one that escapes the root, or one that names a
            folder (empty, or ending in ``.`` or ``..``) instead of an object.
    """
    full = join(_PREFIX.get(), key, op)
    last = key.rstrip("/").rpartition("/")[2] if isinstance(key, str) else ""
    if not full or last in ("", ".", "..") or key.endswith("/"):
        raise InvalidArgument(
            op, f"{key!r} names a folder, not an object", "end the key with a file name"
        )
    return full


def current_prefix() -> str:
    """The scope in effect here (``""`` at the data root)."""
    return _PREFIX.get()


@contextmanager
def prefixed(prefix: str = "") -> Iterator[str]:
    """Push ``prefix`` onto the current scope for the block (the prefix half of
    ``dls.scope``; see :func:`lakeshore.run.scope`).

    Raises:
        InvalidArgument: ``prefix`` is absolute, a URL, or climbs out of the data root.
    """
    token = _PREFIX.set(join(_PREFIX.get(), prefix, f"scope {prefix!r}"))
    try:
        yield _PREFIX.get()
    finally:
        _PREFIX.reset(token)


@contextmanager
def at(prefix: str) -> Iterator[str]:
    """Set the scope to the full ``prefix`` (a worker re-installing a recorded scope)."""
    token = _PREFIX.set(join("", prefix, "scope"))
    try:
        yield _PREFIX.get()
    finally:
        _PREFIX.reset(token)


def mirror(keys: Any, fn: Callable[[str], str], op: str) -> Any:
    """Apply ``fn`` to every key of a str, or of a list, tuple or dict of them (nested),
    keeping the shape: ``{"a": "x.png"}`` becomes ``{"a": "/local/x.png"}``.

    Raises:
        InvalidArgument: something in ``keys`` is not a key or a container of keys.
    """
    if isinstance(keys, str):
        return fn(keys)
    if isinstance(keys, list | tuple):
        return type(keys)(mirror(k, fn, op) for k in keys)
    if isinstance(keys, dict):
        return {name: mirror(k, fn, op) for name, k in keys.items()}
    raise InvalidArgument(
        op,
        f"expected a key or a list, tuple or dict of keys, got {type(keys).__name__}",
        "pass str keys",
    )


def keys_in(value: Any, prefix: str) -> set[str]:
    """Full keys named by the strings inside a returned or yielded value (dict values and
    list/tuple items, nested). Strings that are not valid keys are simply not keys."""
    found: set[str] = set()
    seen: set[int] = set()  # a value that contains itself must not loop forever
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list | tuple | set | frozenset | dict):
            if id(v) in seen:
                continue
            seen.add(id(v))
        if isinstance(v, str):
            try:
                full = join(prefix, v)
            except InvalidArgument:
                continue
            if full:
                found.add(full)
        elif isinstance(v, list | tuple | set | frozenset):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return found
